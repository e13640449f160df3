"""`medray score`: JSON shape, input validation (exit 2), prepared data, breakdowns, baselines.

Budget: ~15 s (synthetic prepared datasets are session fixtures shared with other tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from medray.cli import app
from medray.eval.metrics.generative import f1_medqaro
from medray.eval.metrics.mcq import random_expected_accuracy
from medray.eval.metrics.textnorm import normalize_medqaro

runner = CliRunner()
METRICS = ("f1", "em", "bleu", "meteor", "sacrebleu_bleu", "chrf")


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


@pytest.fixture()
def pair_files(tmp_path):
    refs = [{"id": "a", "answer": "ciclul 1 ciclul 2", "patient_id": "p1", "question_type":
             "extractive"},
            {"id": "b", "answer": "Nu", "patient_id": "p1", "question_type": "binary"},
            {"id": "c", "answer": "ștefan", "patient_id": "p2", "question_type": "extractive"},
            {"id": "d", "answer": ["Da", "da."], "patient_id": "p3", "question_type": "binary"}]
    preds = [{"id": "a", "prediction": "ciclul 1 ciclul 2"}, {"id": "b", "prediction": "Nu"},
             {"id": "c", "prediction": "ştefan"}, {"id": "d", "prediction": "„Da”"}]
    return _jsonl(tmp_path / "preds.jsonl", preds), _jsonl(tmp_path / "refs.jsonl", refs)


def _score(*args: str) -> dict:
    res = runner.invoke(app, ["score", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_json_shape_and_modes(pair_files):
    preds, refs = pair_files
    out = _score("--predictions", str(preds), "--references", str(refs), "--mode", "medqaro")
    assert out["mode"] == "medqaro" and out["n"] == 4
    for name in METRICS:
        m = out["metrics"][name]
        assert set(m) == {"mean", "ci95"} and len(m["ci95"]) == 2
        assert m["ci95"][0] <= m["mean"] <= m["ci95"][1]
    # a: F1 .75 EM 1; b: 1/1; c: cedilla 0/0; d: „Da” 0/0  (reference quirks)
    assert out["metrics"]["f1"]["mean"] == pytest.approx((0.75 + 1) / 4)
    assert out["metrics"]["em"]["mean"] == pytest.approx(2 / 4)
    assert "word_tokenize" in out["tokenizer"] and isinstance(out["meteor_wordnet"], bool)
    assert out["how"]["ci"]["unit"] == "patient" and out["n_clusters"] == 3
    robust = _score("-p", str(preds), "--references", str(refs), "--mode", "robust")
    assert robust["metrics"]["f1"]["mean"] == 1.0 and robust["metrics"]["em"]["mean"] == 1.0
    assert robust["mode"] == "robust"


def test_breakdown_by_field(pair_files):
    preds, refs = pair_files
    out = _score("-p", str(preds), "--references", str(refs), "--by", "question_type")
    groups = out["by"]["question_type"]
    assert set(groups) == {"binary", "extractive"}
    assert sum(g["n"] for g in groups.values()) == out["n"]
    assert groups["binary"]["metrics"]["em"]["mean"] == 0.5  # "Nu" right, „Da” wrong
    res = runner.invoke(app, ["score", "-p", str(preds), "--references", str(refs),
                              "--by", "nonexistent"])
    assert res.exit_code == 2 and "nonexistent" in res.stderr


def test_human_output_says_how(pair_files):
    preds, refs = pair_files
    res = runner.invoke(app, ["score", "-p", str(preds), "--references", str(refs)])
    assert res.exit_code == 0
    assert "mode=medqaro" in res.stdout and "n=4" in res.stdout and "bootstrap" in res.stdout
    # a references file names itself, not a dataset and split it does not have
    assert f"references={refs}" in res.stdout and "dataset=None" not in res.stdout
    assert "split(s)=?" not in res.stdout


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        ([{"id": "a", "prediction": "x"}, {"id": "b", "prediction": "y"},
          {"id": "c", "prediction": "z"}], "'d'"),  # missing id d
        ([{"id": "a", "prediction": "x"}, {"id": "a", "prediction": "x"}], "duplicate id"),
        ([{"id": "a", "prediction": "x"}, {"id": "zz", "prediction": "y"}], "'zz'"),
        ([], "empty"),
        ([{"id": "a", "answer": "x"}], "'prediction'"),
    ],
)
def test_bad_prediction_files_exit_2_naming_file_and_id(pair_files, tmp_path, rows, needle):
    _, refs = pair_files
    bad = _jsonl(tmp_path / "bad.jsonl", rows)
    res = runner.invoke(app, ["score", "-p", str(bad), "--references", str(refs)])
    assert res.exit_code == 2
    assert str(bad) in res.stderr and needle in res.stderr
    if rows and needle != "'d'":
        assert "line" in res.stderr or "id" in res.stderr


def test_invalid_json_line_is_reported(pair_files, tmp_path):
    _, refs = pair_files
    bad = tmp_path / "broken.jsonl"
    bad.write_text('{"id": "a", "prediction": "x"}\n{oops\n')
    res = runner.invoke(app, ["score", "-p", str(bad), "--references", str(refs)])
    assert res.exit_code == 2 and "line 2" in res.stderr


def test_cli_import_stays_light():
    code = ("import sys, medray.cli; heavy = [m for m in ('nltk', 'torch', 'ray', 'sacrebleu') "
            "if m in sys.modules]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- on prepared synthetic data ---------------------------------------------------------------


def _examples(data_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(data_dir / "examples.parquet")


def test_majority_baseline_scores_what_its_formula_predicts(medqaro_prepared, tmp_path):
    ex = _examples(medqaro_prepared)
    train, test = ex[ex.split == "train"], ex[ex.split == "test"]
    (majority, count), (_, second) = Counter(train["answer"]).most_common(2)
    assert count > second  # no tie on the synthetic data
    out = tmp_path / "majority.jsonl"
    res = runner.invoke(app, ["baseline", "--data", str(medqaro_prepared), "--kind", "majority",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(test) and {r["prediction"] for r in rows} == {majority}

    scored = _score("-p", str(out), "--data", str(medqaro_prepared), "--by", "question_type")
    # Independent formulas: EM = share of answers normalising to the majority answer; the
    # set F1 of a one-token prediction against an answer of L tokens containing it is 2/(L+1).
    norm = [normalize_medqaro(a).split() for a in test["answer"]]
    target = normalize_medqaro(majority)
    em = sum(" ".join(t) == target for t in norm) / len(test)
    f1 = sum(2 / (len(t) + 1) if target in t else 0.0 for t in norm) / len(test)
    assert scored["metrics"]["em"]["mean"] == pytest.approx(em)
    assert scored["metrics"]["f1"]["mean"] == pytest.approx(f1)
    assert scored["metrics"]["f1"]["mean"] == pytest.approx(
        sum(f1_medqaro(majority, a) for a in test["answer"]) / len(test))
    assert scored["splits"] == ["test"] and scored["how"]["ci"]["unit"] == "patient"
    assert scored["n_clusters"] == test["patient_id"].nunique()
    assert set(scored["by"]["question_type"]) == set(test["question_type"])


def test_cis_narrow_as_n_grows(medqaro_prepared, tmp_path):
    widths = {}
    for split in ("test", "train"):
        out = tmp_path / f"{split}.jsonl"
        res = runner.invoke(app, ["baseline", "--data", str(medqaro_prepared), "--kind",
                                  "majority", "--split", split, "--out", str(out)])
        assert res.exit_code == 0, res.output
        m = _score("-p", str(out), "--data", str(medqaro_prepared))["metrics"]["em"]["ci95"]
        widths[split] = m[1] - m[0]
    n = _examples(medqaro_prepared)["split"].value_counts()
    assert n["train"] > 2 * n["test"]
    assert widths["train"] < widths["test"]


def test_missing_split_predictions_are_reported(medqaro_prepared, tmp_path):
    out = tmp_path / "partial.jsonl"
    runner.invoke(app, ["baseline", "--data", str(medqaro_prepared), "--kind", "majority",
                        "--out", str(out)])
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:-1]) + "\n")
    res = runner.invoke(app, ["score", "-p", str(out), "--data", str(medqaro_prepared)])
    assert res.exit_code == 2 and "no prediction for reference id" in res.stderr


def test_mcq_scoring_on_prepared_robiology(robiology_prepared, tmp_path):
    ex = _examples(robiology_prepared)
    test = ex[ex.split == "test"]
    out = tmp_path / "random.jsonl"
    res = runner.invoke(app, ["baseline", "--data", str(robiology_prepared), "--kind",
                              "random", "--seed", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    scored = _score("-p", str(out), "--data", str(robiology_prepared),
                    "--by", "grade,stage,has_image")
    assert scored["mode"] == "mcq" and scored["n"] == len(test)
    assert scored["n_nonconforming"] == 0
    for kind, block in scored["per_kind"].items():
        part = test[test.kind == kind]
        expected = sum(random_expected_accuracy(kind, len(o)) for o in part["options"]) / len(part)
        assert block["random_expected_accuracy"] == pytest.approx(expected)
    assert set(scored["by"]) == {"grade", "stage", "has_image"}
    assert sum(b["n"] for b in scored["by"]["stage"].values()) == len(test)


def test_mcq_references_jsonl_and_group_as_multiple(tmp_path):
    stmts = [{"label": str(i), "text": f"afirmația {i}"} for i in range(1, 5)]
    refs = _jsonl(tmp_path / "r.jsonl", [
        {"id": "1", "kind": "single", "options": ["x", "y", "z", "w"], "answer": "B"},
        {"id": "2", "kind": "multiple", "options": list("abcde"), "answer": "ACD"},
        {"id": "3", "kind": "group", "options": stmts, "answer": ["C"]},
    ])
    preds = tmp_path / "p.parquet"  # Parquet predictions are read too
    pd.DataFrame({"id": ["1", "2", "3"],
                  "prediction": ["Răspuns: B", "A, C, D", "2, 4"]}).to_parquet(preds)
    plain = _score("-p", str(preds), "--references", str(refs))
    assert plain["n_nonconforming"] == 1  # "2, 4" is not a group letter
    assert plain["per_kind"]["group"]["metrics"]["accuracy"]["mean"] is None
    mapped = _score("-p", str(preds), "--references", str(refs),
                    "--group-as-multiple", "heuristic")
    assert mapped["n_nonconforming"] == 0 and mapped["metrics"]["accuracy"]["mean"] == 1.0
