"""trials.csv, best.yaml and the plot from Tune results (stand-in Result objects, no Ray).

The real sweep (tests/test_tune_sweep.py) checks the same files end to end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from medray.train.config import load_config
from medray.tune.outputs import pick_best, trials_table, write_outputs
from medray.tune.plan import EVENTS_FILE, plan_sweep

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class FakeResult:  # the attributes of ray.tune.Result that outputs.py reads
    path: str
    config: dict
    metrics: dict
    metrics_dataframe: pd.DataFrame | None
    error: Exception | None = None


def _trial(root: Path, tid: str, lr: float, r: int, losses: list[float], f1s: list[float],
           finished: bool, error: Exception | None = None) -> FakeResult:
    d = root / f"trial_{tid}"
    d.mkdir(parents=True)
    events = [{"event": "start"}] + ([{"event": "end", "final": {}}] if finished else [])
    (d / EVENTS_FILE).write_text("".join(json.dumps(e) + "\n" for e in events))
    df = pd.DataFrame({"epoch": range(1, len(losses) + 1), "val_loss": losses, "val_f1": f1s,
                       "val_em": [0.0] * len(losses), "train_loss": losses,
                       "tokens_per_s": [100.0] * len(losses), "trial_id": tid})
    return FakeResult(str(d), {"optim.lr": lr, "lora.r": r},
                      {"trial_id": tid, "time_total_s": 12.34, **df.iloc[-1].to_dict()}
                      if len(df) else {}, df if len(df) else None, error)


@pytest.fixture()
def sweep(tmp_path):
    plan = plan_sweep(ROOT / "configs/tiny-cpu.yaml", ROOT / "tune/spaces/tiny_cpu.yaml",
                      tmp_path / "out", ["model.name_or_path=m", "data.path=d"])
    root = plan.experiment_dir
    results = [
        _trial(root, "a_00000", 3e-3, 4, [2.0, 1.5], [0.1, 0.2], True),
        _trial(root, "a_00001", 1e-6, 4, [3.0], [0.0], False),  # cut by ASHA after epoch 1
        _trial(root, "a_00002", 3e-3, 8, [1.8, 1.6], [0.1, 0.3], True),
        _trial(root, "a_00003", 1e-6, 8, [], [], False, RuntimeError("worker died\ntrace")),
    ]
    return plan, results


def test_trials_table_rows(sweep):
    plan, results = sweep
    t = trials_table(results, list(plan.space.params), plan.metric, plan.mode)
    assert list(t["trial_id"]) == ["a_00000", "a_00001", "a_00002", "a_00003"]
    assert list(t["status"]) == ["completed", "stopped_early", "completed", "error"]
    assert list(t["stopped_early"]) == [False, True, False, False]
    assert list(t["epochs"]) == [2, 1, 2, 0]
    assert t.loc[0, "final_val_loss"] == 1.5 and t.loc[0, "best_val_loss"] == 1.5
    assert t.loc[2, "final_val_loss"] == 1.6 and t.loc[2, "best_val_loss"] == 1.6
    assert t.loc[2, "best_val_f1"] == 0.3  # F1: higher is better whatever the sweep metric
    assert t.loc[3, "error"] == "RuntimeError: worker died"  # the root cause, typed
    assert pd.isna(t.loc[3, "final_val_loss"])
    assert list(t["lora.r"]) == [4, 4, 8, 8] and t.loc[0, "optim.lr"] == 3e-3
    best = pick_best(t, "val_loss", "min")
    assert best["trial_id"] == "a_00000"  # 1.5 < 1.6
    assert pick_best(t, "val_f1", "max")["trial_id"] == "a_00002"


def test_write_outputs_files(sweep):
    plan, results = sweep
    logs: list[str] = []
    summary = write_outputs(plan, results, log=logs.append)
    out = plan.output
    csv = pd.read_csv(out / "trials.csv")
    assert len(csv) == 4 and {"status", "stopped_early", "optim.lr", "lora.r",
                              "final_val_f1", "best_val_loss"} <= set(csv.columns)
    assert (out / "val_f1_vs_hparams.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert summary.best_trial == "a_00000"
    cfg = load_config(out / "best.yaml")  # a complete config medray train accepts
    assert cfg.optim.lr == 3e-3 and cfg.lora.r == 4
    assert cfg.scaling.num_workers == 1 and cfg.data.max_train_examples == 32  # `fixed`
    assert (out / "best.yaml").read_text().startswith("# Best of 4 trials")
    assert any("val_loss" in line and "min" in line for line in logs)  # says how
    assert not list(out.glob(".*.tmp"))
