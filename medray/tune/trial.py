"""One Tune trial = one `medray train` run (Ray Train V2), inside a Tune driver function.

Ray 2.60: the driver function builds the TorchTrainer with a `TuneReportCallback`, so the
workers' `ray.train.report` calls reach Tune. When Tune stops a trial (ASHA), it calls the
trial actor's `stop()`; our `cleanup` then aborts the Train controller the way Ray's own
Ctrl-C handler does, which releases the workers' placement group. Without that, a stopped
trial leaves its placement group behind whenever Ray's state API is unreachable (a
cluster started without the dashboard): Train's detached cleaner polls the state API
forever and the next trials wait for CPUs that never come back.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback

from medray.train.trainer import run_training
from medray.tune.plan import EVENTS_FILE, TRAIN_SUBDIR, read_events, trial_config


def _event(trial_dir: Path, event: str, **info: Any) -> None:
    with open(trial_dir / EVENTS_FILE, "a") as f:
        f.write(json.dumps({"event": event, "time": time.time(), **info}) + "\n")


class ReportToTune(TuneReportCallback):
    """TuneReportCallback that also tells the trial actor which controller runs its Train run.

    Runs inside the Train controller; the trial actor's handle was captured at construction.
    """

    def __init__(self, trial_actor: Any) -> None:
        super().__init__()
        self._trial_actor = trial_actor
        self._announced = False

    def after_report(self, run_context: Any, metrics: list, checkpoint: Any) -> None:
        if not self._announced:
            me = ray.get_runtime_context().current_actor
            self._trial_actor.medray_set_controller.remote(me)  # fire and forget
            self._announced = True
        super().after_report(run_context, metrics, checkpoint)


def _quiet_fast_data() -> None:
    """Ray Data settings for the datasets this trial process builds (each Dataset keeps the
    DataContext it was created under, so the Train workers' pipelines get them too): the
    small-data Parquet reader (see medray.cluster) and no progress bars (Tune's status
    table reports the trials; per-trial bars interleaved in one log only hide it).
    """
    from ray.data import DataContext

    from medray.cluster import use_small_data_reader

    use_small_data_reader()
    DataContext.get_current().enable_progress_bars = False


def run_trial(config: dict, base: dict) -> None:
    """The driver function: the trial's complete config -> `medray train` into its dir."""
    from medray.train.config import TrainConfig

    ctx = tune.get_context()
    trial_dir = Path(ctx.get_trial_dir())
    trial_dir.mkdir(parents=True, exist_ok=True)
    out = trial_dir / TRAIN_SUBDIR
    done = [e for e in read_events(trial_dir) if e["event"] == "end"]
    if done and (out / "metrics.json").is_file():
        # Finished before an interruption the experiment snapshot missed: do not train
        # again; hand Tune the final result it may not have recorded.
        _event(trial_dir, "skip", trial_id=ctx.get_trial_id())
        tune.report(done[-1]["final"])
        return
    _event(trial_dir, "start", trial_id=ctx.get_trial_id(), pid=os.getpid())
    cfg = TrainConfig.model_validate(trial_config(base, config))
    me = ray.get_runtime_context().current_actor
    _quiet_fast_data()
    # Same Train run name + storage on a restart: Train V2 resumes from its last checkpoint.
    # track=False: the sweep's Tune callbacks log each trial as a child of its run
    metrics = run_training(cfg, out, callbacks=[ReportToTune(me)], track=False)
    last = metrics["epochs"][-1] if metrics.get("epochs") else {}
    final = {k: v for k, v in last.items() if isinstance(v, int | float)}
    _event(trial_dir, "end", trial_id=ctx.get_trial_id(), final=final)


def make_trainable(base: dict, driver_cpus: float) -> Any:
    """The Tune trainable: run_trial + an abort of the Train run when Tune stops the trial."""
    from ray.tune.trainable.function_trainable import wrap_function

    fn = wrap_function(tune.with_parameters(run_trial, base=base), name="medray_trial")

    class MedrayTrial(fn):  # type: ignore[misc, valid-type]
        _controller: Any = None

        def medray_set_controller(self, handle: Any) -> None:
            self._controller = handle

        def cleanup(self) -> None:
            if self._controller is not None:
                try:  # graceful: removes the worker group and its placement group, exits
                    ray.get(self._controller.abort.remote(), timeout=120)
                except Exception:  # noqa: BLE001  (the controller exits: RayActorError)
                    pass
                self._controller = None
            super().cleanup()

    return tune.with_resources(MedrayTrial, {"CPU": driver_cpus})
