"""Token-level prompt assembly (pure functions) and the Ray Data tokenisation pipeline.

Each epicrisis is tokenised ONCE (a Ray Data actor pool over the contexts table); each
example is then assembled from token ids: prompt text before the context + the head of
the context ids + prompt text after it + answer + EOS, trimmed so the whole fits the budget
N (the paper trims the epicrisis from the end). Labels are the answer tokens and EOS;
everything else is -100. `build_prompt_ids` is the same trimming for serving.

Token pieces are joined the way the tokenizer itself would split "a b": a probe decides
whether a piece that follows a space is encoded with a leading space (byte-level BPE:
Llama 3, Phi-4, the tiny model) or without (SentencePiece: Llama 2, Mistral).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from medray.prompts import medqaro_prompt_parts

IGNORE_INDEX = -100
MODES = ("trim", "chunks")


class BudgetError(ValueError):
    """The context budget N cannot hold the prompt (without context) plus the answer."""


# --------------------------------------------------------------------- pure assembly


@dataclass(frozen=True)
class _TokenizerTraits:
    prefix: tuple[int, ...]  # special ids the tokenizer puts before a text (e.g. BOS)
    space_prefix: bool  # encode a piece that follows a space as " piece"


_TRAITS: dict[int, tuple[Any, _TokenizerTraits]] = {}


def _traits(tokenizer: Any) -> _TokenizerTraits:
    cached = _TRAITS.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    plain = tokenizer.encode("Context: epicriza", add_special_tokens=False)
    full = tokenizer.encode("Context: epicriza", add_special_tokens=True)
    prefix = tuple(full[: len(full) - len(plain)]) if full[len(full) - len(plain):] == plain else ()
    head = tokenizer.encode("Context:", add_special_tokens=False)
    rest = plain[len(head):] if plain[: len(head)] == head else None
    space_prefix = rest != tokenizer.encode("epicriza", add_special_tokens=False)
    traits = _TokenizerTraits(prefix=prefix, space_prefix=space_prefix)
    _TRAITS[id(tokenizer)] = (tokenizer, traits)
    return traits


def encode_piece(tokenizer: Any, text: str, *, after_space: bool = True) -> list[int]:
    """Ids of `text` as it appears after a space inside a longer string (no specials)."""
    if after_space and _traits(tokenizer).space_prefix:
        text = " " + text
    return tokenizer.encode(text, add_special_tokens=False)


def encode_context(tokenizer: Any, text: str) -> list[int]:
    """An epicrisis's ids, once per epicrisis; the prompt puts it after "Context: "."""
    return encode_piece(tokenizer, text)


@dataclass
class PromptPieces:
    prefix: list[int]
    before: list[int]
    after: list[int]

    @property
    def fixed(self) -> int:
        return len(self.prefix) + len(self.before) + len(self.after)


def prompt_pieces(tokenizer: Any, question: str, fmt: str = "qea") -> PromptPieces:
    before, after = medqaro_prompt_parts(question, fmt)
    traits = _traits(tokenizer)
    # The space between "Context:" and the epicrisis belongs to the context piece, the
    # space before the text after it to that piece (see the module docstring).
    return PromptPieces(
        prefix=list(traits.prefix),
        before=tokenizer.encode(before.rstrip(" "), add_special_tokens=False),
        after=encode_piece(tokenizer, after.lstrip(" "), after_space=after.startswith(" ")),
    )


def answer_ids(tokenizer: Any, answer: str) -> list[int]:
    """Target ids: the answer (after "Raspuns: ", as prompt + " " + answer) plus EOS."""
    return encode_piece(tokenizer, answer) + [tokenizer.eos_token_id]


def context_room(pieces: PromptPieces, context_tokens: int, reserve: int) -> int:
    return context_tokens - reserve - pieces.fixed


