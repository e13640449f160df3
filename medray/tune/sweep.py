"""Hyperparameter sweeps: Ray Tune over the same Ray Train run as `medray train`.

Ray 2.60 pattern (Train V2): each Tune trial runs a *driver function* that builds the
TorchTrainer of `medray train` (medray.train.trainer) with a `TuneReportCallback`, so every
`ray.train.report` of the workers reaches Tune (ASHA, the searcher, the loggers).
`Tuner(TorchTrainer(...))` is not supported in 2.60.

Layout of a sweep directory DIR:
    sweep_spec.json         what the sweep runs (base config, space, search): --resume reads it
    sweep/                  the Tune experiment (state, searcher, one dir per trial)
      trial_<id>/           Tune's result.json/progress.csv + TensorBoard events of the trial,
        train/              the `medray train` output of the trial: tensorboard/, adapter/,
                            metrics.json (finished trials), ray/ (Train checkpoints)
        medray_trial.jsonl  start/end events of the driver (a restart shows as a 2nd start)
    asha_rungs.json         ASHA's rungs (Tune does not save the scheduler; resume reads
                            them). Not inside sweep/: Tune's sync of its staging copy
                            would overwrite it with the version it restored from
    trials.csv  best.yaml  val_f1_vs_hparams.png   (written by medray.tune.outputs)
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from medray.config import ConfigError
from medray.tune.plan import (
    ASHA_STATE,
    EXPERIMENT,
    SPEC_FILE,
    SweepPlan,
    max_concurrency,
    per_trial_resources,
    trial_config,
)
from medray.tune.tracked import environment_kept, finish_sweep_tracking, start_sweep_tracking

# ------------------------------------------------------------------ Tune snapshot


def snapshot_statuses(experiment_dir: Path) -> dict[str, str]:
    """Trial id -> status in Tune's latest experiment snapshot (what a resume starts from)."""
    states = sorted(Path(experiment_dir).glob("experiment_state-*.json"))
    if not states:
        return {}
    try:
        data = json.loads(states[-1].read_text())
    except (OSError, json.JSONDecodeError):  # being rewritten right now
        return {}
    out = {}
    for trial_json, _meta in data.get("trial_data", []):
        trial = json.loads(trial_json)
        out[trial["trial_id"]] = trial["status"]
    return out


# ------------------------------------------------------------------ Tune configuration


def make_scheduler(plan: SweepPlan) -> Any:
    from medray.tune.scheduler import FinalEpochASHA

    sched = plan.space.scheduler
    if sched.type == "none":
        return None
    epochs = plan.space.params.get("optim.epochs")
    max_epochs = max(epochs.candidates()) if epochs else plan.base["optim"]["epochs"]
    return FinalEpochASHA(time_attr=sched.time_attr, max_t=max(int(max_epochs), 1),
                          grace_period=sched.grace_period,
                          reduction_factor=sched.reduction_factor,
                          final_epochs=int(plan.base["optim"]["epochs"]),
                          state_file=plan.output / ASHA_STATE)


def make_search_alg(plan: SweepPlan, max_concurrent: int = 0) -> Any:
    """Tune wraps a Searcher (Optuna) in a ConcurrencyLimiter itself, but ignores
    `max_concurrent_trials` for a BasicVariantGenerator instance: set it here."""
    if plan.search == "optuna":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        # TPE (Bayesian); the seed makes the proposals reproducible.
        return OptunaSearch(metric=plan.metric, mode=plan.mode,
                            sampler=optuna.samplers.TPESampler(seed=plan.space.seed))
    from ray.tune.search.basic_variant import BasicVariantGenerator

    # grid: every combination (x num_samples); random: num_samples draws, seeded.
    return BasicVariantGenerator(max_concurrent=max_concurrent, random_state=plan.space.seed)


def trial_dirname(trial: Any) -> str:
    return f"trial_{trial.trial_id}"


def _trainable(plan: SweepPlan) -> Any:
    from medray.tune.trial import make_trainable

    return make_trainable(plan.base, plan.space.driver_cpus)


def _write_spec(plan: SweepPlan) -> None:
    from medray.io import write_text_atomic

    write_text_atomic(plan.output / SPEC_FILE, json.dumps(plan.to_json(), indent=2))


def extreme_configs(plan: SweepPlan) -> list[tuple[str, dict]]:
    """(label, complete training config): the base and each param at its extreme values
    (low/high, or every choice), the others at their base values."""
    configs = [("base config", trial_config(plan.base, {}))]
    for key, param in plan.space.params.items():
        values = param.candidates()
        if param.type != "choice":
            values = [min(values), max(values)]
        for value in dict.fromkeys(map(repr, values)):
            real = next(v for v in values if repr(v) == value)
            configs.append((f"{key}={value}", trial_config(plan.base, {key: real})))
    return configs


