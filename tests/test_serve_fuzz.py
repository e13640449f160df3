"""Schema-driven fuzzing of the running Serve app: hypothesis bodies built from the pydantic
request models (every field, its type, its literals, nested options; values in and out of
the constraints, lone surrogates included) and arbitrary JSON for the OpenAI routes. No
answer may be a 5xx; every error is an OpenAI-shaped JSON body; the service is ready after.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from medray.serving.schemas import MCQRequest, QARequest

TEXT = st.text(max_size=60) | st.text(st.characters(categories=["Cs", "Zs", "Cc"]), max_size=4)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=12,
)
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))
OPENAI_FIELDS = {
    "/v1/completions": ["prompt", "max_tokens", "n", "logprobs", "echo", "stop", "model",
                        "temperature", "stream", "prompt_logprobs", "top_p", "seed"],
    "/v1/chat/completions": ["messages", "max_tokens", "logprobs", "top_logprobs", "model",
                             "n", "stream", "temperature"],
}


def values(annotation: Any) -> st.SearchStrategy:
    """Values for a field's type: mostly of the type, sometimes just any JSON."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return bodies(annotation)
    if origin is typing.Literal:
        return st.sampled_from(args) | TEXT
    if origin in (typing.Union, types.UnionType):
        return st.one_of([values(a) for a in args])
    if origin is list:
        return st.lists(values(args[0]), max_size=12) | JSON
    if annotation is type(None):
        return st.none()
    if annotation is str:
        return TEXT | st.sampled_from(["ft", "medray", "medray-ft", "medray:ft", "A", "B"])
    if annotation is int:
        return st.integers(-5, 5000) | st.integers()
    return JSON


def bodies(model: type[BaseModel]) -> st.SearchStrategy:
    fields = model.model_fields
    required = {k: values(f.annotation) for k, f in fields.items() if f.is_required()}
    optional = {k: values(f.annotation) for k, f in fields.items() if not f.is_required()}
    return st.fixed_dictionaries(required, optional=optional)


WORDS = st.text("abcdefghij ăîșț?", min_size=1, max_size=80).filter(str.strip)
# Bodies inside the constraints too, so the fuzzer also reaches the model, not only the
# validators (arbitrary option lists are almost never valid).
VALID = {
    MCQRequest: st.fixed_dictionaries({
        "question": WORDS,
        "options": st.integers(2, 6).flatmap(lambda n: st.tuples(*[
            st.fixed_dictionaries({"label": st.just("ABCDEF"[i]), "text": WORDS})
            for i in range(n)]).map(list)),
    }, optional={"kind": st.sampled_from(["single", "group", "multiple"]),
                 "adapter": st.sampled_from(["ft", "nope"]),
                 "model": st.sampled_from(["medray", "medray-ft", "x"])}),
    QARequest: st.fixed_dictionaries({"question": WORDS, "context": st.text(max_size=400)},
                                     optional={"strategy": st.sampled_from(
                                         ["trim", "chunks", "retrieve"]),
                                               "context_tokens": st.integers(16, 300),
                                               "adapter": st.sampled_from(["ft", "nope"]),
                                               "model": st.sampled_from(["medray-ft", "x"])}),
}


def _post(client: httpx.Client, path: str, body: Any) -> None:
    # json.dumps escapes lone surrogates, so they reach the server as JSON allows them.
    r = client.post(path, content=json.dumps(body), headers={"Content-Type":
                                                              "application/json"})
    assert r.status_code < 500, r.text[:500]
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["code"] == r.status_code and err["message"] and err["type"]


@pytest.mark.parametrize("model,path", [(QARequest, "/v1/qa"), (MCQRequest, "/v1/mcq")])
def test_model_driven_bodies_never_5xx(client, model, path):
    @FUZZ
    @given(body=bodies(model) | VALID[model])
    def run(body):
        _post(client, path, body)

    run()


@pytest.mark.parametrize("path", sorted(OPENAI_FIELDS))
def test_openai_route_bodies_never_5xx(client, path):
    @FUZZ
    @given(body=JSON | st.dictionaries(st.sampled_from(OPENAI_FIELDS[path]), JSON, max_size=6))
    def run(body):
        _post(client, path, body)

    run()
    assert client.get("/readyz").status_code == 200
