"""Schema-driven fuzzing of the running Serve app (hypothesis + hypothesis-jsonschema over
the request schemas in its own OpenAPI document, plus arbitrary JSON): no answer is a 5xx,
every error is an OpenAI-shaped JSON body, and the service is ready afterwards."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

ROUTES = ["/v1/qa", "/v1/mcq", "/v1/completions", "/v1/chat/completions"]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=12,
)
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def client(serve_app):
    url, key, _ = serve_app
    with httpx.Client(base_url=url, timeout=300,
                      headers={"Authorization": f"Bearer {key}"}) as c:
        yield c


@pytest.fixture(scope="module")
def schemas(client):
    doc = client.get("/openapi.json").json()
    return doc["components"]["schemas"]


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, r.text[:500]
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["code"] == r.status_code and err["message"] and err["type"]


def _bounded(schema: dict) -> dict:
    """Keep generated documents small: the fuzzer is after 5xx, not throughput."""
    out = dict(schema)
    props = {k: dict(v) for k, v in out.get("properties", {}).items()}
    for v in props.values():
        if v.get("type") == "string":
            v["maxLength"] = min(v.get("maxLength", 200), 200)
    out["properties"] = props
    return out


@pytest.mark.parametrize("name,path", [("QARequest", "/v1/qa"), ("MCQRequest", "/v1/mcq")])
def test_schema_valid_and_near_valid_bodies_never_5xx(client, schemas, name, path):
    schema = _bounded(schemas[name])
    schema = {**schema, "$defs": {k: v for k, v in schemas.items() if k != name}}
    mutate = st.dictionaries(st.sampled_from(sorted(schema["properties"])), JSON, max_size=2)

    @FUZZ
    @given(body=from_schema(schema), extra=mutate, valid=st.booleans())
    def run(body, extra, valid):
        _check(client.post(path, json=body if valid else {**body, **extra}))

    run()


@pytest.mark.parametrize("path", ROUTES)
def test_arbitrary_json_bodies_never_5xx(client, path):
    fields = {"/v1/completions": ["prompt", "max_tokens", "n", "logprobs", "echo", "stop",
                                  "model", "temperature", "stream", "prompt_logprobs"],
              "/v1/chat/completions": ["messages", "max_tokens", "logprobs", "top_logprobs",
                                       "model", "n", "stream"],
              "/v1/qa": ["question", "context", "strategy", "context_tokens", "adapter",
                         "model"],
              "/v1/mcq": ["question", "options", "kind", "adapter", "model"]}[path]

    @FUZZ
    @given(body=JSON | st.dictionaries(st.sampled_from(fields), JSON, max_size=6))
    def run(body):
        _check(client.post(path, json=body))

    run()
    assert client.get("/readyz").status_code == 200
