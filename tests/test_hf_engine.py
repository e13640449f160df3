"""The transformers Engine against a hand-written greedy loop on the tiny model (~15 s)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def engine(tiny_model):
    from medray.engines.hf import HFEngine

    return HFEngine(str(tiny_model), dtype="fp32", batch_size=4)


def _manual_greedy(lm, ids, n):
    import torch

    ids = list(ids)
    out, lps = [], []
    with torch.no_grad():
        for _ in range(n):
            logp = lm(input_ids=torch.tensor([ids])).logits[0, -1].log_softmax(-1)
            nxt = int(logp.argmax())
            out.append(nxt)
            lps.append(float(logp[nxt]))
            ids.append(nxt)
    return out, lps


def test_protocol_and_greedy_matches_manual_loop(engine):
    from medray.engines.base import Engine

    assert isinstance(engine, Engine) and engine.name == "hf"
    prompts = ["Intrebare: Are pacienta metastaze? Context: pacienta Raspuns:",
               "Context: scurt Intrebare: Ce stadiu? Raspuns:"]  # different lengths: padding
    gens = engine.generate(prompts, max_new_tokens=5)
    tok = engine.tokenizer
    for p, g in zip(prompts, gens, strict=True):
        ids = tok(p)["input_ids"]
        expected, lps = _manual_greedy(engine.lm, ids, 5)
        if tok.eos_token_id in expected:
            cut = expected.index(tok.eos_token_id)
            expected, lps = expected[:cut], lps[:cut]
        assert g.token_ids == expected  # left padding does not change greedy tokens
        assert g.logprobs == pytest.approx(lps, abs=1e-4)
        assert g.prompt_tokens == len(ids)
        assert g.text == tok.decode(expected, skip_special_tokens=True).strip()
        assert p not in g.text  # only new tokens are decoded


def test_score_options_sums_continuation_logprobs(engine):
    import torch

    tok = engine.tokenizer
    prompt = "Intrebare: Are pacienta metastaze? Raspuns:"
    scores = engine.score_options(prompt, [" Da", " Nu, nu are"])
    assert [s.n_chars for s in scores] == [3, 11]
    ctx = tok(prompt)["input_ids"]
    for cont, s in zip([" Da", " Nu, nu are"], scores, strict=True):
        whole = tok(prompt + cont)["input_ids"]
        assert whole[: len(ctx)] == ctx
        with torch.no_grad():
            logp = engine.lm(input_ids=torch.tensor([whole])).logits[0].log_softmax(-1)
        manual = sum(float(logp[i - 1, whole[i]]) for i in range(len(ctx), len(whole)))
        assert s.n_tokens == len(whole) - len(ctx)
        assert s.logprob == pytest.approx(manual, abs=1e-4) and s.logprob < 0
