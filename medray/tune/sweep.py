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

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medray.tune.space import (
    Space,
    SpaceError,
    apply_params,
    as_overrides,
    check_key,
    check_keys,
    load_space,
    validate_space,
)

SPEC_FILE = "sweep_spec.json"
EXPERIMENT = "sweep"
EVENTS_FILE = "medray_trial.jsonl"
TRAIN_SUBDIR = "train"
ASHA_STATE = "asha_rungs.json"  # medray.tune.scheduler: ASHA's rungs, read back on resume
# Metrics the training loop reports at each epoch end (medray.train.loop).
REPORTED_METRICS = ("val_loss", "val_f1", "val_em", "train_loss")


@dataclass
class SweepPlan:
    """Everything a sweep needs, validated; JSON-serialisable (saved as DIR/sweep_spec.json)."""

    output: Path
    base: dict  # complete training config (dumped by the model): fixed + overrides applied
    space: Space
    search: str
    num_samples: int
    metric: str
    mode: str
    max_concurrent_trials: int | None
    sources: dict = field(default_factory=dict)  # config/space paths, CLI overrides

    @property
    def experiment_dir(self) -> Path:
        return self.output / EXPERIMENT

    def to_json(self) -> dict:
        return {"base": self.base, "space": self.space.model_dump(mode="json"),
                "search": self.search, "num_samples": self.num_samples, "metric": self.metric,
                "mode": self.mode, "max_concurrent_trials": self.max_concurrent_trials,
                "sources": self.sources}

    @classmethod
    def from_json(cls, output: Path, data: dict) -> SweepPlan:
        return cls(output=output, base=data["base"], space=Space.model_validate(data["space"]),
                   search=data["search"], num_samples=data["num_samples"],
                   metric=data["metric"], mode=data["mode"],
                   max_concurrent_trials=data["max_concurrent_trials"],
                   sources=data.get("sources", {}))


def _absolute_paths(raw: dict) -> dict:
    """Trials run with another working directory (Tune/Train chdir): pin local paths."""
    raw = copy.deepcopy(raw)
    data_path = Path(raw["data"]["path"])
    raw["data"]["path"] = str(data_path.resolve())
    model_path = Path(raw["model"]["name_or_path"])
    if model_path.exists():  # a hub id stays as it is
        raw["model"]["name_or_path"] = str(model_path.resolve())
    return raw


def plan_sweep(config: str | os.PathLike, space_path: str | os.PathLike,
               output: str | os.PathLike, overrides: list[str] | None = None, *,
               search: str | None = None, num_samples: int | None = None,
               metric: str | None = None, mode: str | None = None,
               max_concurrent_trials: int | None = None) -> SweepPlan:
    """Load and check config + space before anything starts (raises ConfigError/SpaceError)."""
    from medray.train.config import (
        ConfigError,
        TrainConfig,
        load_config,
        parse_override,
        validate_config,
    )

    overrides = list(overrides or [])
    space = load_space(space_path)
    src = str(space_path)
    swept = sorted(set(space.params) & {".".join(parse_override(o)[0]) for o in overrides})
    if swept:
        raise SpaceError(f"{src}: {swept} are searched by the space and also overridden on "
                         "the command line; remove one of them")
    search = search or space.search
    if search not in ("grid", "random", "optuna"):
        raise SpaceError(f"--search {search!r}: choose grid, random or optuna")
    metric, mode = metric or space.metric, mode or space.mode
    if metric not in REPORTED_METRICS:
        raise SpaceError(f"{src}: metric {metric!r} is not reported by training "
                         f"(choose one of {', '.join(REPORTED_METRICS)})")
    if mode not in ("min", "max"):
        raise SpaceError(f"--mode {mode!r}: choose min or max")
    check_keys(space, src)
    for item in overrides:
        key = ".".join(parse_override(item)[0])
        try:
            check_key(TrainConfig, key)
        except KeyError as exc:
            raise ConfigError(f"override {item!r}: {exc.args[0]}") from None
    # Order: config file < space `fixed` < command-line overrides < the trial's sample.
    fixed = as_overrides(space.fixed)
    try:
        cfg = load_config(config, fixed + overrides)
    except ConfigError as exc:
        if not fixed:
            raise
        raise ConfigError(f"{exc}\n(config file, then the `fixed` values of {src}, then the "
                          "command-line overrides)") from None
    base = _absolute_paths(cfg.model_dump(mode="json"))
    # Each trial keeps its best checkpoint by the sweep metric, and mid-epoch reports
    # then carry it too (the searcher needs the metric in every report).
    base["checkpoint"]["metric"], base["checkpoint"]["mode"] = metric, mode
    validate_config(base, "sweep base config")
    validate_space(space.model_copy(update={"fixed": {}}), base, source=src, search=search)
    if metric in ("val_f1", "val_em") and base["data"]["val_generate_examples"] == 0:
        raise SpaceError(f"{src}: metric {metric} needs data.val_generate_examples > 0 "
                         "(greedy answers scored each epoch)")
    return SweepPlan(output=Path(output), base=base, space=space, search=search,
                     num_samples=num_samples or space.num_samples, metric=metric, mode=mode,
                     max_concurrent_trials=max_concurrent_trials or space.max_concurrent_trials,
                     sources={"config": str(config), "space": src, "overrides": overrides})


