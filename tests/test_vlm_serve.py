"""Serve with a vision-language model: the tiny VLM (`medray model tiny-vlm`) behind the
ingress, beside the tiny text-only model. The EuropeMedQA image items evaluated through
/v1/mcq (serve engine) get the same answers as the offline vLLM engine, with the same
n_images_sent; a text-only served model still skips them; bad images over HTTP are 4xx
JSON errors naming the field. Heavy (two vLLM replicas): run under flock; ~2 min."""

from __future__ import annotations

import base64
import json
import os
import socket
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import VLM_IMAGES, png_bytes
from typer.testing import CliRunner

from medray.cli import app

APP = "vlm"
MAX_IMAGE_BYTES = 4096


def _url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="module")
def vlm_app(ray_session, tiny_vlm, tiny_model):
    """The VLM as `medray` and the tiny text-only model as `text`, small KV caches."""
    from ray import serve
    from ray.serve.context import _get_global_client

    from medray.serve.app import build_app
    from medray.serve.config import AppConfig

    cfg = AppConfig(model=str(tiny_vlm), models={"text": str(tiny_model)}, device="cpu",
                    api_keys_env=None, require_auth=False, max_image_bytes=MAX_IMAGE_BYTES,
                    engine_kwargs={"kv_cache_memory_bytes": 2**27})
    started = _get_global_client(raise_if_no_controller_running=False) is None
    with socket.socket() as s:  # a free port, unless Serve already runs (then its port)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(cfg), name=APP, route_prefix=f"/{APP}")
    http = _get_global_client().http_config
    try:
        yield f"http://{http.host}:{http.port}/{APP}"
    finally:
        # Serve started here stops here: a later session app starts it on its own port.
        serve.shutdown() if started else serve.delete(APP)


@pytest.fixture(scope="module")
def client(vlm_app):
    with httpx.Client(base_url=vlm_app, timeout=300) as c:
        yield c


def _rows(run: Path) -> dict[str, dict]:
    rows = [json.loads(x) for x in (run / "predictions.jsonl").read_text().splitlines()]
    return {r["id"]: r for r in rows}


