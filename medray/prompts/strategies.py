"""Long-context strategies for MedQARo: trim, chunks (vote) and retrieve (BM25).

- trim: keep the head of the epicrisis (the reference code and the paper's main setting).
- chunks: split the epicrisis into non-overlapping N-token chunks, answer every chunk,
  majority vote over the answers; ties broken by the mean log-probability of the
  generated tokens (MedQARo Table 9).
- retrieve: rank N-token chunks against the question with BM25 (`bm25s`), keep the best
  chunks that fit the context budget, and put them back in document order (the paper's
  stated future work).

Prompt assembly itself lives in `medray.prompts.tokens.build_prompt_ids` (shared with training);
this module only decides WHICH context tokens go in. Model calls go through a
`generate(list_of_prompt_ids) -> list[Generation]` callable, so the same code runs inside
the Serve ingress and in the offline evaluators.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from medray.prompts.spec import PromptSpec
from medray.prompts.tokens import build_prompt_ids, encode_context, question_room


class Generation(Protocol):
    """What a strategy reads of one model answer (medray.engines.base.Generation has it;
    prompts sit below the engines, so the shape is stated here)."""

    text: str
    raw: str | None

    @property
    def n_tokens(self) -> int: ...

    @property
    def mean_logprob(self) -> float | None: ...


GenerateFn = Callable[[list[list[int]]], Sequence[Generation]]


@dataclass
class StrategyResult:
    answer: str
    logprob: float | None  # mean log-prob of the generated tokens of the chosen answer
    prompt_tokens: int
    strategy: str
    n_tokens: int = 0
    raw: str = ""
    votes: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------- pure helpers


def split_chunks(ids: Sequence[int], size: int) -> list[list[int]]:
    """Non-overlapping chunks of `size` tokens (the last one may be shorter)."""
    if size <= 0:
        raise ValueError(f"chunk size must be positive, got {size}")
    return [list(ids[i : i + size]) for i in range(0, len(ids), size)] or [[]]


def vote_key(text: str) -> str:
    """Answers that differ only in case or spacing are the same vote."""
    return " ".join(text.strip().lower().split())


@dataclass
class Vote:
    index: int  # which candidate was chosen (its text is the answer)
    votes: dict[str, int]
    tied: bool


def majority_vote(texts: Sequence[str], mean_logprobs: Sequence[float | None]) -> Vote:
    """Most frequent answer; among tied answers, the highest mean log-probability wins.

    A group's log-probability is the mean over its members of each generation's mean token
    log-prob. Empty answers only count when every chunk answered nothing. The member with
    the best log-prob represents the winning group.
    """
    if not texts:
        raise ValueError("nothing to vote on")
    if len(texts) != len(mean_logprobs):
        raise ValueError("texts and log-probs differ in length")
    keys = [vote_key(t) for t in texts]
    eligible = [i for i, k in enumerate(keys) if k] or list(range(len(texts)))
    groups: dict[str, list[int]] = {}
    for i in eligible:
        groups.setdefault(keys[i], []).append(i)

    def lp(i: int) -> float:
        value = mean_logprobs[i]
        return float("-inf") if value is None else float(value)

    def group_lp(members: list[int]) -> float:
        return sum(lp(i) for i in members) / len(members)

    top = max(len(m) for m in groups.values())
    leaders = [k for k, m in groups.items() if len(m) == top]
    # max() keeps the first of equal values, so exact ties fall to document order.
    best = max(leaders, key=lambda k: group_lp(groups[k]))
    index = max(groups[best], key=lp)
    return Vote(index=index, votes={k: len(m) for k, m in groups.items()}, tied=len(leaders) > 1)


def bm25_select(
    question: str, chunks: Sequence[str], lengths: Sequence[int], budget: int
) -> list[int]:
    """Indices of the best BM25 chunks whose total length fits `budget`, in document order.

    Chunks are taken greedily by descending score (ties: earlier chunk first); a chunk that
    would overflow the budget is skipped and smaller, lower-ranked ones may still fit.
    """
    import bm25s
    import numpy as np

    if len(chunks) != len(lengths):
        raise ValueError("chunks and lengths differ in length")
    if not chunks:
        return []
    corpus = bm25s.tokenize(list(chunks), stopwords=None, show_progress=False)
    if not any(len(doc) for doc in corpus.ids):  # no words at all (blank or punctuation)
        return []
    retriever = bm25s.BM25()
    retriever.index(corpus, show_progress=False)
    query = bm25s.tokenize([question], stopwords=None, return_ids=False, show_progress=False)[0]
    known = [t for t in query if t in corpus.vocab]  # unseen words score nothing
    scores = retriever.get_scores(known) if known else np.zeros(len(chunks))
    order = sorted(range(len(chunks)), key=lambda i: (-float(scores[i]), i))
    chosen, used = [], 0
    for i in order:
        if used + lengths[i] <= budget:
            chosen.append(i)
            used += lengths[i]
    return sorted(chosen)


# ---------------------------------------------------------------- running a strategy


def context_budget(tokenizer: Any, question: str, spec: PromptSpec) -> int:
    """How many epicrisis tokens fit: what build_prompt_ids keeps of an over-long context."""
    return max(question_room(tokenizer, question, spec), 0)


@dataclass
class Plan:
    """The prompts a strategy needs answered (token ids), before any model call."""

    strategy: str
    prompts: list[list[int]]


def plan_strategy(tokenizer: Any, question: str, context: str, spec: PromptSpec,
                  context_ids: Sequence[int] | None = None) -> Plan:
    """Build the prompt(s) for one question over one epicrisis with spec.strategy
    (`context_ids`: the epicrisis already tokenised, as encode_context does)."""
    def assemble(context_ids: Sequence[int]) -> list[int]:
        return build_prompt_ids(tokenizer, question, context_ids, spec)

    if context_ids is None:
        context_ids = encode_context(tokenizer, context)  # as in training: tokenised once
    if spec.strategy == "trim":
        return Plan(spec.strategy, [assemble(context_ids)])
    budget = context_budget(tokenizer, question, spec)
    size = max(min(spec.chunk_tokens or budget, budget), 1)
    # An empty epicrisis still gets one (question-only) prompt, as trimming gives it.
    chunks = split_chunks(context_ids, size) or [[]]
    if spec.strategy == "chunks":
        return Plan(spec.strategy, [assemble(c) for c in chunks])
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in chunks]
    keep = bm25_select(question, texts, [len(c) for c in chunks], budget)
    return Plan(spec.strategy, [assemble([t for i in keep for t in chunks[i]])])


def finish_strategy(plan: Plan, gens: Sequence[Generation]) -> StrategyResult:
    """Turn the generations for a plan's prompts into one answer (voting for chunks)."""
    if len(gens) != len(plan.prompts):
        raise ValueError(f"{len(plan.prompts)} prompts but {len(gens)} generations")
    n_prompt = sum(len(p) for p in plan.prompts)
    if plan.strategy != "chunks":
        return _result(gens[0], plan.strategy, n_prompt)
    vote = majority_vote([g.text for g in gens], [g.mean_logprob for g in gens])
    res = _result(gens[vote.index], plan.strategy, n_prompt)
    res.votes = vote.votes
    return res


