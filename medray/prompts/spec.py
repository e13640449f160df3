"""Every prompt format, in one place: training, serving and evaluation all render here.

MedQARo strings are the reference code's, character for character (docs/benchmarks.md).
RoBiology prompts are the paper's Appendix B (user prompt per kind; few-shot examples go
in the system prompt). The EuropeMedQA prompt is the protocol's strict system/user pair.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
)

MedqaroFormat = Literal["qea", "eqa"]
MEDQARO_FORMATS: tuple[str, ...] = ("qea", "eqa")
CONTEXT_SLOT = "{context}"

# ---------------------------------------------------------------- MedQARo (generative)

_MEDQARO_TEMPLATES = {
    # Question + Epicrisis + Answer: the paper's best and the reference code's format.
    "qea": "Intrebare: {question} Context: {context} Raspuns:",
    # Epicrisis first: the paper's alternative; shares the epicrisis as a prefix across
    # all questions of a patient, which is what prefix caching exploits.
    "eqa": "Context: {context} Intrebare: {question} Raspuns:",
}


def _check_format(fmt: str) -> None:
    if fmt not in _MEDQARO_TEMPLATES:
        raise ValueError(f"unknown prompt format {fmt!r}; expected one of {MEDQARO_FORMATS}")


def medqaro_prompt(question: str, context: str, fmt: str = "qea") -> str:
    """The reference prompt: f"Intrebare: {q} Context: {trimmed_epicrisis} Raspuns:"."""
    _check_format(fmt)
    return _MEDQARO_TEMPLATES[fmt].format(question=question, context=context)


def medqaro_prompt_parts(question: str, fmt: str = "qea") -> tuple[str, str]:
    """(text before the epicrisis, text after it) for token-level assembly and trimming."""
    _check_format(fmt)
    template = _MEDQARO_TEMPLATES[fmt].format(question=question, context=CONTEXT_SLOT)
    before, after = template.split(CONTEXT_SLOT)
    return before, after


def medqaro_target(prompt: str, answer: str) -> str:
    """The reference training target: prompt + " " + answer."""
    return f"{prompt} {answer}"


# ------------------------------------------------------------------- the prompt contract

SHOTS = (0, 1, 3, 5)
TRAIN_STRATEGIES = ("trim", "chunks")  # retrieve is an inference-time strategy
PROMPT_FILE = "prompt.json"  # beside every exported adapter and merged model
REFERENCE_MAX_NEW_TOKENS = 10  # the reference code decodes at most 10 new tokens


class PromptSpec(BaseModel):
    """How a model is prompted: training writes it beside the adapter (`prompt.json`),
    serving and evaluation read it back, so a fine-tuned model is asked exactly as trained.

    `context_tokens` is the whole budget N: prompt (question + trimmed epicrisis) plus the
    `reserve` kept free for the answer. The context room is computed only here
    (`context_room`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: MedqaroFormat = "qea"
    context_tokens: int = Field(2048, ge=8)
    max_new_tokens: int = Field(REFERENCE_MAX_NEW_TOKENS, ge=1, le=4096)
    # Tokens kept free for the answer inside context_tokens; None = max_new_tokens (then
    # the training prompt is the served one, whatever the answer's length).
    reserve: int | None = Field(None, ge=0)
    strategy: Literal["trim", "chunks", "retrieve"] = "trim"  # training: trim | chunks
    chunk_tokens: int | None = Field(None, ge=1)  # chunks/retrieve piece size; None = room
    chat_template: bool = False  # the papers used none
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

    def chat_text(self, tokenizer: Any, chat: ChatPrompt) -> str:
        """The one place a chat template is applied: only with `chat_template` on (and a
        tokenizer that has one); otherwise the flattened system + user text."""
        if self.chat_template and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(chat.messages(), tokenize=False,
                                                 add_generation_prompt=True)
        return chat.text

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


# ------------------------------------------------------- multiple choice (RoBiology)

_ROBIOLOGY_USER = {
    "single": (
        "{question}\n\n"
        "You received a biology question in Romanian with multiple options. The biology "
        "question is collected from either national high school olympiads or admission "
        "exams for medical universities. Only one answer is correct.\n\n"
        "You will output only the letter of the right answer. Do not give any explanations."
        "\n\nThe letter of the right answer is:"
    ),
    "group": (
        "{question}\n\n"
        "You received a biology question in Romanian with multiple numbered options. The "
        "question is from national high school olympiads or medical university admission "
        "exams.\n\n"
        "To answer:\n"
        "1. Identify correct options.\n"
        "2. If only option 4 is correct, the answer must be D.\n"
        "3. If only options 1,3 are correct, the answer must be B.\n"
        "4. If only options 2,4 are correct, the answer must be C.\n"
        "5. If only options 1,2,3 are correct, the answer must be A.\n"
        "6. If all options are correct, the answer must be E.\n\n"
        "Do not give any explanations.\n\n"
        "The right answer is:"
    ),
    "multiple": (
        "{question}\n\n"
        "You received a biology question in Romanian with multiple options. The question "
        "is from national high school olympiads or medical university admission exams. One "
        "or multiple answers are correct.\n\n"
        "You will output the letter(s) of all the correct answers. Do not give any "
        "explanations.\n\n"
        "The letters of the right answers, as compact as possible, are:"
    ),
}

_ROBIOLOGY_SYSTEM_HEAD = {
    "single": "Here are some examples of biology questions in Romanian with multiple options "
    "and the correct format for answering them:",
    "group": "Here are some examples of biology questions in Romanian with multiple numbered "
    "options and the correct format for answering them:",
    "multiple": "Here are some examples of biology questions in Romanian with multiple "
    "options and the correct format for answering them:",
}



@dataclass(frozen=True)
class ChatPrompt:
    """A system + user pair; `text` flattens it for engines without chat roles."""

    system: str | None
    user: str

    @property
    def text(self) -> str:
        return f"{self.system}\n\n{self.user}" if self.system else self.user

    def messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": "user", "content": self.user}]


def format_question_text(question: str, options: Sequence[Mapping[str, str]]) -> str:
    """%question-text%: the question, then one line per option ("A. ..." or "1. ...")."""
    lines = [question] + [f"{o['label']}. {o['text']}" for o in options]
    return "\n".join(lines)


def _shot_block(shot: Mapping[str, Any], kind: str) -> str:
    body = format_question_text(f"# Question: {shot['question']}", shot["options"])
    answer = "".join(shot["answer"])
    if kind == "group":
        from medray.data.schema import GROUP_CODES

        true = sorted(GROUP_CODES[answer])
        false = [n for n in (1, 2, 3, 4) if n not in true]
        verb = "is" if len(true) == 1 else "are"
        explanation = f"{','.join(map(str, true))} {verb} correct"
        if false:
            explanation += f"; {','.join(map(str, false))} {'is' if len(false) == 1 else 'are'} not"
        body += f"\n# Explanation: {explanation}"
    return f"{body}\n# Answer: {answer}"


def robiology_prompt(
    question: str,
    options: Sequence[Mapping[str, str]],
    kind: str,
    shots: Sequence[Mapping[str, Any]] = (),
) -> ChatPrompt:
    """Appendix B: the user prompt per kind; k-shot examples (k in 0/1/3/5) in the system."""
    if kind not in _ROBIOLOGY_USER:
        raise ValueError(f"unknown question kind {kind!r}; expected single|group|multiple")
    if len(shots) not in SHOTS:
        raise ValueError(f"{len(shots)} shots given; the paper uses {SHOTS}")
    user = _ROBIOLOGY_USER[kind].format(question=format_question_text(question, options))
    system = None
    if shots:
        blocks = "\n—\n".join(_shot_block(s, kind) for s in shots)
        system = f"{_ROBIOLOGY_SYSTEM_HEAD[kind]}\n\n{blocks}"
    return ChatPrompt(system=system, user=user)


# ------------------------------------------------------ multiple choice (EuropeMedQA)

EUROPEMEDQA_SYSTEM_SINGLE = (
    "You are answering a medical examination question. Exactly one option is correct. "
    "Reply with the question ID and the letter of the correct option only, in the form "
    "'<QuestionID>: <letter>'. No explanations, no other text."
)
EUROPEMEDQA_SYSTEM_MULTI = (
    "You are answering a medical examination question. One or more options may be "
    "correct. Reply with the question ID and the letters of ALL correct options only, in "
    "the form '<QuestionID>: <letters>' (for example 'FR0001: A,C'). No explanations, no "
    "other text."
)


def europemedqa_prompt(
    question_id: str, question: str, options: Sequence[Mapping[str, str]], multi: bool = False
) -> ChatPrompt:
    """The protocol's strict prompt: question id, question text, options A-E, answer only."""
    user = f"QuestionID: {question_id}\n{format_question_text(question, options)}"
    system = EUROPEMEDQA_SYSTEM_MULTI if multi else EUROPEMEDQA_SYSTEM_SINGLE
    return ChatPrompt(system=system, user=user)


def europemedqa_item_prompt(example: Mapping[str, Any],
                            shots: Sequence[Mapping[str, Any]] = ()) -> ChatPrompt:
    """A prepared EuropeMedQA item. The multi-answer variant is chosen by the item's kind
    (France's subset is "multiple"), never by its key, so the prompt does not leak how many
    options are correct."""
    if shots:
        raise ValueError("the EuropeMedQA protocol uses no in-context examples")
    meta = example.get("meta") or {}
    if isinstance(meta, str):
        meta = json.loads(meta)
    question_id = meta.get("original_id") or str(example["id"])
    return europemedqa_prompt(question_id, example["question"], list(example["options"]),
                              multi=example["kind"] == "multiple")


def robiology_item_prompt(example: Mapping[str, Any],
                          shots: Sequence[Mapping[str, Any]] = ()) -> ChatPrompt:
    """A prepared RoBiology item (Appendix B prompt of its kind)."""
    return robiology_prompt(example["question"], list(example["options"]), example["kind"], shots)