def preflight_sweep(plan: SweepPlan, log: Any = print) -> None:
    """`medray train`'s preflight (model, LoRA targets, data, token budgets) on the base
    config and the space's extremes, before any trial starts: a sweep that cannot train
    fails in seconds with the training error, not once per trial."""
    from medray.train.config import TrainConfig
    from medray.train.trainer import preflight

    seen: set[str] = set()
    for label, raw in extreme_configs(plan):
        cfg = TrainConfig.model_validate(raw)
        # Only these sections reach the preflight: skip configs that differ elsewhere (lr).
        key = json.dumps({k: raw.get(k) for k in ("model", "lora", "data", "prompt")},
                         sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        try:
            preflight(cfg)
        except (ConfigError, FileNotFoundError, ValueError, OSError) as exc:
            raise ConfigError(f"sweep preflight ({label}): {exc}") from None
    log(f"preflight ok: base config and {len(seen) - 1} distinct extreme config(s) of the space")


def run_sweep(plan: SweepPlan, *, resume: bool = False, log: Any = print,
              best_if_partial: bool = False, callbacks: list | None = None,
              preflight: bool = True) -> Any:
    """Run (or resume) the sweep and write the outputs; returns medray.tune.outputs.Summary.
    Ray is joined by the caller (medray.cluster.connect with plan.local_cpus).
    `callbacks`: extra Tune callbacks on the driver (the console's trial progress);
    `preflight=False`: the caller ran preflight_sweep already (before joining Ray)."""
    from ray import tune

    from medray.cluster import check_shared_storage, require_connected
    from medray.tune.outputs import write_outputs

    if preflight:
        preflight_sweep(plan, log)
    require_connected("the sweep")
    # Trial workers on other nodes write their checkpoints and run folders under the sweep's
    # folder, and the driver reads them back: it must be storage every node sees.
    check_shared_storage(plan.output, "sweep output")
    exp = plan.experiment_dir
    if resume and not tune.Tuner.can_restore(str(exp.resolve())):
        raise FileNotFoundError(f"{exp}: no Tune experiment to resume")
    if not resume and exp.exists() and any(exp.iterdir()):
        raise FileExistsError(f"{exp} already holds a sweep; pass --resume to continue it "
                              "or choose another --output")
    concurrency = max_concurrency(plan)
    need = per_trial_resources(plan)
    log(f"sweep: search {plan.search}, metric {plan.metric} ({plan.mode}), "
        f"{plan.num_samples} sample(s)"
        + (f" x {plan.space.grid_size()} grid points" if plan.search == "grid" else "")
        + f"; per trial {need['CPU']:g} CPU / {need['GPU']:g} GPU (driver + "
        f"{plan.base['scaling']['num_workers']} Train worker(s)); "
        f"max {concurrency} concurrent trial(s)")
    if resume:
        statuses = snapshot_statuses(exp)
        kept = sum(v in ("TERMINATED", "ERROR") for v in statuses.values())
        log(f"resuming {exp}: {kept} finished trial(s) kept as they are, "
            f"{len(statuses) - kept} unfinished trial(s) resume (Train resumes each from its "
            "last checkpoint), the searcher proposes the rest")
        tuner = tune.Tuner.restore(str(exp.resolve()), trainable=_trainable(plan),
                                   resume_unfinished=True, resume_errored=True,
                                   restart_errored=False)
        tracker = None  # a resumed sweep opens no second parent run
    else:
        _write_spec(plan)
        tracker, tracking_callbacks = start_sweep_tracking(plan)
        callbacks = [*(callbacks or []), *tracking_callbacks]
        (plan.output / ASHA_STATE).unlink(missing_ok=True)  # rungs of an earlier sweep
        tuner = tune.Tuner(
            _trainable(plan),
            param_space=plan.space.tune_param_space(plan.search),
            tune_config=tune.TuneConfig(
                metric=plan.metric, mode=plan.mode, num_samples=plan.num_samples,
                search_alg=make_search_alg(plan, concurrency), scheduler=make_scheduler(plan),
                max_concurrent_trials=concurrency, trial_dirname_creator=trial_dirname),
            run_config=tune.RunConfig(name=EXPERIMENT, storage_path=str(plan.output.resolve()),
                                      failure_config=tune.FailureConfig(max_failures=0),
                                      callbacks=callbacks or None),
        )
    with tracker or nullcontext():  # the parent run ends FAILED when the sweep raises
        with environment_kept():
            results = tuner.fit()
        # Ctrl-C: Tune stops gracefully and returns; its snapshot still says which trials
        # were cut off (RUNNING / PENDING), which tells "interrupted" from an ASHA stop.
        summary = write_outputs(plan, results, log=log, statuses=snapshot_statuses(exp),
                                best_if_partial=best_if_partial)
        if tracker is not None:
            finish_sweep_tracking(tracker, plan, summary, log)
    return summary
