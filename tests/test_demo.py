"""The reduced demo: every stage of `medray demo` on a few patients, on the session cluster.

Same code path as the README's first command (medray.demo.run_demo), with overrides that
shrink data, pre-training and fine-tuning so it fits the suite budget (~3 min, most of it
Ray Train start-up and the vLLM replica). The learning margin itself needs the full recipe:
bench/demo_margin.py measures it per seed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REDUCED = [
    "synth.n_patients={train: 16, val: 2, test: 3, test_cross: 2}",
    "synth.words=[60, 90]",
    "tiny_model.vocab_size=512",
    "pretrain.steps=15",
    "pretrain.seq_len=64",
    "train.optim.max_steps=4",
    "train.optim.warmup_steps=1",
    "train.checkpoint.every_steps=null",
    "train.prompt.context_tokens=128",
    "train.data.val_generate_examples=2",
    "train.lora.r=8",
    "train.lora.alpha=16",
    "eval.resamples=50",
    "eval.limit=12",
    "serve.max_model_len=256",
]


@pytest.mark.timeout(600)
def test_reduced_demo_end_to_end(ray_session, serve_app, tmp_path: Path) -> None:
    # serve_app first: Serve's HTTP proxy belongs to the session's app; the demo deploys
    # its own app beside it under /medray-demo and deletes it at the end.
    from ray import serve

    from medray.demo import run_demo
    from medray.eval.report import load_run

    out = tmp_path / "demo"
    summary = run_demo(out, seed=3, overrides=REDUCED)

    assert not [a for a in serve.status().applications if a.startswith("medray-demo")]
    report = (out / "report.md").read_text()
    metrics = json.loads((out / "metrics.json").read_text())
    rows = {(r["system"], r["split"]): r for r in metrics["rows"]}
    assert set(rows) == {(s, d) for s in ("majority", "zero_shot", "fine_tuned")
                         for d in ("test", "test_cross")}
    for (system, split), row in rows.items():
        assert row["split"] == split
        run = load_run(Path(row["run_dir"]))
        # The report's numbers are the evaluation run's numbers, with their CIs.
        assert row["f1"]["mean"] == run["metrics"]["medqaro"]["metrics"]["f1"]["mean"]
        lo, hi = row["f1"]["ci95"]
        assert lo <= row["f1"]["mean"] <= hi
        assert row["n"] == run["run"]["n"] == 12
        preds = [json.loads(x) for x in (Path(row["run_dir"]) / "predictions.jsonl").open()]
        assert len(preds) == 12
        if system == "fine_tuned":  # the adapter merged (it trains embed_tokens in full)
            assert {(p["model"], p["adapter"]) for p in preds} == {("demo-ft", None)}
            assert run["run"]["fine_tuned"] is True
        if system == "zero_shot":
            assert {(p["model"], p["adapter"]) for p in preds} == {("demo-base", None)}
        assert row["label"] in report
    margin = metrics["margin_in_domain_f1"]
    assert margin["value"] == pytest.approx(
        rows["fine_tuned", "test"]["f1"]["mean"] - rows["majority", "test"]["f1"]["mean"])
    assert "medqaro" in metrics["how"] and "bootstrap" in metrics["how"]
    assert "Pre-training stage" in report and "Synthetic" in report
    # Ray Train really ran: 2 workers, ZeRO-2, an adapter, TensorBoard events.
    assert metrics["training"]["workers"] == 2 and metrics["training"]["deepspeed_stage"] == 2
    assert (out / "train" / "adapter" / "adapter_config.json").is_file()
    assert list((out / "train" / "tensorboard").rglob("events.out.tfevents.*"))
    assert (out / "f1_by_system.png").stat().st_size > 1000
    assert (out / "report" / "results.md").is_file()
    assert summary["lines"][-1].startswith("in-domain F1 margin")
    assert metrics["model"]["pretrain"]["steps"] == 15
