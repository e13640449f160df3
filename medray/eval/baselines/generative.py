"""MedQARo baselines (paper Table 6): random token selector and majority answer.

Random token selector: for each question, ignore the question, take the epicrisis' first N
tokens (N = 1,024 / 2,048 / 4,096, clipped to the epicrisis length), draw a start index
uniformly in [0, N) and a span of 1-3 tokens, and answer with those tokens. Tokens come from
a Hugging Face tokenizer (``tokenizer=`` path) or, without one, whitespace words; the
predictions record which. One seeded generator walks the examples in table order, so a seed
fully determines the file. Each epicrisis is tokenised once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pandas as pd

from medray.eval.runio import prediction_row

BUDGETS = (1024, 2048, 4096)


def _row(pid: str, prediction: str, model: str, **extra) -> dict:
    return prediction_row(pid, prediction, engine="baseline", model=model, **extra)


def majority_answer(train: pd.DataFrame) -> str:
    """Most frequent training answer (ties: lexicographically smallest, for determinism)."""
    if train.empty:
        raise ValueError("the training split is empty: no majority answer")
    counts = Counter(train["answer"].astype(str))
    best = max(counts.values())
    return min(a for a, c in counts.items() if c == best)


def majority_predictions(examples: pd.DataFrame, answer: str) -> list[dict]:
    return [_row(i, answer, "majority") for i in examples["id"]]


def _tokenizer_fns(tokenizer: str | None) -> tuple[Callable, Callable, str]:
    if tokenizer is None:
        return str.split, " ".join, "whitespace"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True).strip()

    return encode, decode, str(tokenizer)


def random_token_predictions(
    examples: pd.DataFrame,
    context_text: Callable[[str], str],
    tokens: int = 1024,
    seed: int = 0,
    tokenizer: str | None = None,
) -> list[dict]:
    """``examples`` needs id + context_id; ``context_text(context_id)`` gives the epicrisis."""
    if tokens < 1:
        raise ValueError("--tokens must be positive")
    encode, decode, tok_name = _tokenizer_fns(tokenizer)
    rng = np.random.default_rng(seed)
    cache: dict[str, list] = {}
    rows = []
    for pid, cid in zip(examples["id"], examples["context_id"], strict=True):
        if cid not in cache:
            cache[cid] = list(encode(context_text(cid)))
        ctx = cache[cid]
        limit = min(tokens, len(ctx))
        start = int(rng.integers(0, limit)) if limit else 0
        span = int(rng.integers(1, 4))
        pred = decode(ctx[start:min(start + span, limit)]) if limit else ""
        rows.append(_row(pid, pred, "random-token", context_tokens=tokens, tokenizer=tok_name,
                         seed=seed, n_tokens=min(span, max(0, limit - start))))
    return rows
