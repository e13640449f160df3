"""Render one prepared example's prompt (what `medray data prompt` prints).

MedQARo prompts are built by the training/serving code itself (medray.prompts.tokens with
the PromptSpec, so the answer reserve is the spec's); multiple-choice prompts use the
seeded shot picker the evaluation uses. The caller loads the tokenizer (models sit above
prompts), and only when `needs_tokenizer` says the rendering reads it.
"""

from __future__ import annotations

from typing import Any

from medray.data.prepared import PreparedData
from medray.prompts.spec import PromptSpec
from medray.prompts.text import (
    example_dict,
    medqaro_prompt,
    medqaro_prompt_parts,
    prompt_text,
    render,
    shot_sets,
)
from medray.prompts.tokens import build_prompt_ids, encode_context


def _row(data: PreparedData, example_id: str) -> dict[str, Any]:
    hits = data.examples[data.examples["id"] == example_id]
    if hits.empty:
        sample = ", ".join(data.examples["id"].head(3))
        raise KeyError(f"no example with id {example_id!r} (ids look like: {sample})")
    return hits.iloc[0].to_dict()


def trim_context_words(question: str, context: str, spec: PromptSpec) -> str:
    """Whitespace-word stand-in for token trimming when no tokenizer is given (the room is
    the spec's, counted in words)."""
    before, after = medqaro_prompt_parts(question, spec.format)
    room = spec.context_room(len(before.split()) + len(after.split()))
    if room <= 0:
        raise ValueError(f"--context-tokens {spec.context_tokens} leaves no room for the "
                         "epicrisis")
    return " ".join(context.split()[:room])


def needs_tokenizer(data: PreparedData, spec: PromptSpec, *, trim: bool = True) -> bool:
    """Whether rendering reads a tokenizer: MedQARo trimming counts tokens, and a
    multiple-choice item reads the chat template unless `chat_template` is false."""
    return trim if data.kind == "generative" else spec.chat_template is not False


def render_example(data: PreparedData, example_id: str, spec: PromptSpec | None = None, *,
                   trim: bool = True, tokenizer: Any = None, seed: int = 0) -> str:
    """The prompt of one example (`spec` None: the defaults). `trim` False: the MedQARo
    epicrisis in full; `tokenizer` None: whitespace words stand in for tokens."""
    spec = spec or PromptSpec()
    row = _row(data, example_id)
    if data.kind == "generative":
        context = data.context(row["context_id"])
        if not trim:
            return medqaro_prompt(row["question"], context, spec.format)
        if tokenizer is None:
            return medqaro_prompt(row["question"],
                                  trim_context_words(row["question"], context, spec),
                                  spec.format)
        ids = build_prompt_ids(tokenizer, row["question"], encode_context(tokenizer, context),
                               spec)
        return tokenizer.decode(ids, skip_special_tokens=not spec.uses_chat_template(tokenizer))
    ex = example_dict(row)
    chat = render(ex, shot_sets(data.examples, [ex["kind"]], spec.shots, seed))
    if spec.uses_chat_template(tokenizer):
        return prompt_text(chat, tokenizer, spec)
    parts = [f"[system]\n{chat.system}"] if chat.system else []
    return "\n\n".join(parts + [f"[user]\n{chat.user}"])