def run_strategy(generate: GenerateFn, tokenizer: Any, question: str, context: str,
                 spec: PromptSpec) -> StrategyResult:
    return run_strategies(generate, tokenizer, [(question, context)], spec)[0]


def run_strategies(generate: GenerateFn, tokenizer: Any,
                   items: Sequence[tuple[str, str]], spec: PromptSpec) -> list[StrategyResult]:
    """run_strategy for many (question, epicrisis) pairs in ONE engine call, each epicrisis
    tokenised once: a patient's questions then reach the engine together, and with the
    epicrisis first (E+Q+A) its prefix cache computes the shared epicrisis once."""
    encoded: dict[str, list[int]] = {}
    plans = []
    for question, context in items:
        if context not in encoded:
            encoded[context] = encode_context(tokenizer, context)
        plans.append(plan_strategy(tokenizer, question, context, spec, encoded[context]))
    gens = generate([prompt for plan in plans for prompt in plan.prompts])
    results, start = [], 0
    for plan in plans:
        results.append(finish_strategy(plan, gens[start:start + len(plan.prompts)]))
        start += len(plan.prompts)
    return results


def _result(gen: Generation, strategy: str, prompt_tokens: int) -> StrategyResult:
    return StrategyResult(
        answer=gen.text.strip(),
        logprob=gen.mean_logprob,
        prompt_tokens=prompt_tokens,
        strategy=strategy,
        n_tokens=gen.n_tokens,
        raw=gen.raw if gen.raw is not None else gen.text,
    )
