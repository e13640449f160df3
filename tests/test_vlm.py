"""Local vision-language models answer image items: the tiny VLM (`medray model tiny-vlm`,
the SmolVLM architecture, random init, built offline) evaluates a small EuropeMedQA set
with images through the hf and vllm engines: none skipped, the same answers from both,
n_images_sent per item, and `report --by modality` splits text and image items. A
text-only model still skips the image items. Heavy (torch, vLLM): run under flock; ~90 s."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image
from typer.testing import CliRunner

from medray.cli import app

runner = CliRunner()


def _png(color: tuple[int, int, int], size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def vlm_data(tmp_path_factory) -> Path:
    """Six items: three text-only, two with one image, one with two (different sizes)."""
    raw = tmp_path_factory.mktemp("vlm_raw")
    (raw / "images").mkdir()
    images = {"a.png": _png((220, 20, 20), (40, 30)), "b.png": _png((20, 220, 20), (16, 48)),
              "c.png": _png((20, 20, 220), (64, 64))}
    for name, data in images.items():
        (raw / "images" / name).write_bytes(data)
    links = [[], ["images/a.png"], [], ["images/b.png", "images/c.png"], [], ["images/c.png"]]
    records = [{"id": f"IT000{i + 1}", "question": f"Domanda {i + 1}: quale risposta?",
                "options": [{"letter": x, "text": t} for x, t in
                            zip("ABCD", ["uno", "due", "tre", "quattro"], strict=True)],
                "correct_answer": {"letter": "ABCD"[i % 4]}, "has_image": bool(link),
                "images": link, "metadata": {"test_year": 2022}}
               for i, link in enumerate(links)]
    (raw / "questions.json").write_text(json.dumps(records))
    out = tmp_path_factory.mktemp("vlm_data") / "data"
    res = runner.invoke(app, ["data", "prepare", "-d", "europemedqa", "-i", str(raw),
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny_vlm") / "model"
    res = runner.invoke(app, ["model", "tiny-vlm", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "medray_tiny.json").read_text())["kind"] == "tiny-vlm"
    return out


def _eval(engine: str, data: Path, out: Path) -> list[dict]:
    res = runner.invoke(app, ["eval", "--engine", engine, "--data", str(data),
                              "--output", str(out)])
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def test_tiny_vlm_answers_image_items_alike_on_hf_and_vllm(ray_session, tiny_vlm, vlm_data,
                                                           tmp_path):
    n_images = {"IT0001": 0, "IT0002": 1, "IT0003": 0, "IT0004": 2, "IT0005": 0, "IT0006": 1}
    runs = {"hf": tmp_path / "hf", "vllm": tmp_path / "vllm"}
    answers = {}
    for kind, run in runs.items():
        rows = _eval(f"{kind}:{tiny_vlm}", vlm_data, run)
        assert {r["id"]: r["n_images_sent"] for r in rows} == n_images, kind
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
