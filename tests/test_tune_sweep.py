"""A real tiny sweep on the session's Ray cluster: ASHA, outputs, kill and resume, best.yaml.

`tune/spaces/tiny_cpu.yaml` over configs/tiny-cpu.yaml: 4 trials (lr {3e-3, 1e-6} x LoRA r
{4, 8}), 1 Train worker each, 2 trials at a time, 2 epochs of 4 steps, ASHA on val_loss
after epoch 1. The sweep starts as `python tune/sweep.py` in a subprocess (a second Ray
driver on the same cluster) and gets Ctrl-C (SIGINT) once Tune's snapshot records a
finished trial: it must exit 130, mark the cut-off trials `interrupted` in trials.csv and
write no best.yaml. It then resumes in this process, and `medray train --config best.yaml`
runs.

Budget on 2 cores (measured, Ray 2.60): ~6.5 min (395 s; 475 s with other jobs on the
machine): 5-6 Train runs (4 trials, one trial restarted if the kill cut it, best.yaml),
each ~60-90 s of which most is Ray process start-up. Run alone under the shared lock:
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
GRID = [(1e-6, 4), (1e-6, 8), (3e-3, 4), (3e-3, 8)]


def _config(tmp_path: Path, model: Path, data: Path) -> Path:
    raw = yaml.safe_load((ROOT / "configs/tiny-cpu.yaml").read_text())
    raw["model"]["name_or_path"] = str(model)
    raw["data"]["path"] = str(data)
    path = tmp_path / "tiny-cpu.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _starts(trial_dir: Path) -> list[dict]:
    from medray.tune.plan import read_events

    return [e for e in read_events(trial_dir) if e["event"] == "start"]


def _start_and_interrupt(cmd: list[str], exp: Path, log_path: Path) -> tuple[dict, int]:
    """Run the sweep until Tune's snapshot records a finished trial, then press Ctrl-C
    (SIGINT); returns the finished trials and the exit status."""
    from medray.tune.sweep import snapshot_statuses

    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env={**os.environ, "RAY_ADDRESS": _address()})
    t0 = time.monotonic()
    try:
        finished: dict[str, str] = {}
        while time.monotonic() - t0 < 720 and proc.poll() is None:
            finished = {t: s for t, s in snapshot_statuses(exp).items() if s == "TERMINATED"}
            if finished:
                break
            time.sleep(0.5)
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert finished, "no trial finished in time:\n" + log_path.read_text()[-3000:]
        os.kill(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return finished, code


def _address() -> str:
    import ray

    return ray.get_runtime_context().gcs_address


def _tensorboard_runs(logdir: Path) -> dict[str, list[str]]:
    """What `tensorboard --logdir DIR` lists: run (directory) -> scalar tags."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    mux = EventMultiplexer().AddRunsFromDirectory(str(logdir))
    mux.Reload()
    return {run: tags["scalars"] for run, tags in mux.Runs().items()}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tiny_sweep_asha_kill_and_resume(ray_session, tiny_model, medqaro_prepared, tmp_path):
    from typer.testing import CliRunner

    from medray.cli import app
    from medray.train.config import load_config
    from medray.tune.plan import load_plan
    from medray.tune.sweep import run_sweep, snapshot_statuses

    config = _config(tmp_path, tiny_model, medqaro_prepared)
    out = tmp_path / "sweep"
    exp = out / "sweep"
    t0 = time.monotonic()
    finished, code = _start_and_interrupt(
        [sys.executable, str(ROOT / "tune/sweep.py"), "--config", str(config),
         "--space", str(TINY_SPACE), "--output", str(out)], exp, tmp_path / "first.log")
    killed_at = time.time()
    t_first = time.monotonic() - t0
    first_log = (tmp_path / "first.log").read_text()
    before = snapshot_statuses(exp)
    assert len(before) < 4 or set(before.values()) != {"TERMINATED"}, before
    # Ctrl-C: exit 130, the cut-off trials say so, no best.yaml from a partial sweep
    assert code == 130, first_log[-3000:]
    assert "interrupted" in first_log and "--resume" in first_log, first_log[-3000:]
    partial = pd.read_csv(out / "trials.csv")
    assert (partial["status"] == "interrupted").any(), partial[["trial_id", "status"]]
    assert not (out / "best.yaml").exists()
    assert len(first_log.splitlines()) <= 60, first_log

    logs: list[str] = []
    summary = run_sweep(load_plan(out), resume=True, log=logs.append)
    t_sweep = time.monotonic() - t0
    table = summary.trials
    print(f"first run {t_first:.0f}s (Ctrl-C after {sorted(finished)} finished), sweep total "
          f"{t_sweep:.0f}s\n" + "\n".join(logs))
    print(table.drop(columns=["trial_dir"]).to_string())

    # every grid point ran exactly once; trials finished before Ctrl-C were not rerun
    assert len(table) == 4 and table["trial_id"].is_unique
    assert sorted(zip(table["optim.lr"], table["lora.r"], strict=True)) == GRID
    for tid in finished:
        starts = _starts(exp / f"trial_{tid}")
        assert len(starts) == 1 and starts[0]["time"] < killed_at, (tid, starts)
    assert any(s["time"] > killed_at for tid in table["trial_id"]
               for s in _starts(exp / f"trial_{tid}")), "nothing ran after resume"
    assert set(table["status"]) <= {"completed", "stopped_early"}, table[["status", "error"]]

    # ASHA (rungs kept across the resume): trials cut after epoch 1, never later. The
    # lr 1e-6 trials barely move (val_loss ~7.78 vs ~7.0), so they are always cut: the
    # rung holds at least one lr 3e-3 trial before they report (2 trials at a time).
    early = table[table["stopped_early"]]
    done = table[table["status"] == "completed"]
    assert len(early) >= 2 and (early["epochs"] == 1).all(), table
    assert len(done) >= 1 and (done["epochs"] == 2).all(), table
    assert (table.loc[table["optim.lr"] == 1e-6, "stopped_early"]).all(), table
    # the rungs file holds every trial's epoch-1 result, the ones reported after the resume too
    rung1 = json.loads((out / "asha_rungs.json").read_text())["rungs"][0][-1]
    assert set(rung1) == set(table["trial_id"]), rung1

    # trials.csv: one row per trial with hyperparameters, final/best metrics, status
    csv = pd.read_csv(out / "trials.csv")
    assert len(csv) == 4 and csv["stopped_early"].sum() == len(early)
    assert {"optim.lr", "lora.r", "status", "epochs", "final_val_loss", "best_val_loss",
            "final_val_f1", "best_val_f1"} <= set(csv.columns)
    assert csv["final_val_loss"].notna().all() and csv["final_val_f1"].between(0, 1).all()
    png = (out / "val_f1_vs_hparams.png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) > 10_000

    # TensorBoard: `tensorboard --logdir DIR` shows every trial (Tune's per-trial events)
    # and every trial's own `medray train` events (per-step train loss)
    runs = _tensorboard_runs(out)
    for tid in table["trial_id"]:
        tune_run = f"sweep/trial_{tid}"
        assert "ray/tune/val_loss" in runs.get(tune_run, []), (tune_run, sorted(runs))
        assert any(r.startswith(f"{tune_run}/train/tensorboard") and tags
                   for r, tags in runs.items()), (tid, sorted(runs))

    # best.yaml: the best completed trial's complete config, identical to the config its
    # own training run recorded ...
    best = table.set_index("trial_id").loc[summary.best_trial]
    assert best["status"] == "completed" and best["optim.lr"] == 3e-3
    assert best["best_val_loss"] == done["best_val_loss"].min()
    cfg = load_config(out / "best.yaml")
    assert (cfg.optim.lr, cfg.lora.r) == (best["optim.lr"], best["lora.r"])
    trial_train = exp / f"trial_{summary.best_trial}" / "train"
    used = json.loads((trial_train / "metrics.json").read_text())["config"]
    # The trial ran best.yaml's config; its record says what `auto` became for the model.
    assert cfg.prompt.chat_template == "auto" and used["prompt"]["chat_template"] is True
    assert cfg.model_dump(mode="json") == {**used, "prompt": {**used["prompt"],
                                                              "chat_template": "auto"}}
    assert (trial_train / "adapter" / "adapter_config.json").is_file()

    # ... and `medray train --config best.yaml` runs it as is (no overrides).
    t1 = time.monotonic()
    res = CliRunner().invoke(app, ["train", "--config", str(out / "best.yaml"),
                                   "--output", str(tmp_path / "retrain")])
    assert res.exit_code == 0, res.output
    rerun = json.loads((tmp_path / "retrain" / "metrics.json").read_text())
    assert rerun["config"] == used  # the same run as the trial, `auto` decided alike
    assert [e["epoch"] for e in rerun["epochs"]] == [1, 2]
    assert (tmp_path / "retrain" / "adapter" / "adapter_config.json").is_file()
    print(f"medray train --config best.yaml: {time.monotonic() - t1:.0f}s")