def load_plan(output: str | os.PathLike) -> SweepPlan:
    output = Path(output)
    spec = output / SPEC_FILE
    if not spec.is_file():
        raise FileNotFoundError(f"{output}: no {SPEC_FILE}; nothing to resume (start the "
                                "sweep with --config and --space first)")
    return SweepPlan.from_json(output, json.loads(spec.read_text()))


def trial_config(base: dict, sample: dict) -> dict:
    """The complete training config of one trial (validated by the training model)."""
    from medray.train.config import validate_config

    sample = {k: v for k, v in sample.items() if not k.startswith("_")}
    return validate_config(apply_params(base, sample), "trial config").model_dump(mode="json")


# -------------------------------------------------------------------------- the trial


def read_events(trial_dir: Path) -> list[dict]:
    """start/end/skip events the driver function wrote (medray.tune.trial)."""
    path = Path(trial_dir) / EVENTS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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


def per_trial_resources(plan: SweepPlan) -> dict[str, float]:
    sc = plan.base["scaling"]
    return {"CPU": plan.space.driver_cpus + sc["num_workers"] * sc["cpus_per_worker"],
            "GPU": float(sc["num_workers"]) if sc["use_gpu"] else 0.0}


def trial_count(plan: SweepPlan) -> int:
    """Trials the sweep runs in all (a grid runs every point num_samples times)."""
    return plan.num_samples * (plan.space.grid_size() if plan.search == "grid" else 1)


def max_concurrency(plan: SweepPlan) -> int:
    """The configured maximum (space file or --max-concurrent-trials), else every trial.

    Never a snapshot of the cluster's resources: an autoscaling cluster at zero GPU
    workers would then run one trial at a time. Trials that do not fit yet wait in
    Tune's queue, and their pending resource requests are what makes the autoscaler add
    nodes.
    """
    return plan.max_concurrent_trials or trial_count(plan)


def trial_dirname(trial: Any) -> str:
    return f"trial_{trial.trial_id}"


def _trainable(plan: SweepPlan) -> Any:
    from medray.tune.trial import make_trainable

    return make_trainable(plan.base, plan.space.driver_cpus)


def _write_spec(plan: SweepPlan) -> None:
    from medray.fsutil import write_text_atomic

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
    from medray.train.config import ConfigError, TrainConfig
    from medray.train.trainer import preflight

    seen: set[str] = set()
    for label, raw in extreme_configs(plan):
        cfg = TrainConfig.model_validate(raw)
        # Only these sections reach the preflight: skip configs that differ elsewhere (lr).
        key = json.dumps({k: raw[k] for k in ("model", "lora", "data")}, sort_keys=True,
                         default=str)
        if key in seen:
            continue
        seen.add(key)
        try:
            preflight(cfg)
        except (ConfigError, FileNotFoundError, ValueError, OSError) as exc:
            raise ConfigError(f"sweep preflight ({label}): {exc}") from None
    log(f"preflight ok: base config and {len(seen) - 1} distinct extreme config(s) of the space")


def run_sweep(plan: SweepPlan, *, resume: bool = False, log: Any = print,
              best_if_partial: bool = False, callbacks: list | None = None) -> Any:
    """Run (or resume) the sweep and write the outputs; returns medray.tune.outputs.Summary.
    `callbacks`: extra Tune callbacks on the driver (the console's trial progress)."""
    from ray import tune

    from medray.raycluster import connect
    from medray.tune.outputs import write_outputs

    preflight_sweep(plan, log)
    exp = plan.experiment_dir
    if resume and not tune.Tuner.can_restore(str(exp.resolve())):
        raise FileNotFoundError(f"{exp}: no Tune experiment to resume")
    if not resume and exp.exists() and any(exp.iterdir()):
        raise FileExistsError(f"{exp} already holds a sweep; pass --resume to continue it "
                              "or choose another --output")
    # RAY_ADDRESS set (ray job submit, a cluster): join it; otherwise a local cluster with
    # room for every concurrent trial's driver and Train workers plus Ray Data's tasks.
    connect(min_cpus=per_trial_resources(plan)["CPU"] * (plan.max_concurrent_trials or 1) + 2)
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
    else:
        _write_spec(plan)
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
    results = tuner.fit()
    # Ctrl-C: Tune stops gracefully and returns; its snapshot still says which trials were
    # cut off (RUNNING / PENDING), which is what tells "interrupted" from an ASHA stop.
    return write_outputs(plan, results, log=log, statuses=snapshot_statuses(exp),
                         best_if_partial=best_if_partial)
