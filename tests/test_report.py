"""`medray report`: tables (md/csv/tex) and PNG plots from real `medray eval` run dirs
(two baseline runs: no model needed; ~35 s with Ray start-up)."""

from __future__ import annotations

import json

import pandas as pd
import yaml
from typer.testing import CliRunner

from medray.cli import app


def test_report_tables_and_plots(ray_session, medqaro_prepared, tmp_path):
    runs = []
    for name, engine in [
        ("rt1024", {"kind": "baseline", "baseline": "random-token", "tokens": 1024}),
        ("majority", {"kind": "baseline", "baseline": "majority"}),
    ]:
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump({
            "data": str(medqaro_prepared), "engine": engine,
            "score": {"resamples": 20, "wordnet": False, "by": ["question_type"]}}))
        res = CliRunner().invoke(app, ["eval", "-c", str(cfg), "-o", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        runs.append(str(tmp_path / name))

    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["report", *runs, "--out", str(out)])
    assert res.exit_code == 0, res.output
    for f in ("results.md", "results.csv", "results.tex", "f1_vs_context.png",
              "f1_by_question_type.png"):
        assert (out / f).stat().st_size > 0, f
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    csv = pd.read_csv(out / "results.csv")
    overall = csv[csv["question_type"].isna()].set_index("run")
    saved = json.loads((tmp_path / "rt1024" / "metrics.json").read_text())
    assert overall.loc["rt1024", "f1"] == saved["metrics"]["medqaro"]["metrics"]["f1"]["mean"]
    assert overall.loc["rt1024", "context_tokens"] == 1024
    assert pd.isna(overall.loc["majority", "context_tokens"])  # majority reads no context
    assert set(csv["question_type"].dropna()) == {"binary", "extractive", "reasoning"}
    md = (out / "results.md").read_text()
    assert "| model | fine_tuned | context_tokens |" in md and "majority" in md
    assert "medqaro metric mode" in md
    # counts print as integers, metrics with their 95% CI
    assert "| 1024 |" in md and "1024.0000" not in md
    f1 = saved["metrics"]["medqaro"]["metrics"]["f1"]
    assert f"{f1['mean']:.4f} [{f1['ci95'][0]:.4f}, {f1['ci95'][1]:.4f}]" in md
    assert "written:" in res.output and "| model |" in res.output
    tex = (out / "results.tex").read_text()
    assert "\\begin{tabular}" in tex and "random-token" in tex

    # A run directory without metrics.json is a clear error, exit status 2.
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(app, ["report", str(tmp_path / "empty"), "--out", str(out)])
    assert res.exit_code == 2 and "metrics.json" in res.output


def test_report_mixes_generative_and_mcq_runs_of_every_path(tiny_model, medqaro_prepared,
                                                            europemedqa_prepared, tmp_path):
    """One table over an `--engine hf:` EuropeMedQA run, a `--config` MedQARo run (the same
    in-process transformers engine, through the config) and a baseline: every engine writes
    the same run folder. Heavy (torch, tiny model): run under flock; ~40 s."""
    runs = {"emq-hf": tmp_path / "emq-hf", "medqaro-hf": tmp_path / "medqaro-hf",
            "emq-random": tmp_path / "emq-random"}
    res = CliRunner().invoke(app, [
        "eval", "--engine", f"hf:{tiny_model}", "--data", str(europemedqa_prepared),
        "--output", str(runs["emq-hf"]), "--sample", "8"])
    assert res.exit_code == 0, res.output
    for name, data, engine, extra in [
        ("medqaro-hf", medqaro_prepared, {"kind": "hf", "model": str(tiny_model)},
         {"limit": 6, "prompt": {"context_tokens": 128}}),
        ("emq-random", europemedqa_prepared, {"kind": "baseline", "baseline": "random"}, {}),
    ]:
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump({"data": str(data), "engine": engine, **extra,
                                       "score": {"resamples": 20, "wordnet": False}}))
        res = CliRunner().invoke(app, ["eval", "-c", str(cfg), "-o", str(runs[name])])
        assert res.exit_code == 0, res.output
    for run in runs.values():  # one config.json / predictions.jsonl / metrics.json format
        assert {p.name for p in run.iterdir()} >= {"config.json", "predictions.jsonl",
                                                   "metrics.json"}
        saved = json.loads((run / "metrics.json").read_text())
        assert set(saved) >= {"run", "requests", "metrics"}
        assert saved["run"]["n"] == saved["requests"]["selected"]

    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["report", *map(str, runs.values()), "--out", str(out)])
    assert res.exit_code == 0, res.output
    csv = pd.read_csv(out / "results.csv").set_index("run")
    assert set(csv.index) == set(runs)
    assert csv.loc["emq-hf", "kind"] == "mcq" and csv.loc["medqaro-hf", "kind"] == "generative"
    assert csv.loc["emq-hf", "n"] == 8 and csv.loc["medqaro-hf", "n"] == 6
    assert csv.loc["medqaro-hf", "context_tokens"] == 128
    for name in runs:  # the table's numbers are the runs' (a tiny random model may never
        # conform: its accuracy is then undefined, n/a in the table)
        metrics = json.loads((runs[name] / "metrics.json").read_text())["metrics"]
        score = metrics.get("medqaro") or metrics["mcq"]
        for metric in ("f1",) if name == "medqaro-hf" else ("accuracy", "conforming_rate"):
            mean = score["metrics"][metric]["mean"]
            assert pd.isna(csv.loc[name, metric]) if mean is None else (
                csv.loc[name, metric] == mean), (name, metric)
    assert csv.loc["emq-random", "conforming_rate"] == 1.0  # a baseline always conforms
    md = (out / "results.md").read_text()
    table = md.split("\n## ")[0]
    assert table.count("| europemedqa |") == 2 and table.count("| medqaro |") == 1
    assert "| f1 |" in table and "| accuracy |" in table