def _eval(engine: dict, data: Path, out: Path) -> dict:
    cfg = out.parent / f"{out.name}.yaml"
    cfg.write_text(yaml.safe_dump({"data": str(data), "engine": engine}))
    res = CliRunner().invoke(app, ["eval", "-c", str(cfg), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads((out / "metrics.json").read_text())["metrics"]["mcq"]


def test_serve_answers_image_items_as_the_offline_vllm_engine(
        vlm_app, client, vlm_data, tiny_vlm_vllm_run, tmp_path):
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    assert cards["medray"]["images"] is True and cards["text"]["images"] is False
    metrics = _eval({"kind": "serve", "url": vlm_app}, vlm_data, tmp_path / "serve")
    assert metrics["n_skipped_images"] == 0
    served, offline = _rows(tmp_path / "serve"), _rows(tiny_vlm_vllm_run)
    assert {i: r["n_images_sent"] for i, r in served.items()} == VLM_IMAGES
    for item, row in offline.items():  # same prompt, same images, greedy: same answer
        assert (served[item]["raw_output"].strip(), served[item]["prediction"]) == (
            row["raw_output"].strip(), row["prediction"]), item
    # A text-only served model is not asked the image items (said in the metrics).
    metrics = _eval({"kind": "serve", "url": vlm_app, "model": "text"}, vlm_data,
                    tmp_path / "text")
    assert metrics["n_skipped_images"] == 3
    assert sorted(_rows(tmp_path / "text")) == ["IT0001", "IT0003", "IT0005"]


MCQ = {"dataset": "europemedqa", "question_id": "IT0002", "question": "Domanda?",
       "options": [{"label": x, "text": t} for x, t in zip("AB", ["uno", "due"], strict=True)]}
PNG = png_bytes((200, 10, 10), (24, 24))
NOISE = png_bytes((0, 0, 0), (2, 2))[:8] + os.urandom(MAX_IMAGE_BYTES)  # too large


@pytest.mark.parametrize(("images", "status", "param", "says"), [
    (["data:image/png;base64,!!not-base64!!"], 422, "images.0", "base64"),
    ([_url(b"just some text, not an image")], 422, "images.0", "not a PNG"),
    ([_url(PNG, "image/jpeg")], 422, "images.0", "declared image/jpeg"),
    ([_url(PNG[:40])], 422, "images.0", "does not decode"),
    ([_url(PNG), _url(NOISE)], 413, "images.1", "at most 4096"),
    ([_url(PNG)] * 5, 422, "images", "at most 4"),
    (["https://example.com/x.png"], 422, "images.0", "pattern"),
])
def test_mcq_refuses_bad_images_with_a_4xx_naming_the_image(client, images, status, param,
                                                            says):
    r = client.post("/v1/mcq", json={**MCQ, "images": images})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["param"] == param and says in err["message"], err


def test_images_reach_only_a_vision_language_model(client):
    r = client.post("/v1/mcq", json={**MCQ, "images": [_url(PNG)]})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_tokens"] > 0
    r = client.post("/v1/mcq", json={**MCQ, "images": [_url(PNG)], "model": "text"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "images.0", r.text
    assert "text-only" in r.json()["error"]["message"]


def _chat(url: str, model: str = "medray", role: str = "user") -> dict:
    return {"model": model, "max_tokens": 2, "temperature": 0, "messages": [
        {"role": role, "content": [{"type": "image_url", "image_url": {"url": url}},
                                   {"type": "text", "text": "Domanda?"}]}]}


def test_chat_passes_image_parts_to_the_model_and_checks_them(client):
    red, blue = (_url(png_bytes(c, (32, 32))) for c in ((255, 0, 0), (0, 0, 255)))
    answers = []
    for url in (red, blue):
        r = client.post("/v1/chat/completions", json={**_chat(url), "logprobs": True})
        assert r.status_code == 200, r.text
        answers.append([c["logprob"] for c in r.json()["choices"][0]["logprobs"]["content"]])
    assert answers[0] != answers[1]  # the image reaches the model
    where = "messages.0.content.0.image_url.url"
    for body, status, says in [
        (_chat("data:image/png;base64,%%%"), 400, f"{where}: not valid base64"),
        (_chat(_url(NOISE)), 413, f"{where}: image is about"),
        (_chat(red, model="text"), 400, f"{where}: model 'text' is a text-only model"),
        (_chat("http://127.0.0.1:1/x.png"), 400, "image_url.url: String should match"),
        (_chat(red, role="system"), 400, "messages.0.system"),  # images: user messages only
    ]:
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == status, r.text
        assert says in r.json()["error"]["message"], r.text


def test_openapi_documents_images(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    images = schemas["MCQRequest"]["properties"]["images"]
    assert images["maxItems"] == 4 and images["items"]["pattern"].startswith("^data:(image/")
    assert schemas["ImagePart"]["properties"]["type"]["const"] == "image_url"
    assert "images" in schemas["ModelCard"]["properties"]


def test_a_text_only_deployment_states_and_says_it_takes_no_images():
    """No Serve needed: the request models of a deployment without a vision model."""
    from pydantic import ValidationError

    from medray.serve.openai_models import request_models
    from medray.serve.schemas import Limits

    models = request_models(Limits())
    schema = models["MCQRequest"].model_json_schema()
    assert schema["properties"]["images"]["maxItems"] == 0
    with pytest.raises(ValidationError, match="no served model takes images"):
        models["MCQRequest"].model_validate({**MCQ, "images": [_url(PNG)]})
    with pytest.raises(ValidationError, match="image_url"):
        models["ChatCompletionRequest"].model_validate(_chat(_url(PNG)))
    assert "ImagePart" not in json.dumps(models["ChatCompletionRequest"].model_json_schema())
