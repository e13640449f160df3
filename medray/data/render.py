"""Render one prepared example's prompt (what `medray data prompt` prints).

MedQARo prompts are built by the training/serving code itself (medray.prompts.tokens with the
PromptSpec, so the answer reserve is the spec's); multiple-choice prompts use the seeded
shot picker the evaluation uses.
"""

from __future__ import annotations

from typing import Any

from medray.data.prepared import PreparedData
from medray.prompts.spec import PromptSpec, medqaro_prompt, medqaro_prompt_parts


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


def render_example(data: PreparedData, example_id: str, spec: PromptSpec | None = None, *,
                   trim: bool = True, tokenizer: str | None = None, seed: int = 0) -> str:
    """The prompt of one example (`spec` None: the defaults). `trim` False: the MedQARo
    epicrisis in full."""
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
        from medray.models import load_tokenizer
        from medray.prompts.tokens import build_prompt_ids, encode_context

        tok = load_tokenizer(tokenizer)
        ids = build_prompt_ids(tok, row["question"], encode_context(tok, context), spec)
        return tok.decode(ids, skip_special_tokens=not spec.chat_template)
    from medray.eval import mcq

    ex = mcq.example_dict(row)
    chat = mcq.render(ex, mcq.shot_sets(data.examples, [ex["kind"]], spec.shots, seed))
    if spec.chat_template and tokenizer is not None:
        from medray.models import load_tokenizer

        return mcq.prompt_text(chat, load_tokenizer(tokenizer), spec)
    parts = [f"[system]\n{chat.system}"] if chat.system else []
    return "\n\n".join(parts + [f"[user]\n{chat.user}"])
