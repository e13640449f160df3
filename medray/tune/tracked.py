"""`medray tune` on MLflow / W&B (medray.tracking): a parent run for the sweep, one child run
per trial.

The sweep's driver opens the parent run (parameters: the sweep spec, base config and space)
before any trial starts. Ray Tune's own logger callbacks give each trial its run:
MLflowLoggerCallback tags it `mlflow.parentRunId` (MLflow shows it under the parent),
WandbLoggerCallback puts it in a W&B group named after the sweep; both log the trial's
sampled hyperparameters and every result it reports (per epoch). At the end the parent gets
the best trial's metric and trials.csv, best.yaml, the plot and sweep_spec.json.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from medray.tracking import Tracker, TrackingConfig, enabled
from medray.tune.plan import SPEC_FILE, SweepPlan


def tracking_of(plan: SweepPlan) -> TrackingConfig:
    return TrackingConfig.model_validate(plan.base.get("tracking") or {})


def start_sweep_tracking(plan: SweepPlan) -> tuple[Tracker | None, list[Any]]:
    """The parent run (started: ConfigError when the server cannot be reached) and the Tune
    callbacks that log the trials; (None, []) when tracking is off."""
    cfg = tracking_of(plan)
    if not enabled(cfg):
        return None, []
    name = cfg.run_name or plan.output.resolve().name
    tracker = Tracker(cfg, kind="tune", name=name, folder=plan.output,
                      tags={"medray.output": str(plan.output.resolve())})
    tracker.start(plan.to_json())
    callbacks: list[Any] = []
    if tracker.run_id:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        callbacks.append(MLflowLoggerCallback(
            tracking_uri=tracker.uri, experiment_name=cfg.mlflow.experiment,
            tags={"mlflow.parentRunId": tracker.run_id, "medray.command": "tune-trial",
                  "medray.sweep": name}))
    if cfg.wandb.project:
        from ray.air.integrations.wandb import WandbLoggerCallback

        callbacks.append(WandbLoggerCallback(
            project=cfg.wandb.project, group=name, entity=cfg.wandb.entity,
            mode=cfg.wandb.mode, dir=str(plan.output.resolve()), job_type="trial"))
    return tracker, callbacks


@contextmanager
def environment_kept() -> Iterator[None]:
    """MLflowLoggerCallback calls mlflow.set_tracking_uri, which also sets
    MLFLOW_TRACKING_URI in this process's environment (for subprocesses): put it back
    after the sweep, so a later run in the same process is not tracked by accident."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before


def finish_sweep_tracking(tracker: Tracker, plan: SweepPlan, summary: Any,
                          log: Any = print) -> None:
    """The best trial's metric and the sweep's output files on the parent run."""
    trials, column = summary.trials, f"best_{plan.metric}"  # trials.csv: its best report
    if summary.best_trial is not None and column in trials:
        best = trials.loc[trials["trial_id"].astype(str) == summary.best_trial, column]
        if len(best) and best.notna().all():
            tracker.log_summary({f"best/{plan.metric}": float(best.iloc[0])})
    tracker.log_summary({"trials": float(len(trials))})
    tracker.log_artifacts([*map(Path, summary.files.values()), plan.output / SPEC_FILE])
    for warning in tracker.warnings:
        log(warning)
