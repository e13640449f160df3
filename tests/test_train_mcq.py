"""Multiple-choice fine-tuning through `medray train` (Ray Train, 2 CPU workers, DeepSpeed
ZeRO-2, PEFT LoRA) on synthetic RoBiology, at reduced size; then the adapter evaluated by the
existing MCQ path with no prompt restated. Budget on 2 cores: ~2.5 min.

The examples themselves (prompt = evaluation's, loss on key + EOS only) are checked without
Ray first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from medray.cli import app

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def robio_model(robiology_prepared, tmp_path_factory) -> Path:
    from medray.models import build_tiny_model, corpus_from_prepared

    out = tmp_path_factory.mktemp("robio_model") / "model"
    return build_tiny_model(out, corpus_from_prepared(robiology_prepared), seed=0)


def _config(model: Path, data: Path, overrides: list[str]):
    from medray.train.config import load_config

    return load_config(ROOT / "configs" / "tiny-robiology-cpu.yaml",
                       [f"model.name_or_path={model}", f"data.path={data}", *overrides])


def test_examples_are_the_evaluation_prompt_plus_the_key(robio_model, robiology_prepared):
    from medray.data.prepared import load_prepared
    from medray.eval.mcq import example_dict, prompt_text, render
    from medray.models import load_tokenizer
    from medray.tokenization import IGNORE_INDEX, BudgetError
    from medray.train import mcq

    cfg = _config(robio_model, robiology_prepared, [])
    tok = load_tokenizer(str(robio_model))
    items = load_prepared(robiology_prepared).split("train").sort_values("id")
    frame = mcq.examples_frame(tok, items, cfg.prompt)
    assert len(frame) == len(items)
    for record, row in zip(items.to_dict("records"), frame.itertuples(), strict=True):
        ex = example_dict(record)
        prompt = tok.encode(prompt_text(render(ex), tok, cfg.prompt), add_special_tokens=True)
        target = [int(t) for t in row.labels if t != IGNORE_INDEX]
        assert list(row.input_ids) == prompt + target  # what evaluation asks, then the key
        assert list(row.labels[: len(prompt)]) == [IGNORE_INDEX] * len(prompt)
        assert tok.decode(target, skip_special_tokens=True) == "".join(sorted(ex["answer"]))
        assert target[-1] == tok.eos_token_id
    kinds = set(items["kind"])
    assert kinds == {"single", "group", "multiple"}
    # a budget that cannot hold an item fails by id: an MCQ prompt is never cut
    with pytest.raises(BudgetError, match="cannot hold item"):
        mcq.examples_frame(tok, items, cfg.prompt.model_copy(update={"context_tokens": 64}))
    # the reader is evaluation's: a right key scores, prose does not conform
    val = mcq.val_generate_items(tok, items.head(3), cfg.prompt)
    pairs = [(v["mcq"], "".join(v["mcq"]["answer"])) for v in val[:2]] + [(val[2]["mcq"], "?")]
    scores = mcq.accuracy(pairs)
    assert scores["val_accuracy"] == pytest.approx(2 / 3)
    assert scores["val_conforming"] == pytest.approx(2 / 3)


def test_mcq_fine_tuning_runs_and_is_evaluated_by_the_mcq_path(
        ray_session, robio_model, robiology_prepared, tmp_path):
    out = tmp_path / "train"
    res = CliRunner().invoke(app, [
        "train", "--config", str(ROOT / "configs" / "tiny-robiology-cpu.yaml"),
        "--output", str(out), f"model.name_or_path={robio_model}",
        f"data.path={robiology_prepared}", "optim.epochs=2", "optim.eval_every_steps=4",
        "data.val_generate_examples=12"])
    assert res.exit_code == 0, res.output
    assert "multiple-choice examples" in res.output and "val_accuracy" in res.output
    m = json.loads((out / "metrics.json").read_text())
    steps = m["plan"]["total_steps"]
    assert steps == 24  # 90 items: 45 per worker, 4 per micro-batch, two epochs
    # (one epoch, 12 steps, is too few for the tiny model to answer with letters at all)
    evaluations = m["evaluations"]
    assert [e["step"] for e in evaluations] == list(range(4, steps, 4))
    for record in [m["initial"], *evaluations, *m["epochs"]]:
        assert 0.0 <= record["val_accuracy"] <= 1.0 and record["val_generated"] == 12
        assert {"val_accuracy_single", "val_accuracy_group", "val_accuracy_multiple"} <= set(
            record), record
        assert 0.0 <= record["val_conforming"] <= 1.0
    assert "all-correct rule" in m["how"]
    # the exported adapter is the best checkpoint by val_accuracy
    exported = m["exported"]["record"]
    assert exported["val_accuracy"] == max(r["val_accuracy"] for r in [*evaluations,
                                                                        *m["epochs"]])
    assert (out / "adapter" / "prompt.json").is_file()

    # evaluated by the existing MCQ path: the prompt comes from the adapter's prompt.json
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": str(robiology_prepared), "split": "test",
        "engine": {"kind": "hf", "model": str(robio_model), "adapter": str(out / "adapter")},
        "score": {"resamples": 50}}))
    res = CliRunner().invoke(app, ["eval", "-c", str(cfg), "-o", str(tmp_path / "eval")])
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert saved["run"]["n"] == 24 and saved["metrics"]["mcq"]["n"] == 24
    assert saved["run"]["prompt_spec"]["context_tokens"] == 640  # the trained prompt, not restated
    assert saved["metrics"]["mcq"]["n_conforming"] > 0  # it answers in the protocol's form
