"""FinalEpochASHA without a cluster: final epochs never cut, rungs survive a resume."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path

from ray.tune.schedulers import TrialScheduler

from medray.tune.scheduler import FinalEpochASHA


@dataclass
class StubTrial:  # the attributes of ray.tune.experiment.Trial the scheduler reads
    trial_id: str
    config: dict = field(default_factory=dict)


def _asha(state_file: Path | None) -> FinalEpochASHA:
    return FinalEpochASHA(metric="val_loss", mode="min", time_attr="epoch", max_t=2,
                          grace_period=1, reduction_factor=2, final_epochs=2,
                          state_file=state_file)


def _report(asha: FinalEpochASHA, trial: StubTrial, epoch: int, loss: float) -> str:
    return asha.on_trial_result(None, trial, {"epoch": epoch, "val_loss": loss})


def test_worse_trial_is_cut_after_epoch_1_but_never_at_its_final_epoch(tmp_path):
    asha = _asha(tmp_path / "rungs.json")
    good, bad, late = StubTrial("good"), StubTrial("bad"), StubTrial("late")
    for t in (good, bad, late):
        asha.on_trial_add(None, t)
    assert _report(asha, good, 1, 7.0) == TrialScheduler.CONTINUE
    assert _report(asha, bad, 1, 7.8) == TrialScheduler.STOP
    assert _report(asha, good, 2, 6.9) == TrialScheduler.CONTINUE
    # a trial whose first report is its last epoch is recorded but allowed to finish
    assert _report(asha, late, 2, 9.9) == TrialScheduler.CONTINUE


def test_rungs_survive_a_resume_from_the_pickled_scheduler(tmp_path):
    # Tuner.restore unpickles the scheduler as it was when the sweep started (empty rungs)
    state = tmp_path / "rungs.json"
    started = pickle.dumps(_asha(state))
    first = pickle.loads(started)
    first.on_trial_add(None, StubTrial("good"))
    assert _report(first, StubTrial("good"), 1, 7.0) == TrialScheduler.CONTINUE
    assert state.is_file()

    resumed = pickle.loads(started)
    resumed.on_trial_add(None, StubTrial("bad"))
    assert _report(resumed, StubTrial("bad"), 1, 7.8) == TrialScheduler.STOP

    # without the saved rungs the first trial to report after a resume always survives
    (forgetful := _asha(None)).on_trial_add(None, StubTrial("bad"))
    assert _report(forgetful, StubTrial("bad"), 1, 7.8) == TrialScheduler.CONTINUE
