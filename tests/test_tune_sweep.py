"""A real tiny sweep on the session's Ray cluster: ASHA, outputs, kill and resume.

`tune/spaces/tiny_cpu.yaml` over configs/tiny-cpu.yaml: 4 trials (lr {3e-3, 1e-6} x LoRA r
{4, 8}), 1 Train worker each, one trial at a time, 2 epochs, ASHA on val_loss after epoch 1.
The sweep starts in a subprocess (a second Ray driver on the same cluster), is killed with
SIGKILL once Tune's snapshot records a finished trial, then resumes in this process.
Run under the shared lock:
    flock /tmp/medray-heavy.lock .venv/bin/pytest tests/test_tune_sweep.py -x -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TINY_SPACE = ROOT / "tune/spaces/tiny_cpu.yaml"


def _config(tmp_path: Path, model: Path, data: Path) -> Path:
    raw = yaml.safe_load((ROOT / "configs/tiny-cpu.yaml").read_text())
    raw["model"]["name_or_path"] = str(model)
    raw["data"]["path"] = str(data)
    path = tmp_path / "tiny-cpu.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _starts(trial_dir: Path) -> list[dict]:
    from medray.tune.sweep import read_events

    return [e for e in read_events(trial_dir) if e["event"] == "start"]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(
    os.environ.get("MEDRAY_TUNE_E2E") != "1",
    reason="end-to-end sweep not yet verified on the shared 2-core CI cluster (issue 5 open); "
    "run with MEDRAY_TUNE_E2E=1",
)
def test_tiny_sweep_asha_kill_and_resume(ray_session, tiny_model, medqaro_prepared, tmp_path):
    from medray.train.config import load_config
    from medray.tune.sweep import load_plan, run_sweep, snapshot_statuses

    config = _config(tmp_path, tiny_model, medqaro_prepared)
    out = tmp_path / "sweep"
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tune/sweep.py"), "--config", str(config),
         "--space", str(TINY_SPACE), "--output", str(out)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.monotonic()
    try:
        finished: dict[str, str] = {}
        while time.monotonic() - t0 < 420:
            finished = {t: s for t, s in snapshot_statuses(out / "sweep").items()
                        if s == "TERMINATED"}
            if finished or proc.poll() is not None:
                break
            time.sleep(1)
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert finished, "no trial finished in time"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # no graceful Tune shutdown
        proc.wait()
    killed_at = time.time()
    t_first = time.monotonic() - t0
    before = snapshot_statuses(out / "sweep")
    assert len(before) < 4 or set(before.values()) != {"TERMINATED"}, before

    logs: list[str] = []
    summary = run_sweep(load_plan(out), resume=True, log=logs.append)
    t_total = time.monotonic() - t0
    table = summary.trials
    print(f"first run {t_first:.0f}s, total {t_total:.0f}s\n" + "\n".join(logs))
    print(table.to_string())

    # every grid point ran exactly once; finished trials were not rerun
    assert len(table) == 4 and table["trial_id"].is_unique
    assert sorted(zip(table["optim.lr"], table["lora.r"], strict=True)) == [
        (1e-6, 4), (1e-6, 8), (3e-3, 4), (3e-3, 8)]
    for tid in finished:
        starts = _starts(out / "sweep" / f"trial_{tid}")
        assert len(starts) == 1 and starts[0]["time"] < killed_at, (tid, starts)
    assert any(s["time"] > killed_at for tid in table["trial_id"]
               for s in _starts(out / "sweep" / f"trial_{tid}")), "nothing ran after resume"
    assert set(table["status"]) <= {"completed", "stopped_early"}, table[["status", "error"]]

    # ASHA: at least one trial cut after epoch 1 (the 1e-6 trials barely learn)
    early = table[table["stopped_early"]]
    assert len(early) >= 1 and (early["epochs"] == 1).all()
    assert (table.loc[table["status"] == "completed", "epochs"] == 2).all()
    assert (early["optim.lr"] == 1e-6).all()

    # files: trials.csv, plot, TensorBoard events of every trial under the sweep dir
    csv = pd.read_csv(out / "trials.csv")
    assert len(csv) == 4 and csv["stopped_early"].sum() == len(early)
    assert {"final_val_f1", "best_val_loss", "final_val_loss"} <= set(csv.columns)
    assert (out / "val_f1_vs_hparams.png").read_bytes()[:4] == b"\x89PNG"
    for tid in table["trial_id"]:
        tdir = out / "sweep" / f"trial_{tid}"
        assert list(tdir.glob("events.out.tfevents.*")), f"no Tune TB events in {tdir}"
        assert list((tdir / "train" / "tensorboard").glob("events.out.tfevents.*"))

    # best.yaml: the best completed trial's complete config, loadable by `medray train` —
    # and identical to the config that trial's own `medray train` run recorded
    best = table.set_index("trial_id").loc[summary.best_trial]
    assert best["status"] == "completed"
    assert best["best_val_loss"] == table.loc[table["status"] == "completed",
                                              "best_val_loss"].min()
    cfg = load_config(out / "best.yaml")
    assert (cfg.optim.lr, cfg.lora.r) == (best["optim.lr"], best["lora.r"])
    trial_train = out / "sweep" / f"trial_{summary.best_trial}" / "train"
    ran = json.loads((trial_train / "metrics.json").read_text())["config"]
    assert cfg.model_dump(mode="json") == ran
    assert (trial_train / "adapter" / "adapter_config.json").is_file()
