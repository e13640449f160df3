"""How a model is prompted (`PromptSpec`): training writes it beside the adapter, serving
and evaluation read it back, so a fine-tuned model is asked exactly as it was trained.

The defaults, the context room and the rule for how many new tokens a request decodes are
decided here and nowhere else; the prompt texts themselves are in medray.prompts.text.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
)

from medray.config import Strict

MedqaroFormat = Literal["qea", "eqa"]
MEDQARO_FORMATS: tuple[str, ...] = ("qea", "eqa")

SHOTS = (0, 1, 3, 5)
TRAIN_STRATEGIES = ("trim", "chunks")  # retrieve is an inference-time strategy
PROMPT_FILE = "prompt.json"  # beside every exported adapter and merged model
REFERENCE_MAX_NEW_TOKENS = 10  # the reference code decodes at most 10 new tokens


class PromptSpec(Strict):
    """How a model is prompted: training writes it beside the adapter (`prompt.json`),
    serving and evaluation read it back, so a fine-tuned model is asked exactly as trained.

    `context_tokens` is the whole budget N: prompt (question + trimmed epicrisis) plus the
    `reserve` kept free for the answer. The context room is computed only here
    (`context_room`).
    """

    model_config = ConfigDict(frozen=True)  # Strict's rules, and hashable

    format: MedqaroFormat = "qea"
    context_tokens: int = Field(2048, ge=8)
    max_new_tokens: int = Field(REFERENCE_MAX_NEW_TOKENS, ge=1, le=4096)
    # Tokens kept free for the answer inside context_tokens; None = max_new_tokens (then
    # the training prompt is the served one, whatever the answer's length).
    reserve: int | None = Field(None, ge=0)
    strategy: Literal["trim", "chunks", "retrieve"] = "trim"  # training: trim | chunks
    chunk_tokens: int | None = Field(None, ge=1)  # chunks/retrieve piece size; None = room
    # "auto": the model's own chat template where its tokenizer has one, plain text where
    # it has none; True / False force it (the paper configs pin what their paper did).
    chat_template: bool | Literal["auto"] = "auto"
    shots: int = 0  # multiple choice: in-context examples from the seeded picker

    @field_validator("shots")
    @classmethod
    def _shots(cls, value: int) -> int:
        if value not in SHOTS:
            raise ValueError(f"shots must be one of {SHOTS} (the paper's settings)")
        return value

    @property
    def answer_reserve(self) -> int:
        """Tokens kept free for the answer (reserve, by default max_new_tokens)."""
        return self.max_new_tokens if self.reserve is None else self.reserve

    def context_room(self, fixed: int | Any, answer_tokens: int = 0) -> int:
        """Epicrisis tokens that fit: N - max(answer, reserve) - the prompt without context.

        `fixed` is the prompt's own length (an int, or anything with `.fixed` such as
        medray.prompts.tokens.PromptPieces); `answer_tokens` the training target (answer +
        EOS), 0 when serving. Negative when even an empty context does not fit.
        """
        n_fixed = fixed if isinstance(fixed, int) else int(fixed.fixed)
        return self.context_tokens - max(answer_tokens, self.answer_reserve) - n_fixed

    def uses_chat_template(self, tokenizer: Any) -> bool:
        """Whether prompts go through `tokenizer`'s chat template: "auto" follows the
        tokenizer (none given: plain text); True without a template is an error."""
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if self.chat_template == "auto":
            return has_template
        if self.chat_template and not has_template:
            what = "no tokenizer was given" if tokenizer is None else "the tokenizer has none"
            raise ValueError(f"prompt.chat_template is true but {what}; use auto or false")
        return bool(self.chat_template)

    def with_chat_template_of(self, tokenizer: Any) -> PromptSpec:
        """This spec with "auto" decided for `tokenizer` (true or false), as recorded."""
        if self.chat_template != "auto":
            return self
        return self.model_copy(update={"chat_template": self.uses_chat_template(tokenizer)})

    def new_tokens(self, configured: int | None = None, protocol: int | None = None) -> int:
        """How many new tokens a request decodes: the budget the caller configured, else
        the protocol's for the item (multiple choice: its dataset and kind), else
        `max_new_tokens`."""
        return configured or protocol or self.max_new_tokens

    def differences(self, other: PromptSpec) -> dict[str, tuple[Any, Any]]:
        """{field: (mine, other's)} for every field that differs."""
        mine, theirs = self.model_dump(), other.model_dump()
        return {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]}


def _set_fields(spec: PromptSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json", exclude_unset=True)


# A `prompt:` section that overrides a model's recorded prompt (Serve, eval configs): it
# serialises only the fields the user wrote, so a config shipped to Serve replicas or Ray
# actors (dumped, then validated again) still overrides only those. A plain PromptSpec
# dumps every field, and every field would then count as set.
PromptOverride = Annotated[PromptSpec, PlainSerializer(_set_fields, return_type=dict)]


# Settings that used to sit beside other keys and now live in a `prompt:` section.
MOVED_TO_PROMPT = {"prompt_format": "prompt.format", "context_tokens": "prompt.context_tokens",
                   "max_new_tokens": "prompt.max_new_tokens", "reserve": "prompt.reserve",
                   "strategy": "prompt.strategy", "chunk_tokens": "prompt.chunk_tokens",
                   "mode": "prompt.strategy"}


def moved_prompt_keys(raw: Any, keys: Sequence[str], where: str = "") -> list[str]:
    """"'KEY' moved to 'prompt.X'" for each old prompt key of `keys` found in mapping `raw`
    (`where`: the section's dotted prefix, e.g. "data.")."""
    if not isinstance(raw, Mapping):
        return []
    return [f"'{where}{k}' moved to '{MOVED_TO_PROMPT[k]}'" for k in keys if k in raw]


def write_prompt_spec(folder: str | os.PathLike, spec: PromptSpec) -> Path:
    """Record the prompt a model was trained with, beside its weights (atomic write)."""
    from medray.io import write_json_atomic

    return write_json_atomic(Path(folder) / PROMPT_FILE, spec.model_dump(mode="json"))


def load_prompt_spec(model_dir: str | os.PathLike) -> PromptSpec | None:
    """The PromptSpec recorded beside a model or adapter; None for a hub id or a folder
    without one (a model medray did not train). A damaged file is an error naming it."""
    path = Path(model_dir) / PROMPT_FILE
    if not path.is_file():
        return None
    try:
        return PromptSpec.model_validate_json(path.read_text())
    except (OSError, ValidationError, ValueError) as exc:
        detail = exc.errors()[0] if isinstance(exc, ValidationError) else exc
        raise ValueError(f"{path}: not a valid prompt spec ({detail})") from None


def resolve_prompt(from_model: PromptSpec | None, override: PromptSpec | None, *,
                   source: str, warn: Any = None) -> PromptSpec:
    """The prompt to use: the model's recorded spec (else the defaults) with the fields the
    config sets explicitly laid over it. A configured field that differs from training is
    used, with a warning naming both values (`warn`, default: stderr)."""
    base = from_model or PromptSpec()
    if override is None:
        return base
    update = {k: getattr(override, k) for k in override.model_fields_set}
    resolved = PromptSpec.model_validate({**base.model_dump(), **update})
    if from_model is not None:
        diff = {k: v for k, v in from_model.differences(resolved).items() if k in update}
        if diff:
            fields = ", ".join(f"{k}: trained with {a!r}, configured {b!r}"
                               for k, (a, b) in diff.items())
            message = (f"prompt settings differ from the ones {source} was trained with "
                       f"({fields}); using the configured values")
            if warn is None:
                import sys

                print(f"warning: {message}", file=sys.stderr, flush=True)
            else:
                warn(message)
    return resolved
