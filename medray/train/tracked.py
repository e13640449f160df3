"""`medray train` on MLflow / W&B (medray.tracking): what a training run logs, from the driver.

- parameters: the resolved config (after `prompt.chat_template: auto` was decided);
- per optimiser step: rank 0's TensorBoard scalars (train/loss, train/lr, val/* of
  optim.eval_every_steps), relayed through the progress board (medray.train.progress);
- per epoch: each epoch's record of metrics.json as `epoch/<key>` against the epoch;
- at the end: the exported record as `final/<key>`, and as artifacts the adapter folder,
  its prompt.json and metrics.json (config, losses and scores; no example text).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from medray.prompts.spec import PROMPT_FILE
from medray.tracking import Tracker, enabled, numbers
from medray.train.config import TrainConfig


def start_tracking(cfg: TrainConfig, output: Path) -> Tracker | None:
    """The run's tracker, started (ConfigError when the server cannot be reached), or None
    when tracking is off."""
    if not enabled(cfg.tracking):
        return None
    output = Path(output)
    tracker = Tracker(cfg.tracking, kind="train", name=output.resolve().name or cfg.name,
                      folder=output, tags={"medray.name": cfg.name,
                                           "medray.output": str(output.resolve())})
    return tracker.start(cfg.model_dump(mode="json"))


def finish_tracking(tracker: Tracker, metrics: dict[str, Any], output: Path,
                    log: Any = print) -> None:
    """Epoch records, the final numbers and the artifacts of a finished run."""
    tracker.log_epochs(metrics.get("epochs") or [])
    final = (metrics.get("exported") or {}).get("record") or (metrics.get("epochs") or [{}])[-1]
    tracker.log_summary({f"final/{k}": v for k, v in numbers(final).items()})
    output = Path(output)
    tracker.log_artifacts([output / "adapter", output / "adapter" / PROMPT_FILE,
                           output / "metrics.json"])
    for warning in tracker.warnings:
        log(warning)
