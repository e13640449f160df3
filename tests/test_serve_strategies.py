"""Long-context strategies without a model: chunking, voting + tie-break, BM25 retrieval."""

from __future__ import annotations

import pytest

from medray.engines.base import Generation
from medray.prompts.spec import PromptSpec
from medray.prompts.strategies import (
    bm25_select,
    finish_strategy,
    majority_vote,
    plan_strategy,
    run_strategies,
    run_strategy,
    split_chunks,
)


def _spec(strategy: str, chunk_tokens: int | None = None, reserve: int = 0) -> PromptSpec:
    return PromptSpec(strategy=strategy, context_tokens=20, chunk_tokens=chunk_tokens,
                      reserve=reserve)


def test_split_chunks_non_overlapping_and_complete():
    ids = list(range(10))
    chunks = split_chunks(ids, 4)
    assert chunks == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [t for c in chunks for t in c] == ids
    with pytest.raises(ValueError):
        split_chunks(ids, 0)


def test_majority_vote_counts_normalised_answers():
    vote = majority_vote(["Nu", "Da", " nu ", "NU"], [-3.0, -0.1, -2.0, -2.5])
    assert vote.votes == {"nu": 3, "da": 1}
    assert not vote.tied
    # Most frequent wins even though "Da" has by far the best log-prob...
    # ...and the member with the best log-prob represents the group.
    assert vote.index == 2


def test_majority_vote_tie_broken_by_mean_logprob():
    texts = ["Da", "Nu", "Da", "Nu"]
    # "Da" group mean = (-1 + -3)/2 = -2 ; "Nu" group mean = (-1.5 + -1.9)/2 = -1.7
    vote = majority_vote(texts, [-1.0, -1.5, -3.0, -1.9])
    assert vote.tied
    assert texts[vote.index] == "Nu"
    # Swap the log-probs and the other answer wins: the tie-break really decides.
    vote = majority_vote(texts, [-1.0, -2.5, -1.2, -1.9])
    assert texts[vote.index] == "Da"


def test_majority_vote_ignores_empty_answers_unless_all_empty():
    vote = majority_vote(["", "", "T2"], [-0.1, -0.1, -5.0])
    assert vote.index == 2
    assert majority_vote(["", " "], [-1.0, -0.5]).index == 1


def test_bm25_keeps_best_chunks_within_budget_in_document_order():
    chunks = [
        "pacienta prezinta tuse si febra",  # 0
        "diagnostic carcinom mamar stadiul IIA",  # 1
        "tratament cu radioterapie adjuvanta",  # 2
        "examen histopatologic carcinom mamar invaziv",  # 3
        "externare in stare buna",  # 4
    ]
    lengths = [10, 10, 10, 10, 10]
    keep = bm25_select("Care este stadiul carcinom mamar?", chunks, lengths, budget=20)
    # Chunks 1 and 3 mention the question's words; returned in document order.
    assert keep == [1, 3]
    # Budget for one chunk: only the best (1 has "stadiul" too).
    assert bm25_select("Care este stadiul carcinom mamar?", chunks, lengths, 10) == [1]
    # A chunk too long for the budget is skipped; a smaller lower-ranked one may fit.
    assert bm25_select("stadiul carcinom mamar", chunks, [30, 30, 5, 5, 5], 12) == [2, 3]


class _FakeTokenizer:
    """Whitespace tokenizer with the encode/decode surface the strategies use."""

    eos_token_id = 0
    bos_token_id = None

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {"</s>": 0}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        inv = {v: k for k, v in self.vocab.items()}
        return " ".join(inv[i] for i in ids)


def test_plans_use_the_shared_prompt_assembly():
    from medray.prompts.tokens import build_prompt_ids, encode_context

    tok = _FakeTokenizer()
    context = " ".join(f"w{i}" for i in range(40)) + " stadiul IIA carcinom"
    q = "Care este stadiul?"
    trim = plan_strategy(tok, q, context, _spec("trim", reserve=2))
    assert trim.prompts == [build_prompt_ids(tok, q, encode_context(tok, context),
                                             _spec("trim", reserve=2))]
    assert len(trim.prompts[0]) <= 18

    chunks = plan_strategy(tok, q, context, _spec("chunks", reserve=2))
    assert len(chunks.prompts) > 1 and all(len(p) <= 18 for p in chunks.prompts)

    retrieve = plan_strategy(tok, q, context, _spec("retrieve", chunk_tokens=3, reserve=2))
    (prompt,) = retrieve.prompts
    assert len(prompt) <= 18
    text = tok.decode(prompt)
    assert "IIA" in text  # BM25 found the only chunk that matches the question
    # ...which trimming (head of the epicrisis) loses.
    assert "IIA" not in tok.decode(trim.prompts[0])


def test_run_strategy_chunks_votes_over_generations():
    tok = _FakeTokenizer()
    context = " ".join(f"w{i}" for i in range(30))
    answers = iter(["Nu", "Da", "Nu"])

    def generate(prompts):
        return [Generation(text=next(answers), logprobs=[-1.0]) for _ in prompts]

    res = run_strategy(generate, tok, "Intrebare?", context, _spec("chunks", chunk_tokens=10))
    assert res.answer == "Nu" and res.votes == {"nu": 2, "da": 1}
    assert res.strategy == "chunks"
    with pytest.raises(ValueError):
        finish_strategy(plan_strategy(tok, "q", context, _spec("chunks", chunk_tokens=10)), [])


@pytest.mark.parametrize("context", ["", "   ", "..."])
def test_empty_or_wordless_context_still_gives_one_prompt(context):
    tok = _FakeTokenizer()
    for strategy in ("trim", "chunks", "retrieve"):
        plan = plan_strategy(tok, "Care este stadiul?", context,
                             _spec(strategy, chunk_tokens=3, reserve=2))
        assert len(plan.prompts) == 1 and plan.prompts[0]  # the question, no context


def test_run_strategies_answers_many_questions_in_one_engine_call():
    tok = _FakeTokenizer()
    epicrisis = " ".join(f"w{i}" for i in range(30))
    other = " ".join(f"v{i}" for i in range(12))
    items = [("Intrebare unu?", epicrisis), ("Intrebare doi?", epicrisis), ("Alta?", other)]
    calls: list[list[list[int]]] = []

    def generate(prompts):
        calls.append(list(prompts))
        return [Generation(text=f"a{len(calls)}-{i}", logprobs=[-0.5])
                for i in range(len(prompts))]

    for strategy, chunk_tokens in (("trim", None), ("chunks", 10)):
        calls.clear()
        spec = _spec(strategy, chunk_tokens=chunk_tokens)
        batched = run_strategies(generate, tok, items, spec)
        assert len(calls) == 1  # every item's prompts in one call
        # ... the same prompts, in item order, as one call per item would send
        singles = [plan_strategy(tok, q, c, spec).prompts for q, c in items]
        assert calls[0] == [p for prompts in singles for p in prompts]
        assert [r.strategy for r in batched] == [strategy] * 3
        sizes = [len(p) for p in singles]
        # each result comes from its own item's generations
        firsts = [sum(sizes[:i]) for i in range(3)]
        if strategy == "trim":
            assert [r.answer for r in batched] == [f"a1-{i}" for i in firsts]
        else:
            assert all(r.answer.startswith("a1-") for r in batched)
            assert [sum(r.votes.values()) for r in batched] == sizes
