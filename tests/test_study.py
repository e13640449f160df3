"""`medray study context-length`: a 2-length study on CPU through the real parts (a Ray Tune
grid of `medray train` runs, the eval runner with the in-process transformers engine, the
report tables), then rerun to show it resumes. Budget on 2 cores: ~3 min.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from medray.cli import app

ROOT = Path(__file__).resolve().parents[1]
TINY = ["scaling.num_workers=1", "optim.epochs=1", "optim.max_steps=2",
        "optim.warmup_steps=1", "data.max_train_examples=16", "data.max_val_examples=8",
        "data.val_generate_examples=0", "data.tokenize_actors=1", "checkpoint.every_steps=null",
        "prompt.max_new_tokens=4", "fault.max_failures=0"]


def test_context_length_study_trains_evaluates_and_tabulates(ray_session, tiny_model,
                                                            medqaro_prepared, tmp_path):
    out = tmp_path / "study"
    args = ["study", "context-length", "--config", str(ROOT / "configs" / "tiny-cpu.yaml"),
            "--lengths", "160,112", "--output", str(out), "--engine", "hf", "--limit", "6",
            "--resamples", "50", f"model.name_or_path={tiny_model}",
            f"data.path={medqaro_prepared}", *TINY]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output

    trials = pd.read_csv(out / "sweep" / "trials.csv")
    assert sorted(trials["prompt.context_tokens"]) == [112, 160]
    assert set(trials["status"]) == {"completed"}
    table = pd.read_csv(out / "table.csv")
    assert sorted(table["context_tokens"].unique()) == [112, 160]
    assert set(table["domain"]) == {"in", "cross"} and set(table["n"]) == {6}
    for row in table.itertuples():
        run = out / "eval" / f"{row.context_tokens}-{row.split}"
        saved = json.loads((run / "metrics.json").read_text())
        assert saved["run"]["prompt_spec"]["context_tokens"] == row.context_tokens  # its own
        assert row.f1 == saved["metrics"]["medqaro"]["metrics"]["f1"]["mean"]
        assert row.fine_tuned
    md = (out / "table.md").read_text()
    assert "medqaro metric mode" in md and "| 112 |" in md and "| 160 |" in md
    assert "\\begin{tabular}" in (out / "table.tex").read_text()
    assert (out / "f1_vs_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The same command again resumes: the trials are kept, every item was answered already.
    before = {p: p.stat().st_mtime_ns for p in (out / "eval").glob("*/predictions.jsonl")}
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert len(pd.read_csv(out / "sweep" / "trials.csv")) == 2
    # ... and another set of lengths in the same folder is refused, naming the started one
    res = CliRunner().invoke(app, [*args[:5], "112,160,224", *args[6:]])
    assert res.exit_code == 2 and "112,160" in res.output, res.output


def test_eval_only_study_and_bad_lengths(ray_session, tiny_model, medqaro_prepared, tmp_path):
    out = tmp_path / "eval-only"
    res = CliRunner().invoke(app, [
        "study", "context-length", "--eval-only", str(tiny_model), "--data",
        str(medqaro_prepared), "--lengths", "112,160", "--splits", "test", "--output",
        str(out), "--engine", "hf", "--limit", "4", "--resamples", "20"])
    assert res.exit_code == 0, res.output
    table = pd.read_csv(out / "table.csv")
    assert sorted(table["context_tokens"]) == [112, 160] and not table["fine_tuned"].any()
    res = CliRunner().invoke(app, [
        "study", "context-length", "--eval-only", str(tiny_model), "--data",
        str(medqaro_prepared), "--lengths", "1024", "--output", str(tmp_path / "one")])
    assert res.exit_code == 2 and "at least two" in res.output
    assert not (tmp_path / "one").exists()
