"""Token-level prompt assembly and budgets (pure functions of a tokenizer and a PromptSpec).

Each epicrisis is tokenised once (medray.train.data runs that over a dataset); each
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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from medray.prompts.spec import PromptSpec
from medray.prompts.text import CONTEXT_SLOT, ChatPrompt, medqaro_prompt_parts, prompt_text

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
    if not spec.uses_chat_template(tokenizer):
        return before, after
    templated = prompt_text(ChatPrompt(None, before + CONTEXT_SLOT + after), tokenizer, spec)
    head, _, tail = templated.partition(CONTEXT_SLOT)
    return head, tail


def prompt_pieces(tokenizer: Any, question: str, spec: PromptSpec) -> PromptPieces:
    before, after = _prompt_text_parts(tokenizer, question, spec)
    traits = _traits(tokenizer)
    # The space between "Context:" and the epicrisis belongs to the context piece, the
    # space before the text after it to that piece (see the module docstring). A chat
    # template's text carries its own special tokens, BOS only where the tokenizer does
    # not add it (medray.prompts.text.prompt_text).
    return PromptPieces(
        prefix=list(traits.prefix),
        before=tokenizer.encode(before.rstrip(" "), add_special_tokens=False),
        after=encode_piece(tokenizer, after.lstrip(" "), after_space=after.startswith(" ")),
    )


def chat_prompt_ids(tokenizer: Any, prompt: ChatPrompt, spec: PromptSpec) -> list[int]:
    """The ids of a whole rendered prompt (multiple choice), with the tokenizer's own
    special tokens: what training, the engines and Serve feed the model."""
    return tokenizer.encode(prompt_text(prompt, tokenizer, spec), add_special_tokens=True)


def question_room(tokenizer: Any, question: str, spec: PromptSpec,
                  answer_tokens: int = 0) -> int:
    """`PromptSpec.context_room` for one question with a real tokenizer."""
    return spec.context_room(prompt_pieces(tokenizer, question, spec), answer_tokens)


def _reply_after_space(tokenizer: Any) -> bool:
    """Whether the chat template puts a space before the assistant's reply: ChatML opens
    it right after "assistant\n"; a plain template may render " reply" as the raw prompt
    does. Read off the template by rendering one short exchange, once per tokenizer (it
    is asked for every training example)."""
    cached = _REPLY_SPACE.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    user = [{"role": "user", "content": "Q"}]
    head = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template([*user, {"role": "assistant", "content": "Z"}],
                                         tokenize=False)
    at = len(head) if full.startswith(head) else full.rfind("Z")
    space = full[at:].startswith(" ") or (at > 0 and full[at - 1] == " ")
    _REPLY_SPACE[id(tokenizer)] = (tokenizer, space)
    return space


_REPLY_SPACE: dict[int, tuple[Any, bool]] = {}


def answer_ids(tokenizer: Any, answer: str, spec: PromptSpec | None = None) -> list[int]:
    """Target ids: the answer plus EOS. As plain text it follows "Raspuns: " (prompt + " " +
    answer); through a chat template it opens the assistant's turn as the template writes
    it (no space after ChatML's "assistant\n": a chat model never starts a reply so)."""
    chat = spec is not None and spec.uses_chat_template(tokenizer)
    after_space = not chat or _reply_after_space(tokenizer)
    return encode_piece(tokenizer, answer, after_space=after_space) + [tokenizer.eos_token_id]


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
    target = answer_ids(tokenizer, answer, spec)
    pieces = prompt_pieces(tokenizer, question, spec)
    return _example(pieces.assemble(context_ids[:_room(pieces, spec, len(target))]), target)


def build_chunk_examples(tokenizer: Any, question: str, answer: str,
                         context_ids: Sequence[int], spec: PromptSpec) -> list[dict]:
    """All non-overlapping context chunks that fit the budget, one example each (room as in
    `build_example`: independent of the answer's length up to the reserve)."""
    target = answer_ids(tokenizer, answer, spec)
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
                                 len(answer_ids(tokenizer, row.answer, spec)))
        if worst_room is None or room < worst_room:
            worst_room, worst_id = room, row.id
    if worst_room is not None and worst_room < 0:
        raise BudgetError(
            f"prompt.context_tokens={spec.context_tokens} is smaller than question + answer "
            f"of example {worst_id!r} ({spec.context_tokens - worst_room} tokens without "
            "any context)"
        )
    return worst_room if worst_room is not None else spec.context_tokens