def build_prompt_ids(
    tokenizer: Any,
    question: str,
    context_ids: Sequence[int],
    fmt: str = "qea",
    context_tokens: int = 2048,
    reserve: int = 0,
) -> list[int]:
    """Prompt ids with the epicrisis trimmed from the end so prompt + reserve <= budget.

    `reserve` is the room kept for the answer: answer + EOS in training, max_new_tokens
    when serving. Raises BudgetError when even an empty context does not fit.
    """
    pieces = prompt_pieces(tokenizer, question, fmt)
    room = context_room(pieces, context_tokens, reserve)
    if room < 0:
        raise BudgetError(
            f"context budget {context_tokens} tokens is smaller than the prompt without "
            f"context ({pieces.fixed}) + {reserve} reserved for the answer"
        )
    return pieces.prefix + pieces.before + list(context_ids[:room]) + pieces.after


def build_example(
    tokenizer: Any,
    question: str,
    answer: str,
    context_ids: Sequence[int],
    fmt: str = "qea",
    context_tokens: int = 2048,
    reserve: int = 0,
) -> dict[str, list[int]]:
    """One training example: input ids and labels (answer + EOS only; -100 elsewhere).

    The context is trimmed to leave max(answer + EOS, `reserve`) tokens, with `reserve` =
    the serving max_new_tokens: then the prompt is the one served, and how much context
    is shown does not depend on the answer. (Trimming by the answer's own length leaks it:
    a tiny model learned "context cut earlier -> longer answer" and failed on served prompts.)
    """
    target = answer_ids(tokenizer, answer)
    prompt = build_prompt_ids(tokenizer, question, context_ids, fmt, context_tokens,
                              max(len(target), reserve))
    return {"input_ids": prompt + target, "labels": [IGNORE_INDEX] * len(prompt) + target}


def build_chunk_examples(
    tokenizer: Any,
    question: str,
    answer: str,
    context_ids: Sequence[int],
    fmt: str = "qea",
    context_tokens: int = 2048,
    reserve: int = 0,
) -> list[dict[str, list[int]]]:
    """All non-overlapping context chunks that fit the budget, one example each (room as in
    `build_example`: independent of the answer's length up to `reserve`)."""
    target = answer_ids(tokenizer, answer)
    pieces = prompt_pieces(tokenizer, question, fmt)
    room = context_room(pieces, context_tokens, max(len(target), reserve))
    if room <= 0:
        raise BudgetError(f"context budget {context_tokens} leaves no room for context chunks")
    out = []
    for start in range(0, max(len(context_ids), 1), room):
        chunk = list(context_ids[start:start + room])
        prompt = pieces.prefix + pieces.before + chunk + pieces.after
        out.append({"input_ids": prompt + target, "labels": [IGNORE_INDEX] * len(prompt) + target})
    return out


def check_budget(tokenizer: Any, examples: Any, fmt: str, context_tokens: int,
                 reserve: int = 0) -> int:
    """Fail before any worker starts if some question + answer exceeds the budget.

    `examples` is a DataFrame with id, question, answer. Returns the smallest context room.
    """
    worst_room, worst_id = None, None
    for row in examples[["id", "question", "answer"]].itertuples(index=False):
        pieces = prompt_pieces(tokenizer, row.question, fmt)
        room = context_room(pieces, context_tokens,
                            max(len(answer_ids(tokenizer, row.answer)), reserve))
        if worst_room is None or room < worst_room:
            worst_room, worst_id = room, row.id
    if worst_room is not None and worst_room < 0:
        raise BudgetError(
            f"data.context_tokens={context_tokens} is smaller than question + answer of "
            f"example {worst_id!r} ({context_tokens - worst_room} tokens without any context)"
        )
    return worst_room if worst_room is not None else context_tokens


# ------------------------------------------------------------------ Ray Data pipeline


class ContextTokenizer:
    """Ray Data actor: tokenise a batch of epicrises (each epicrisis exactly once)."""

    def __init__(self, tokenizer_path: str) -> None:
        from medray.models import load_tokenizer

        self.tokenizer = load_tokenizer(tokenizer_path)

    def __call__(self, batch: Any) -> Any:
        import numpy as np
        import pandas as pd

        ids = [np.asarray(encode_context(self.tokenizer, t), dtype=np.int32) for t in batch["text"]]
        return pd.DataFrame({"context_id": batch["context_id"], "context_ids": ids})


