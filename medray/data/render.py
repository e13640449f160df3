"""Render one prepared example's prompt (what `medray data prompt` prints)."""

from __future__ import annotations

import json
import random
from typing import Any

from medray.data.prepared import PreparedData
from medray.prompts import mcq_prompt, medqaro_prompt, medqaro_prompt_parts

# Tokens kept free for the generated answer (the reference generates max 10 new tokens).
ANSWER_RESERVE = 10


def _row(data: PreparedData, example_id: str) -> dict[str, Any]:
    hits = data.examples[data.examples["id"] == example_id]
    if hits.empty:
        sample = ", ".join(data.examples["id"].head(3))
        raise KeyError(f"no example with id {example_id!r} (ids look like: {sample})")
    return hits.iloc[0].to_dict()


def trim_context_words(question: str, context: str, fmt: str, budget: int) -> str:
    """Whitespace-word stand-in for token trimming when no tokenizer is given."""
    before, after = medqaro_prompt_parts(question, fmt)
    room = budget - len(before.split()) - len(after.split()) - ANSWER_RESERVE
    if room <= 0:
        raise ValueError(f"--context-tokens {budget} leaves no room for the epicrisis")
    return " ".join(context.split()[:room])


def render_example(data: PreparedData, example_id: str, *, fmt: str = "qea",
                   context_tokens: int | None = None, tokenizer: str | None = None,
                   shots: int = 0) -> str:
    row = _row(data, example_id)
    if data.kind == "generative":
        context = data.context(row["context_id"])
        if context_tokens is None:
            return medqaro_prompt(row["question"], context, fmt)
        if tokenizer is None:
            return medqaro_prompt(row["question"],
                                  trim_context_words(row["question"], context, fmt,
                                                     context_tokens), fmt)
        from transformers import AutoTokenizer

        from medray.tokenize import build_prompt_ids

        tok = AutoTokenizer.from_pretrained(tokenizer)
        context_ids = tok(context, add_special_tokens=False)["input_ids"]
        ids = build_prompt_ids(tok, row["question"], context_ids, fmt, context_tokens,
                               reserve=ANSWER_RESERVE)
        return tok.decode(ids, skip_special_tokens=True)
    row["options"] = [dict(o) for o in row["options"]]
    row["answer"] = list(row["answer"])
    examples = []
    if shots:
        train = data.examples[(data.examples["split"] == "train")
                              & (data.examples["kind"] == row["kind"])]
        if len(train) < shots:
            raise ValueError(f"{shots} shots asked but the train split has only {len(train)} "
                             f"{row['kind']} items")
        picked = random.Random(0).sample(range(len(train)), shots)
        examples = [train.iloc[i].to_dict() for i in picked]
        for ex in examples:
            ex["options"] = [dict(o) for o in ex["options"]]
    chat = mcq_prompt({**row, "meta": json.loads(row["meta"])}, examples)
    parts = [f"[system]\n{chat.system}"] if chat.system else []
    return "\n\n".join(parts + [f"[user]\n{chat.user}"])
