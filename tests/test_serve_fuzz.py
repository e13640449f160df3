"""Inputs the schema-driven fuzzer (tests/test_serve_schema.py, schemathesis) does not make:
lone surrogates (JSON allows "\\ud800"; no tokenizer takes it), bodies over the byte limit,
JSON nested past the parser's depth, numbers past 64 bits. Each gets an OpenAI-shaped 4xx on
every POST route, and the service is ready after.
"""

from __future__ import annotations

import json

import pytest

QA = {"question": "Care este stadiul?", "context": "Pacienta are stadiul IIA."}
MCQ = {"question": "Ce produce ATP?", "options": [{"label": "A", "text": "mitocondria"},
                                                  {"label": "B", "text": "nucleul"}]}
COMPLETION = {"prompt": "Intrebare: Da sau Nu?", "max_tokens": 1}
CHAT = {"messages": [{"role": "user", "content": "Buna ziua"}], "max_tokens": 1}
VALID = {"/v1/qa": QA, "/v1/mcq": MCQ, "/v1/completions": COMPLETION,
         "/v1/chat/completions": CHAT}
SURROGATE = "\ud800"


def _strings(value, path=()):
    """Paths of every string in a body (dict keys and list indices)."""
    if isinstance(value, str):
        yield path
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, (*path, i))


def _with(body, path, text):
    body = json.loads(json.dumps(body))
    holder = body
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = text
    return body


def _post(client, path, content: bytes | str):
    return client.post(path, content=content, headers={"Content-Type": "application/json"})


def _error(r, status):
    assert r.status_code == status, r.text[:300]
    err = r.json()["error"]
    assert err["code"] == status and err["message"] and err["type"]
    return err


@pytest.mark.parametrize("path", sorted(VALID))
def test_lone_surrogates_anywhere_are_a_400(client, path):
    assert client.post(path, json=VALID[path]).status_code == 200
    for where in _strings(VALID[path]):
        for text in (SURROGATE, f"ok {SURROGATE} ok", "\udfff\ud800"):
            # json.dumps writes the surrogate as an escape, as a client's JSON may carry it.
            r = _post(client, path, json.dumps(_with(VALID[path], where, text)))
            assert _error(r, 400)["type"] == "invalid_text", (where, text)
    r = _post(client, path, json.dumps({**VALID[path], SURROGATE: 1}))  # in a key
    assert _error(r, 400)["type"] == "invalid_text"


@pytest.mark.parametrize("path", sorted(VALID))
def test_huge_and_deep_inputs_are_4xx(client, serve_app, path):
    limit = serve_app[2].max_body_bytes
    big = json.dumps({**VALID[path], "padding": "x" * (limit + 1)})
    assert _error(_post(client, path, big), 413)["type"] == "request_too_large"
    deep = "[" * 100_000 + "]" * 100_000  # past the JSON parser's recursion depth
    assert _error(_post(client, path, deep), 400)["type"] == "invalid_json"
    nested = json.dumps({**VALID[path], "extra": json.loads("[" * 500 + "]" * 500)})
    assert _post(client, path, nested).status_code in (400, 422)  # an unknown field
    huge_int = json.dumps(VALID[path])[:-1] + ', "n": ' + "9" * 4000 + "}"
    assert _post(client, path, huge_int).status_code in (400, 422)
    assert client.get("/readyz").status_code == 200