class ExampleAssembler:
    """Ray Data actor: assemble examples from the shared table of tokenised epicrises."""

    def __init__(self, tokenizer_path: str, contexts: Any, fmt: str, context_tokens: int,
                 mode: str = "trim", reserve: int = 0) -> None:
        import ray

        from medray.models import load_tokenizer

        self.tokenizer = load_tokenizer(tokenizer_path)
        # An ObjectRef to {context_id: int32 array}: fetched once per actor, zero-copy.
        self.contexts = ray.get(contexts) if isinstance(contexts, ray.ObjectRef) else contexts
        self.fmt, self.context_tokens, self.mode = fmt, context_tokens, mode
        self.reserve = reserve  # the serving max_new_tokens (see build_example)

    def __call__(self, batch: Any) -> Any:
        import numpy as np
        import pandas as pd

        rows: dict[str, list] = {"id": [], "input_ids": [], "labels": [], "n_tokens": []}
        for ex_id, q, a, cid in zip(batch["id"], batch["question"], batch["answer"],
                                    batch["context_id"], strict=True):
            args = (self.tokenizer, q, a, self.contexts[cid], self.fmt, self.context_tokens,
                    self.reserve)
            built = build_chunk_examples(*args) if self.mode == "chunks" else [build_example(*args)]
            for ex in built:
                rows["id"].append(ex_id)
                rows["input_ids"].append(np.asarray(ex["input_ids"], dtype=np.int32))
                rows["labels"].append(np.asarray(ex["labels"], dtype=np.int32))
                rows["n_tokens"].append(len(ex["input_ids"]))
        return pd.DataFrame(rows)


def tokenize_contexts(data_dir: str | os.PathLike, tokenizer_path: str, *,
                      concurrency: int = 2, batch_size: int = 8) -> Any:
    """Ray Dataset (context_id, context_ids): one row and one tokenisation per epicrisis."""
    import ray

    from medray.data.prepared import read_table

    return read_table(data_dir, "contexts", ["context_id", "text"]).map_batches(
        ContextTokenizer,
        fn_constructor_kwargs={"tokenizer_path": tokenizer_path},
        batch_size=batch_size,
        batch_format="pandas",
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max(concurrency, 1)),
        num_cpus=0.5,
    )


def context_table(contexts_ds: Any) -> dict[str, Any]:
    """Gather the tokenised epicrises (small: ~4 bytes per token) into one shared table."""
    table: dict[str, Any] = {}
    for batch in contexts_ds.iter_batches(batch_format="pandas", batch_size=256):
        table.update(zip(batch["context_id"], batch["context_ids"], strict=True))
    return table


def examples_dataset(data_dir: str | os.PathLike, split: str, tokenizer_path: str,
                     contexts_ref: Any, *, fmt: str = "qea", context_tokens: int = 2048,
                     mode: str = "trim", ids: list[str] | None = None,
                     num_cpus: float = 0.5, reserve: int = 0) -> Any:
    """Lazy Ray Dataset of assembled examples for one split (streamed to Train workers)."""
    import ray

    if mode not in MODES:
        raise ValueError(f"unknown data.mode {mode!r}; expected one of {MODES}")
    from medray.data.prepared import read_table

    ds = read_table(data_dir, "examples", ["id", "split", "question", "answer", "context_id"]
                    ).filter(expr=f"split == '{split}'")
    if ids is not None:  # a fixed subset (max_*_examples), chosen by the driver
        wanted = set(ids)
        ds = ds.filter(lambda r: r["id"] in wanted)
    return ds.map_batches(
        ExampleAssembler,
        fn_constructor_kwargs={"tokenizer_path": tokenizer_path, "contexts": contexts_ref,
                               "fmt": fmt, "context_tokens": context_tokens, "mode": mode,
                               "reserve": reserve},
        batch_size=32,
        batch_format="pandas",
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=num_cpus,
    )


def iter_rows_from_batches(batches: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Rows (dicts of lists) out of Ray Data numpy batches."""
    for batch in batches:
        for i in range(len(batch["input_ids"])):
            yield {"input_ids": batch["input_ids"][i].tolist(),
                   "labels": batch["labels"][i].tolist()}
