"""Token-level prompt assembly (pure functions) and the Ray Data tokenisation pipeline.

Each epicrisis is tokenised ONCE (a Ray Data actor pool over the contexts table); each
example is then assembled from token ids: prompt text before the context + the head of
the context ids + prompt text after it + answer + EOS, trimmed so the whole fits the budget
N (the paper trims the epicrisis from the end). Labels are the answer tokens and EOS;
everything else is -100. `build_prompt_ids` is the same trimming for serving. How much
context fits is `PromptSpec.context_room` (medray.prompts.spec), nowhere else.

Token pieces are joined the way the tokenizer itself would split "a b": a probe decides
whether a piece that follows a space is encoded with a leading space (byte-level BPE:
Llama 3, Phi-4, the tiny model) or without (SentencePiece: Llama 2, Mistral).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medray.prompts.spec import (
    CONTEXT_SLOT,
    TRAIN_STRATEGIES,
    ChatPrompt,
    PromptSpec,
    medqaro_prompt_parts,
)

IGNORE_INDEX = -100


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

    def assemble(self, context_ids: Sequence[int]) -> list[int]:
        return self.prefix + self.before + list(context_ids) + self.after


def _prompt_text_parts(tokenizer: Any, question: str, spec: PromptSpec) -> tuple[str, str]:
    before, after = medqaro_prompt_parts(question, spec.format)
    if not spec.chat_template:
        return before, after
    templated = spec.chat_text(tokenizer, ChatPrompt(None, before + CONTEXT_SLOT + after))
    head, _, tail = templated.partition(CONTEXT_SLOT)
    return head, tail


def prompt_pieces(tokenizer: Any, question: str, spec: PromptSpec) -> PromptPieces:
    before, after = _prompt_text_parts(tokenizer, question, spec)
    traits = _traits(tokenizer)
    # The space between "Context:" and the epicrisis belongs to the context piece, the
    # space before the text after it to that piece (see the module docstring). A chat
    # template writes its own special tokens (BOS included) into the text.
    templated = spec.chat_template and getattr(tokenizer, "chat_template", None)
    return PromptPieces(
        prefix=[] if templated else list(traits.prefix),
        before=tokenizer.encode(before.rstrip(" "), add_special_tokens=False),
        after=encode_piece(tokenizer, after.lstrip(" "), after_space=after.startswith(" ")),
    )


def question_room(tokenizer: Any, question: str, spec: PromptSpec,
                  answer_tokens: int = 0) -> int:
    """`PromptSpec.context_room` for one question with a real tokenizer."""
    return spec.context_room(prompt_pieces(tokenizer, question, spec), answer_tokens)


def answer_ids(tokenizer: Any, answer: str) -> list[int]:
    """Target ids: the answer (after "Raspuns: ", as prompt + " " + answer) plus EOS."""
    return encode_piece(tokenizer, answer) + [tokenizer.eos_token_id]


def _room(pieces: PromptPieces, spec: PromptSpec, answer_tokens: int = 0) -> int:
    room = spec.context_room(pieces, answer_tokens)
    if room < 0:
        raise BudgetError(
            f"context budget {spec.context_tokens} tokens is smaller than the prompt without "
            f"context ({pieces.fixed}) + {max(answer_tokens, spec.answer_reserve)} reserved "
            "for the answer"
        )
    return room


def build_prompt_ids(tokenizer: Any, question: str, context_ids: Sequence[int],
                     spec: PromptSpec) -> list[int]:
    """Prompt ids with the epicrisis trimmed from the end so prompt + reserve <= budget
    (the served prompt). Raises BudgetError when even an empty context does not fit."""
    pieces = prompt_pieces(tokenizer, question, spec)
    return pieces.assemble(context_ids[:_room(pieces, spec)])


def _example(prompt: list[int], target: list[int]) -> dict[str, list[int]]:
    return {"input_ids": prompt + target, "labels": [IGNORE_INDEX] * len(prompt) + target}


def build_example(tokenizer: Any, question: str, answer: str, context_ids: Sequence[int],
                  spec: PromptSpec) -> dict[str, list[int]]:
    """One training example: input ids and labels (answer + EOS only; -100 elsewhere).

    The context is trimmed to leave max(answer + EOS, reserve) tokens, with reserve = the
    serving max_new_tokens by default: then the prompt is the one served, and how much
    context is shown does not depend on the answer. (Trimming by the answer's own length
    leaks it: a tiny model learned "context cut earlier -> longer answer" and failed on
    served prompts.)
    """
    target = answer_ids(tokenizer, answer)
    pieces = prompt_pieces(tokenizer, question, spec)
    return _example(pieces.assemble(context_ids[:_room(pieces, spec, len(target))]), target)


def build_chunk_examples(tokenizer: Any, question: str, answer: str,
                         context_ids: Sequence[int], spec: PromptSpec) -> list[dict]:
    """All non-overlapping context chunks that fit the budget, one example each (room as in
    `build_example`: independent of the answer's length up to the reserve)."""
    target = answer_ids(tokenizer, answer)
    pieces = prompt_pieces(tokenizer, question, spec)
    room = spec.context_room(pieces, len(target))
    if room <= 0:
        raise BudgetError(f"context budget {spec.context_tokens} leaves no room for context "
                          "chunks")
    return [_example(pieces.assemble(context_ids[start:start + room]), target)
            for start in range(0, max(len(context_ids), 1), room)]


def build_training_examples(tokenizer: Any, question: str, answer: str,
                            context_ids: Sequence[int], spec: PromptSpec) -> list[dict]:
    """The examples one training item gives under spec.strategy (trim: one; chunks: one per
    chunk)."""
    if spec.strategy == "chunks":
        return build_chunk_examples(tokenizer, question, answer, context_ids, spec)
    return [build_example(tokenizer, question, answer, context_ids, spec)]


def check_budget(tokenizer: Any, examples: Any, spec: PromptSpec) -> int:
    """Fail before any worker starts if some question + answer exceeds the budget.

    `examples` is a DataFrame with id, question, answer. Returns the smallest context room.
    """
    worst_room, worst_id = None, None
    for row in examples[["id", "question", "answer"]].itertuples(index=False):
        room = spec.context_room(prompt_pieces(tokenizer, row.question, spec),
                                 len(answer_ids(tokenizer, row.answer)))
        if worst_room is None or room < worst_room:
            worst_room, worst_id = room, row.id
    if worst_room is not None and worst_room < 0:
        raise BudgetError(
            f"prompt.context_tokens={spec.context_tokens} is smaller than question + answer "
            f"of example {worst_id!r} ({spec.context_tokens - worst_room} tokens without "
            "any context)"
        )
    return worst_room if worst_room is not None else spec.context_tokens


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

    def __init__(self, tokenizer_path: str, contexts: Any, spec: PromptSpec) -> None:
        import ray

        from medray.models import load_tokenizer

        self.tokenizer = load_tokenizer(tokenizer_path)
        # An ObjectRef to {context_id: int32 array}: fetched once per actor, zero-copy.
        self.contexts = ray.get(contexts) if isinstance(contexts, ray.ObjectRef) else contexts
        self.spec = spec

    def __call__(self, batch: Any) -> Any:
        import numpy as np
        import pandas as pd

        rows: dict[str, list] = {"id": [], "input_ids": [], "labels": [], "n_tokens": []}
        for ex_id, q, a, cid in zip(batch["id"], batch["question"], batch["answer"],
                                    batch["context_id"], strict=True):
            for ex in build_training_examples(self.tokenizer, q, a, self.contexts[cid],
                                              self.spec):
                rows["id"].append(ex_id)
                rows["input_ids"].append(np.asarray(ex["input_ids"], dtype=np.int32))
                rows["labels"].append(np.asarray(ex["labels"], dtype=np.int32))
                rows["n_tokens"].append(len(ex["input_ids"]))
        return pd.DataFrame(rows)


# Below this many characters of epicrisis text the driver tokenises in-process: a Ray Data
# actor pool first pays ~10 s to start its actors (process, imports, tokenizer load; measured
# on 2 cores), and a fast tokenizer does ~1.4 M characters/s on one core (the tiny BPE,
# measured), so a pool of two only wins past ~20 s of work.
IN_PROCESS_MAX_CHARS = 30_000_000
POOL_MIN_CPUS = 4  # with fewer, the actors share the cores the driver's loop would use


def tokenise_in_process(chars: int, cluster_cpus: float,
                        max_chars: int = IN_PROCESS_MAX_CHARS) -> bool:
    """Whether the driver's own loop is the faster place for `chars` of epicrisis text."""
    return chars <= max_chars or cluster_cpus < POOL_MIN_CPUS


def split_contexts(data_dir: str | os.PathLike, splits: Sequence[str]) -> Any:
    """The epicrises (context_id, text) that the examples of `splits` read, once each."""
    import pandas as pd

    from medray.data.prepared import CONTEXTS, EXAMPLES

    root = Path(data_dir)
    wanted = pd.read_parquet(root / EXAMPLES, columns=["context_id"],
                             filters=[("split", "in", list(splits))])["context_id"].unique()
    return pd.read_parquet(root / CONTEXTS, columns=["context_id", "text"],
                           filters=[("context_id", "in", wanted.tolist())])


def tokenize_contexts(data_dir: str | os.PathLike, tokenizer_path: str,
                      splits: Sequence[str], *, concurrency: int = 2, batch_size: int = 8,
                      cluster_cpus: float = 0.0,
                      in_process_max_chars: int = IN_PROCESS_MAX_CHARS) -> tuple[dict, str]:
    """({context_id: int32 token ids}, how): each epicrisis the `splits` read tokenised
    exactly once, in this process when that is faster (little text, or a cluster too small
    for a pool to pay), else by a Ray Data actor pool of up to `concurrency` actors."""
    import numpy as np

    texts = split_contexts(data_dir, splits)
    chars = int(texts["text"].str.len().sum())
    if tokenise_in_process(chars, cluster_cpus, in_process_max_chars):
        from medray.models import load_tokenizer

        tok = load_tokenizer(tokenizer_path)
        table = {cid: np.asarray(encode_context(tok, text), dtype=np.int32)
                 for cid, text in zip(texts["context_id"], texts["text"], strict=True)}
        return table, "in-process"
    import ray

    blocks = max(1, min(len(texts), 4 * concurrency))  # one block would keep one actor busy
    ds = ray.data.from_pandas([texts.iloc[i::blocks] for i in range(blocks)]).map_batches(
        ContextTokenizer,
        fn_constructor_kwargs={"tokenizer_path": tokenizer_path},
        batch_size=batch_size,
        batch_format="pandas",
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max(concurrency, 1)),
        num_cpus=0.5,
    )
    return context_table(ds), f"by a Ray Data actor pool (up to {concurrency} actors)"


