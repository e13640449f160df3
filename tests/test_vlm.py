"""Local vision-language models answer image items: the tiny VLM (`medray model tiny-vlm`,
the SmolVLM architecture, random init, built offline) evaluates a small EuropeMedQA set
with images through the hf and vllm engines: none skipped, the same answers from both,
n_images_sent per item, and `report --by modality` splits text and image items. A
text-only model still skips the image items. Heavy (torch, vLLM): run under flock; ~90 s."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from conftest import VLM_IMAGES
from PIL import Image
from typer.testing import CliRunner

from medray.cli import app

runner = CliRunner()


def _eval(engine: str, data: Path, out: Path) -> list[dict]:
    res = runner.invoke(app, ["eval", "--engine", engine, "--data", str(data),
                              "--output", str(out)])
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def test_tiny_vlm_answers_image_items_alike_on_hf_and_vllm(ray_session, tiny_vlm, vlm_data,
                                                           tiny_vlm_vllm_run, tmp_path):
    runs = {"hf": tmp_path / "hf", "vllm": tiny_vlm_vllm_run}
    answers = {}
    for kind, run in runs.items():
        rows = _eval(f"{kind}:{tiny_vlm}", vlm_data, run) if kind == "hf" else [
            json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
        assert {r["id"]: r["n_images_sent"] for r in rows} == VLM_IMAGES, kind
        # hf strips its decoded text, vLLM keeps a leading space: the same tokens
        answers[kind] = {r["id"]: (r["raw_output"].strip(), r["prediction"]) for r in rows}
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["metrics"]["mcq"]["n_skipped_images"] == 0
    assert answers["hf"] == answers["vllm"]
    # The images reach the model: the same prompt with another image scores otherwise.
    from medray.engines.hf import HFEngine

    engine = HFEngine(str(tiny_vlm))
    red, blue = (Image.new("RGB", (32, 32), c) for c in ((255, 0, 0), (0, 0, 255)))
    gens = engine.generate(["<image>Domanda?"] * 2, max_new_tokens=2, images=[[red], [blue]])
    assert gens[0].logprobs != gens[1].logprobs
    report = tmp_path / "report"
    res = runner.invoke(app, ["report", *map(str, runs.values()), "--out", str(report),
                              "--by", "modality", "--resamples", "20"])
    assert res.exit_code == 0, res.output
    by = pd.read_csv(report / "breakdown.csv")
    for run in runs:
        rows = by[(by["run"] == run) & (by["field"] == "modality")].set_index("value")
        assert set(rows.index) == {"text_only", "with_images"}, rows
        assert rows.loc["text_only", "n"] == 3 and rows.loc["with_images", "n"] == 3


def test_a_text_only_model_still_skips_image_items(tiny_model, vlm_data, tmp_path):
    rows = _eval(f"hf:{tiny_model}", vlm_data, tmp_path / "run")
    assert sorted(r["id"] for r in rows) == ["IT0001", "IT0003", "IT0005"]
    assert all(r["n_images_sent"] == 0 for r in rows)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["metrics"]["mcq"]["n_skipped_images"] == 3


def test_prompt_places_image_tokens_by_template_or_before_the_text(tiny_vlm):
    from medray.models.vision import is_vision_model, load_processor
    from medray.prompts.text import ChatPrompt, prompt_text

    processor = load_processor(str(tiny_vlm))
    prompt = ChatPrompt("Sistema.", "Domanda?")
    templated = prompt_text(prompt, processor.tokenizer, None, 2)
    assert templated.count("<image>") == 2 and templated.index("<image>") > templated.index(
        "Sistema.") and templated.endswith("Domanda?")
    assert prompt_text(prompt, None, None, 1) == "<image>Sistema.\n\nDomanda?"
    assert is_vision_model(tiny_vlm) and not is_vision_model(tiny_vlm / "nowhere")
