"""ASHA that never stops a trial at its final epoch, and whose rungs survive a resume.

Stock ASHA stops trials at `max_t` and may cut one at the top rung, i.e. right after the
last epoch's report, before `medray train` exports the adapter and writes metrics.json.
Here the last epoch's result is still recorded in the rungs (later trials compare against
it) but the trial is allowed to finish, so "stopped early" means "trained fewer epochs".

Ray 2.60's `Tuner.restore` rebuilds the scheduler from the pickle taken when the sweep
started (empty rungs) and never calls the scheduler's own save/restore: after a resume,
ASHA would judge the remaining trials only against each other, and the first one to
report would always survive. So the rungs are written to `state_file` at every change
and read back the first time the restored scheduler is used.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from medray.io import write_text_atomic


class FinalEpochASHA(ASHAScheduler):
    def __init__(self, *, final_epochs: int, epochs_key: str = "optim.epochs",
                 state_file: str | os.PathLike | None = None, **kwargs: Any) -> None:
        super().__init__(stop_last_trials=False, **kwargs)
        self._final_epochs = final_epochs
        self._epochs_key = epochs_key
        self._state_file = str(state_file) if state_file else None
        self._state_loaded = False

    # ------------------------------------------------------------------ rung persistence

    def _rung_records(self) -> list[list[dict[str, float]]]:
        return [[recorded for _milestone, recorded in b._rungs] for b in self._brackets]

    def _load_rungs(self) -> None:
        self._state_loaded = True
        if not self._state_file or not Path(self._state_file).is_file():
            return
        saved = json.loads(Path(self._state_file).read_text())["rungs"]
        for live, old in zip(self._rung_records(), saved, strict=True):
            for recorded, values in zip(live, old, strict=True):
                recorded.update({tid: v for tid, v in values.items() if tid not in recorded})

    def _save_rungs(self) -> None:
        if not self._state_file:
            return
        write_text_atomic(self._state_file, json.dumps(
            {"metric": self._metric, "mode": self._mode, "rungs": self._rung_records()}))

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        if not self._state_loaded:
            self._load_rungs()
        super().on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        if not self._state_loaded:
            self._load_rungs()
        before = json.dumps(self._rung_records())
        action = super().on_trial_result(tune_controller, trial, result)
        if json.dumps(self._rung_records()) != before:
            self._save_rungs()
        final = int((trial.config or {}).get(self._epochs_key, self._final_epochs))
        if result.get(self._time_attr, 0) >= final:
            return TrialScheduler.CONTINUE
        return action

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict) -> None:
        before = json.dumps(self._rung_records())
        super().on_trial_complete(tune_controller, trial, result)
        if json.dumps(self._rung_records()) != before:
            self._save_rungs()
