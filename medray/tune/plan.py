"""A sweep's plan: what it runs (base config, space, search), checked before Ray starts,
and the names of the files a sweep directory holds (layout in medray.tune.sweep).

Shared by the sweep (medray.tune.sweep), its trials (medray.tune.trial) and its outputs
(medray.tune.outputs), none of which import one another.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from medray.config import ConfigError, parse_override
from medray.tune.space import (
    Space,
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
# Metrics the training loop reports at each epoch end (medray.train.loop): generative runs
# report F1/EM, multiple-choice runs accuracy (all-correct rule) and the conforming share.
REPORTED_METRICS = ("val_loss", "val_f1", "val_em", "val_accuracy", "val_conforming",
                    "train_loss")
GENERATED_METRICS = ("val_f1", "val_em", "val_accuracy", "val_conforming")


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
    """Load and check config + space before anything starts (raises ConfigError)."""
    from medray.train.config import TrainConfig, load_config, validate_config

    overrides = list(overrides or [])
    space = load_space(space_path)
    src = str(space_path)
    swept = sorted(set(space.params) & {".".join(parse_override(o)[0]) for o in overrides})
    if swept:
        raise ConfigError(f"{src}: {swept} are searched by the space and also overridden on "
                         "the command line; remove one of them")
    search = search or space.search
    if search not in ("grid", "random", "optuna"):
        raise ConfigError(f"--search {search!r}: choose grid, random or optuna")
    metric, mode = metric or space.metric, mode or space.mode
    if metric not in REPORTED_METRICS:
        raise ConfigError(f"{src}: metric {metric!r} is not reported by training "
                         f"(choose one of {', '.join(REPORTED_METRICS)})")
    if mode not in ("min", "max"):
        raise ConfigError(f"--mode {mode!r}: choose min or max")
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
    manifest = Path(base["data"]["path"]) / "manifest.json"
    kind = json.loads(manifest.read_text()).get("kind") if manifest.is_file() else None
    wrong = {"generative": ("val_accuracy", "val_conforming"), "mcq": ("val_f1", "val_em")}
    if kind in wrong and metric in wrong[kind]:
        raise ConfigError(f"{src}: metric {metric} is not reported for {kind} data "
                         f"({base['data']['path']}); multiple choice reports val_accuracy, "
                         "generative data val_f1")
    if metric in GENERATED_METRICS and base["data"]["val_generate_examples"] == 0:
        raise ConfigError(f"{src}: metric {metric} needs data.val_generate_examples > 0 "
                         "(greedy answers scored each epoch)")
    return SweepPlan(output=Path(output), base=base, space=space, search=search,
                     num_samples=num_samples or space.num_samples, metric=metric, mode=mode,
                     max_concurrent_trials=max_concurrent_trials or space.max_concurrent_trials,
                     sources={"config": str(config), "space": src, "overrides": overrides})


def load_plan(output: str | os.PathLike) -> SweepPlan:
    """The plan a sweep in `output` was started with (what --resume continues)."""
    output = Path(output)
    try:
        spec = json.loads((output / SPEC_FILE).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{output}: no {SPEC_FILE}; nothing to resume (start the "
                                "sweep with --config and --space first)") from None
    return SweepPlan.from_json(output, spec)


def trial_config(base: dict, sample: dict) -> dict:
    """The complete training config of one trial (validated by the training model)."""
    from medray.train.config import validate_config

    sample = {k: v for k, v in sample.items() if not k.startswith("_")}
    return validate_config(apply_params(base, sample), "trial config").model_dump(mode="json")


def read_events(trial_dir: Path) -> list[dict]:
    """start/end/skip events the driver function wrote (medray.tune.trial)."""
    path = Path(trial_dir) / EVENTS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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


def local_cpus(plan: SweepPlan) -> float:
    """Logical CPUs a local Ray needs for the sweep: every concurrent trial's driver and Train
    workers, plus room for Ray Data's tasks (medray.cluster.connect's `min_cpus`)."""
    return per_trial_resources(plan)["CPU"] * (plan.max_concurrent_trials or 1) + 2
