"""`medray eval` on MLflow / W&B (medray.tracking), from the driver: the run's config as
parameters, every metric mode's scores with their 95% bootstrap CIs (`<mode>.<metric>.mean`,
`.ci95_lo`, `.ci95_hi`) and item counts, and metrics.json + config.json as artifacts.
Predictions and references (clinical text) stay in the run folder: they are never logged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from medray.eval.config import EvalConfig
from medray.eval.runio import CONFIG, METRICS
from medray.tracking import Tracker, enabled, numbers


def start_eval_tracking(cfg: EvalConfig, record: dict[str, Any], out: Path) -> Tracker | None:
    """The run's tracker, started before any request (ConfigError when the server cannot
    be reached), or None when tracking is off. `record`: the run's config.json."""
    if not enabled(cfg.tracking):
        return None
    out = Path(out)
    tracker = Tracker(cfg.tracking, kind="eval", name=out.resolve().name, folder=out,
                      tags={"medray.engine": str(cfg.engine), "medray.split": cfg.split,
                            "medray.output": str(out.resolve())})
    return tracker.start(record)


def eval_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """`<mode>.<metric>.mean|ci95_lo|ci95_hi` and `<mode>.n` of a metrics.json."""
    found: dict[str, float] = {}
    for mode, block in (summary.get("metrics") or {}).items():
        found.update(numbers(block.get("metrics") or {}, mode))
        if isinstance(block.get("n"), int):
            found[f"{mode}.n"] = float(block["n"])
    return found


def finish_eval_tracking(tracker: Tracker, summary: dict[str, Any], out: Path,
                         log: Any = print) -> None:
    tracker.log_summary(eval_metrics(summary))
    tracker.log_artifacts([Path(out) / METRICS, Path(out) / CONFIG])
    for warning in tracker.warnings:
        log(warning)
