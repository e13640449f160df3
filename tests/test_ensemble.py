"""Majority vote over runs: the tie rule, abstentions, and the ensemble row. Budget: ~5 s."""

from __future__ import annotations

import json

import pytest
from fakes import ScriptedEngine
from typer.testing import CliRunner

from medray.cli import app
from medray.data.prepared import load_prepared
from medray.eval.config import engine_config
from medray.eval.ensemble import TIE_RULE, majority_vote, vote
from medray.eval.runner import run_eval
from medray.prompts.text import format_question_text


def test_vote_rules():
    a, b, c = ("A",), ("B",), ("A", "C")
    assert vote([a, b, a]) == (a, False)
    assert vote([b, a, None]) == (b, True)  # tie: the earliest listed run wins
    assert vote([None, a, b]) == (a, True)
    assert vote([c, c, a]) == (c, False)  # a multi-answer set is one vote unit
    assert vote([None, None]) == (None, False)  # everyone abstained


def test_majority_vote_row(robiology_prepared, tmp_path):
    data = load_prepared(robiology_prepared)
    items = data.split("test")
    # the scripted engine sees only the prompt, so it decides per question text; the corpus
    # plants exact duplicates, which share a text and therefore an answer
    text = {r["id"]: format_question_text(r["question"], list(r["options"]))
            for _, r in items.iterrows()}
    key = {text[r["id"]]: "".join(r["answer"]) for _, r in items.iterrows()}
    texts = sorted(set(text.values()), key=lambda t: min(i for i in text if text[i] == t))

    def wrong(k):
        return "A" if k != "A" else "B"

    def engine_for(bad_texts, junk_texts=()):
        def answer(prompt):
            q = next(t for t in texts if t in prompt)
            if q in junk_texts:
                return "no idea"
            return wrong(key[q]) if q in bad_texts else key[q]
        return ScriptedEngine(answer)

    def n_items(some_texts):
        return sum(text[i] in some_texts for i in text)

    third = len(texts) // 3
    # each run is wrong on a different third, so the majority is right everywhere except
    # where two runs are wrong together (none) -> 100%; run 3 abstains on its third instead.
    specs = [set(texts[:third]), set(texts[third:2 * third]), set()]
    junk = set(texts[2 * third:])
    runs = []
    for n, bad in enumerate(specs):
        out = tmp_path / f"run{n}"
        run_eval(engine_config("hf:scripted", robiology_prepared), out,
                 engine=engine_for(bad, junk if n == 2 else ()))
        runs.append(out)
    m = majority_vote(runs, robiology_prepared, tmp_path / "ens")
    assert m["row"] == "ensemble: majority vote of 3 runs" and m["tie_rule"] == TIE_RULE
    # items in the last third: runs 0 and 1 both right (2 votes) -> right.
    # first third: run 0 wrong, runs 1 and 2 right -> right; second third likewise.
    score = m["metrics"]["mcq"]  # the same metrics.json schema as `medray eval`
    assert score["metrics"]["accuracy"]["mean"] == 1.0 and score["n"] == len(text)
    rows = [json.loads(x) for x in (tmp_path / "ens" / "predictions.jsonl").read_text().split("\n")
            if x]
    assert {r["engine"] for r in rows} == {"ensemble"} and len(rows) == len(text)
    # with only runs 0 and 1, items in their wrong thirds tie 1:1 -> run 0's answer wins
    m2 = majority_vote(runs[:2], robiology_prepared, tmp_path / "ens2")
    assert m2["n_ties"] == n_items(specs[0] | specs[1])
    assert m2["metrics"]["mcq"]["metrics"]["accuracy"]["mean"] == pytest.approx(
        (len(text) - n_items(specs[0])) / len(text))
    with pytest.raises(ValueError, match="at least 2"):
        majority_vote(runs[:1], robiology_prepared, tmp_path / "ens3")
    # the same through the CLI
    result = CliRunner().invoke(app, ["ensemble", *map(str, runs), "--data",
                                      str(robiology_prepared), "--output", str(tmp_path / "e4")])
    assert result.exit_code == 0, result.output
    assert "majority vote of 3 runs" in result.output and "accuracy 1.0000" in result.output
    bad = CliRunner().invoke(app, ["ensemble", str(runs[0]), "--data", str(robiology_prepared),
                                   "--output", str(tmp_path / "e5")])
    assert bad.exit_code == 2 and "at least 2" in bad.output
