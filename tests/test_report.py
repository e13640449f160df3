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

    # Generative breakdowns and hard items (token F1 of 0 for both runs), same CLI.
    study = tmp_path / "study"
    res = CliRunner().invoke(app, ["report", *runs, "--out", str(study), "--by",
                                   "question_type", "--hard-items", "--resamples", "50"])
    assert res.exit_code == 0, res.output
    by = pd.read_csv(study / "breakdown.csv")
    assert set(by["value"]) == {"binary", "extractive", "reasoning"}
    assert {"f1", "f1_lo", "f1_hi", "em"} <= set(by.columns)
    for run, group in by.groupby("run"):
        assert group["n"].sum() == saved["metrics"]["medqaro"]["n"], run
    hard_md = (study / "hard_items.md").read_text()
    assert "token F1 of 0" in hard_md and "| question_type |" in hard_md

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


def test_study_report_on_the_real_italian_slice(shared_data, tmp_path):
    """EuropeMedQA's analyses from two seeded random-letter runs over the real Italian SSM
    slice (1,060 text-only items): per specialty, year, gold letter and country with CIs,
    and the items both runs miss. In-process baselines: no Ray, no model (~20 s)."""
    data = tmp_path / "emq"
    res = CliRunner().invoke(app, [
        "data", "prepare", "--dataset", "europemedqa", "--out", str(data),
        "--input", str(shared_data / "europemedqa" / "ssm_questions_text_only.json")])
    assert res.exit_code == 0, res.output
    # The majority-letter baseline needs a train split, which EuropeMedQA has not: refused.
    res = CliRunner().invoke(app, ["eval", "--engine", "baseline:majority", "--data",
                                   str(data), "--output", str(tmp_path / "majority")])
    assert res.exit_code == 2 and "train split" in res.output, res.output
    assert not (tmp_path / "majority").exists()
    runs = [tmp_path / "random-0", tmp_path / "random-1"]
    for seed, run in enumerate(runs):
        cfg = tmp_path / f"random-{seed}.yaml"
        cfg.write_text(yaml.safe_dump({"data": str(data), "engine": {
            "kind": "baseline", "baseline": "random", "seed": seed}}))
        res = CliRunner().invoke(app, ["eval", "-c", str(cfg), "-o", str(run)])
        assert res.exit_code == 0, res.output

    out = tmp_path / "study"
    res = CliRunner().invoke(app, ["report", *map(str, runs), "--out", str(out), "--by",
                                   "specialty,year,gold_letter,country", "--hard-items",
                                   "--resamples", "200"])
    assert res.exit_code == 0, res.output
    by = pd.read_csv(out / "breakdown.csv")
    assert set(by["field"]) == {"specialty", "year", "gold_letter", "country"}
    assert set(by["run"]) == {"random-0", "random-1"}
    for (run, field), group in by.groupby(["run", "field"]):  # groups partition the items
        assert group["n"].sum() == 1060, (run, field)
    assert set(by.loc[by["field"] == "country", "value"]) == {"IT"}
    assert "2017" in set(by.loc[by["field"] == "year", "value"].astype(str))
    letters = by[(by["field"] == "gold_letter") & (by["run"] == "random-0")]
    # after the seeded option shuffle the key is spread over the five letters
    assert set(letters["value"]) == set("ABCDE") and letters["n"].max() < 0.4 * 1060
    cardio = by[(by["field"] == "specialty") & (by["value"] == "Cardiology")]
    assert list(cardio["n"]) == [84, 84]
    assert (cardio["accuracy_lo"] <= cardio["accuracy"]).all()
    assert (cardio["accuracy"] <= cardio["accuracy_hi"]).all()
    md = (out / "breakdown.md").read_text()
    assert "## By specialty" in md and "## By gold_letter" in md and " [" in md

    # the hard items are exactly those both seeds answer wrong
    gold = {r["id"]: "".join(r["answer"]) for r in
            map(json.loads, (runs[0] / "references.jsonl").open())}
    wrong = [{r["id"] for r in map(json.loads, (run / "predictions.jsonl").open())
              if r["prediction"] != gold[r["id"]]} for run in runs]
    hard = pd.read_csv(out / "hard_items.csv")
    assert set(hard["id"]) == wrong[0] & wrong[1] and len(hard) > 0
    head = (out / "hard_items.md").read_text().splitlines()[0]
    assert head == f"# Items every run misses: {len(hard)} of 1060 items common to 2 runs " \
                   "(random-0, random-1)"
    assert "Items every run misses" in res.output
