"""The sweep's progress on the console: one bar of finished trials, the best so far."""

from __future__ import annotations

import math
from typing import Any

from ray.tune import Callback


class TrialProgress(Callback):
    """A Tune callback (it runs on the driver) drawing on a medray.console progress bar."""

    def __init__(self, bars: Any, total: int, metric: str, mode: str) -> None:
        self.bars, self.metric, self.mode = bars, metric, mode
        self.task = bars.add_task("trials", total=total, info="starting")
        self.running: set[str] = set()
        self.done = 0
        self.best = math.nan

    def __getstate__(self) -> dict:
        # Tune pickles its run config (callbacks included) into the experiment folder; a
        # live console cannot travel, and a restored sweep draws no bar.
        return {**self.__dict__, "bars": None}

    def _draw(self) -> None:
        if self.bars is None:
            return
        best = "" if math.isnan(self.best) else f", best {self.metric} {self.best:.4f}"
        self.bars.update(self.task, completed=self.done,
                         info=f"{len(self.running)} running{best}")

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.running.add(trial.trial_id)
        self._draw()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        value = result.get(self.metric)
        if isinstance(value, int | float) and math.isfinite(value) and abs(value) < 1e29:
            better = (value > self.best) if self.mode == "max" else (value < self.best)
            if math.isnan(self.best) or better:
                self.best = float(value)
        self._draw()

    def _finished(self, trial: Any) -> None:
        self.running.discard(trial.trial_id)
        self.done += 1
        self._draw()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finished(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finished(trial)