def context_table(contexts_ds: Any) -> dict[str, Any]:
    """Gather the tokenised epicrises (small: ~4 bytes per token) into one shared table."""
    table: dict[str, Any] = {}
    for batch in contexts_ds.iter_batches(batch_format="pandas", batch_size=256):
        table.update(zip(batch["context_id"], batch["context_ids"], strict=True))
    return table


def examples_dataset(data_dir: str | os.PathLike, split: str, tokenizer_path: str,
                     contexts_ref: Any, spec: PromptSpec, *, ids: list[str] | None = None,
                     num_cpus: float = 0.5) -> Any:
    """Lazy Ray Dataset of assembled examples for one split (streamed to Train workers)."""
    import ray

    if spec.strategy not in TRAIN_STRATEGIES:
        raise ValueError(f"prompt.strategy {spec.strategy!r} cannot be trained; expected "
                         f"one of {TRAIN_STRATEGIES}")
    from medray.data.prepared import read_table

    ds = read_table(data_dir, "examples", ["id", "split", "question", "answer", "context_id"]
                    ).filter(expr=f"split == '{split}'")
    if ids is not None:  # a fixed subset (max_*_examples), chosen by the driver
        wanted = set(ids)
        ds = ds.filter(lambda r: r["id"] in wanted)
    return ds.map_batches(
        ExampleAssembler,
        fn_constructor_kwargs={"tokenizer_path": tokenizer_path, "contexts": contexts_ref,
                               "spec": spec},
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
