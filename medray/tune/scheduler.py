"""ASHA that never stops a trial at its final epoch.

Stock ASHA stops trials at `max_t` and may cut one at the top rung, i.e. right after the
last epoch's report, before `medray train` exports the adapter and writes metrics.json.
Here the last epoch's result is still recorded in the rungs (later trials compare against
it) but the trial is allowed to finish, so "stopped early" means "trained fewer epochs".
"""

from __future__ import annotations

from typing import Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler


class FinalEpochASHA(ASHAScheduler):
    def __init__(self, *, final_epochs: int, epochs_key: str = "optim.epochs",
                 **kwargs: Any) -> None:
        super().__init__(stop_last_trials=False, **kwargs)
        self._final_epochs = final_epochs
        self._epochs_key = epochs_key
        self.stopped: set[str] = set()

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        action = super().on_trial_result(tune_controller, trial, result)
        final = int((trial.config or {}).get(self._epochs_key, self._final_epochs))
        if result.get(self._time_attr, 0) >= final:
            return TrialScheduler.CONTINUE
        if action == TrialScheduler.STOP:
            self.stopped.add(trial.trial_id)
        return action
