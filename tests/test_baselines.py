"""Baselines: random token selector (whitespace and HF tokenizer), majority, MCQ guessing.

Budget: ~10 s (a tiny BPE tokenizer is trained on the synthetic epicrises).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from medray.cli import app
from medray.data.prepared import load_prepared
from medray.data.schema import GROUP_CODES
from medray.eval.baselines import (
    majority_answer,
    mcq_majority_predictions,
    mcq_random_predictions,
    random_token_predictions,
)

runner = CliRunner()


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _is_window(words: list[str], span: list[str], limit: int) -> bool:
    return any(words[i:i + len(span)] == span for i in range(0, max(0, limit - len(span)) + 1))


def test_random_token_selector_whitespace(medqaro_prepared, tmp_path):
    data = load_prepared(medqaro_prepared)
    out = tmp_path / "rt.jsonl"
    args = ["baseline", "--data", str(medqaro_prepared), "--kind", "random-token",
            "--tokens", "8", "--seed", "3", "--out", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    rows = _read(out)
    test = data.split("test")
    assert [r["id"] for r in rows] == test["id"].tolist()
    assert all(r["tokenizer"] == "whitespace" and r["context_tokens"] == 8 for r in rows)
    for row, cid in zip(rows, test["context_id"], strict=True):
        words = data.context(cid).split()
        span = row["prediction"].split()
        assert 1 <= len(span) <= 3
        assert _is_window(words[:8], span, 8)  # drawn from the first N tokens only
    again = tmp_path / "rt2.jsonl"
    runner.invoke(app, args[:-1] + [str(again)])
    assert _read(again) == rows  # seeded
    other = random_token_predictions(test, data.context, tokens=8, seed=4)
    assert [r["prediction"] for r in other] != [r["prediction"] for r in rows]


def test_random_token_selector_start_is_uniform_over_budget():
    ctx = " ".join(f"w{i}" for i in range(5000))
    ex = pd.DataFrame({"id": [f"t:{i}" for i in range(3000)], "context_id": ["c"] * 3000})
    rows = random_token_predictions(ex, lambda _c: ctx, tokens=1024, seed=0)
    starts = [int(r["prediction"].split()[0][1:]) for r in rows]
    lengths = {len(r["prediction"].split()) for r in rows}
    assert max(starts) < 1024 and min(starts) == 0 and lengths == {1, 2, 3}
    assert 400 < sum(s < 512 for s in starts) / 3 < 600  # about half in each half
    short = random_token_predictions(ex.head(50), lambda _c: "a b c", tokens=2048, seed=0)
    assert all(set(r["prediction"].split()) <= {"a", "b", "c"} for r in short)  # clipped


def test_random_token_selector_with_hf_tokenizer(medqaro_prepared, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    data = load_prepared(medqaro_prepared)
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(data.contexts["text"].tolist(),
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"]))
    path = tmp_path / "tok"
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(path)
    test = data.split("test").head(20)
    rows = random_token_predictions(test, data.context, tokens=16, seed=0, tokenizer=str(path))
    hf = PreTrainedTokenizerFast.from_pretrained(path)
    for row, cid in zip(rows, test["context_id"], strict=True):
        assert row["tokenizer"] == str(path)
        ids = hf(data.context(cid), add_special_tokens=False)["input_ids"][:16]
        windows = {hf.decode(ids[i:i + n]).strip() for n in (1, 2, 3) for i in range(len(ids))}
        assert row["prediction"] in windows


def test_majority_answer_and_tie_break():
    assert majority_answer(pd.DataFrame({"answer": ["Nu", "Da", "Nu", "3"]})) == "Nu"
    assert majority_answer(pd.DataFrame({"answer": ["Nu", "Da"]})) == "Da"  # tie: smallest
    with pytest.raises(ValueError):
        majority_answer(pd.DataFrame({"answer": []}))


def test_majority_on_synthetic_train_is_nu(medqaro_prepared):
    data = load_prepared(medqaro_prepared)
    assert majority_answer(data.split("train")) == "Nu"  # as on the real data


def test_mcq_baselines_are_valid_and_seeded(robiology_prepared):
    data = load_prepared(robiology_prepared)
    test, train = data.split("test"), data.split("train")
    rand = mcq_random_predictions(test, seed=0)
    assert rand == mcq_random_predictions(test, seed=0)
    for row, kind, opts in zip(rand, test["kind"], test["options"], strict=True):
        labels = {o["label"] for o in opts}
        if kind == "group":
            assert row["prediction"] in GROUP_CODES
        else:
            assert row["prediction"] and set(row["prediction"]) <= labels
            assert kind == "multiple" or len(row["prediction"]) == 1
    maj = mcq_majority_predictions(test, train)
    by_kind = {}
    for kind, part in train.groupby("kind"):
        counts = part["answer"].map(lambda a: "".join(sorted(a))).value_counts()
        by_kind[kind] = sorted(counts[counts == counts.max()].index)[0]
    assert [r["prediction"] for r in maj] == [by_kind[k] for k in test["kind"]]


def test_baseline_bad_kind_exits_2_and_writes_nothing(medqaro_prepared, tmp_path):
    out = tmp_path / "x.jsonl"
    res = runner.invoke(app, ["baseline", "--data", str(medqaro_prepared), "--kind", "oracle",
                              "--out", str(out)])
    assert res.exit_code == 2 and "oracle" in res.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []
    res = runner.invoke(app, ["baseline", "--data", str(tmp_path / "nope"), "--kind",
                              "majority", "--out", str(out)])
    assert res.exit_code == 2
