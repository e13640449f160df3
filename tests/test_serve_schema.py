"""The Serve app's OpenAPI document is its contract: schemathesis fuzzes the running app
(the session's: base + LoRA adapter + merged model, with auth) from /openapi.json, with valid
and invalid data on every route, and checks every answer against the document.

The run is bounded (a fixed seed, a few hundred requests). It must end with no 5xx and no
failed check, and reach a 200 on every POST route: valid data does get through.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from medray.serve.schemas import LABELS

SEED = 20261206
# Requests per operation: invalid data is answered before the engine, valid data generates
# (up to max_tokens, n and max_batch prompts), so fewer of those keep the run short. The
# coverage phase (boundary values of every keyword) is left out: it alone makes over 600.
EXAMPLES = {"negative": 40, "positive": 12}
POSTS = ["/v1/qa", "/v1/qa/batch", "/v1/mcq", "/v1/completions", "/v1/chat/completions"]
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def fuzz_run(serve_app, tmp_path_factory):
    """schemathesis CLI runs, one per generation mode: exit codes, every request and answer
    (their HAR records), the output."""
    url, key, _ = serve_app
    out = tmp_path_factory.mktemp("schemathesis")
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(TESTS / "serve_schema_hooks.py")}
    codes, entries, logs = [], [], []
    for mode, examples in EXAMPLES.items():
        cmd = [
            sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
            "--checks", "all", "--exclude-checks", "positive_data_acceptance",
            "--mode", mode, "--phases", "examples,fuzzing", "--seed", str(SEED),
            "--max-examples", str(examples), "--workers", "2", "--no-shrink",
            # Valid data may generate up to max_model_len tokens for several sequences.
            "--request-timeout", "120", "--max-response-time", "120",
            "--suppress-health-check", "all",
            "--header", f"Authorization: Bearer {key}",
            "--report", "har", "--report-har-path", str(out / f"{mode}.har"),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900,
                              cwd=out)
        (out / f"{mode}.txt").write_text(proc.stdout + proc.stderr)
        codes.append(proc.returncode)
        logs.append(proc.stdout[-5000:] + proc.stderr[-1000:])
        entries += json.loads((out / f"{mode}.har").read_text())["log"]["entries"]
    return codes, entries, logs


def test_schemathesis_finds_no_5xx_and_no_failed_check(fuzz_run):
    codes, entries, logs = fuzz_run
    statuses = Counter((urlparse(e["request"]["url"]).path, e["response"]["status"])
                       for e in entries)
    summary = "\n".join(f"{p} {s}: {n}" for (p, s), n in sorted(statuses.items()))
    print(f"{len(entries)} requests\n{summary}")
    assert not [k for k in statuses if k[1] >= 500], summary
    assert codes == [0, 0], "\n".join(logs)
    assert 80 <= len(entries) <= 1000, summary  # bounded, yet a real run
    for path in POSTS:  # the success path of every POST route was fuzzed
        assert statuses[path, 200] >= 1, f"{path}: no 200 in\n{summary}"


def _schema(anon: httpx.Client, name: str) -> dict:
    return anon.get("/openapi.json").json()["components"]["schemas"][name]


def test_the_document_states_the_configured_limits(serve_app):
    url, _, cfg = serve_app
    with httpx.Client(base_url=url, timeout=60) as anon:
        doc = anon.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    qa = schemas["QARequest"]["properties"]
    assert qa["context"]["maxLength"] == cfg.max_context_chars
    assert qa["question"]["maxLength"] == cfg.max_text_chars
    assert qa["context"]["pattern"] and qa["context"]["minLength"] == 1
    tokens = next(a for a in qa["context_tokens"]["anyOf"] if a.get("type") == "integer")
    assert tokens["maximum"] == min(cfg.max_context_tokens, cfg.max_model_len)
    assert set(schemas["QARequest"]["required"]) == {"question", "context"}
    assert qa["return_prompt_ids"]["type"] == "boolean"
    batch = schemas["QABatchRequest"]
    assert set(batch["required"]) == {"questions", "context"}
    questions = batch["properties"]["questions"]
    assert (questions["minItems"], questions["maxItems"]) == (1, cfg.max_questions)
    assert questions["items"]["maxLength"] == cfg.max_text_chars
    assert {k: v for k, v in batch["properties"].items() if k != "questions"} == \
        {k: v for k, v in qa.items() if k != "question"}  # the same options as /v1/qa
    completion = schemas["CompletionRequest"]
    assert "prompt" in completion["required"] and completion["additionalProperties"] is False
    n = completion["properties"]["n"]
    assert n["maximum"] == cfg.max_n
    chat = schemas["ChatCompletionRequest"]
    assert chat["properties"]["messages"]["minItems"] == 1
    assert chat["properties"]["messages"]["maxItems"] == cfg.max_batch
    # Option labels cannot repeat: at most one option per label, for each label there is.
    options = schemas["MCQRequest"]["properties"]["options"]
    rules = options["allOf"]
    assert len(rules) == len(LABELS)
    assert all(r["maxContains"] == 1 and r["minContains"] == 0 for r in rules)


def test_the_document_is_what_the_ingress_validates_with(serve_app):
    """Valid by the document and refused before, invalid by it and accepted before: each is
    now decided the same way by the schema and by the service."""
    import jsonschema_rs

    url, key, _ = serve_app
    with httpx.Client(base_url=url, timeout=300,
                      headers={"Authorization": f"Bearer {key}"}) as c:
        doc = c.get("/openapi.json").json()
        cases = [
            ("/v1/qa", "QARequest", {"question": "q", "context": "x",
                                     "return_prompt_ids": 0}, 422),
            ("/v1/qa", "QARequest", {"question": "Care?", "context": ""}, 422),
            ("/v1/qa", "QARequest", {"question": "Care?", "context": "\u0000\u0000"}, 422),
            ("/v1/qa", "QARequest", {"question": "Care?", "context": " \n\t "}, 422),
            ("/v1/qa/batch", "QABatchRequest", {"questions": ["Care?", "\u0000"],
                                                "context": "x"}, 422),
            ("/v1/qa/batch", "QABatchRequest", {"questions": ["Care?", "Ce?"],
                                                "context": "Pacienta, 54 ani."}, 200),
            ("/v1/mcq", "MCQRequest", {"question": "q", "options": [
                {"label": "A", "text": "x"}, {"label": "A", "text": "y"}]}, 422),
            ("/v1/chat/completions", "ChatCompletionRequest", {
                "messages": [{"role": "user", "content": "x"}], "tool_choice": "none",
                "tools": [{"type": "function", "function": {"name": "f", "strict": 1}}]}, 400),
            ("/v1/completions", "CompletionRequest", {"max_tokens": 1}, 400),
            ("/v1/chat/completions", "ChatCompletionRequest", {"messages": []}, 400),
            ("/v1/completions", "CompletionRequest", {"prompt": "Buna", "max_tokens": 1,
                                                      "seed": 1, "user": "u"}, 200),
            ("/v1/mcq", "MCQRequest", {"question": "Ce produce ATP?", "options": [
                {"label": "A", "text": "mitocondria"}, {"label": "B", "text": "nucleul"}]},
             200),
        ]
        for path, name, body, status in cases:
            valid = jsonschema_rs.validator_for(
                {"$ref": f"#/components/schemas/{name}", "components": doc["components"]},
            ).is_valid(body)
            r = c.post(path, json=body)
            assert r.status_code == status, (path, body, r.text)
            assert valid == (status == 200), (path, body)


def test_vllm_errors_get_openai_types():
    """Errors relayed from vLLM carry OpenAI's type for their status, not vLLM's exception
    names (BadRequestError); its server faults are the service's (503)."""
    from vllm.entrypoints.serve.engine.protocol import ErrorInfo

    from medray.serve.relay import relayed_error

    err = relayed_error(ErrorInfo(message="bad prompt", type="BadRequestError", code=400,
                                  param="prompt"))
    assert (err.status, err.kind, err.message, err.param) == (
        400, "invalid_request_error", "bad prompt", "prompt")
    err = relayed_error(ErrorInfo(message="no such LoRA", type="NotFoundError", code=404))
    assert (err.status, err.kind) == (404, "not_found_error")
    err = relayed_error(ErrorInfo(message="boom", type="InternalServerError", code=500))
    assert (err.status, err.kind) == (503, "engine_error")
