"""Every prompt text, in one place: training, serving and evaluation all render here.

MedQARo strings are the reference code's, character for character (docs/benchmarks.md).
RoBiology prompts are the paper's Appendix B (user prompt per kind; few-shot examples go
in the system prompt). The EuropeMedQA prompt is the protocol's strict system/user pair.
Multiple-choice items are rendered with their dataset's prompt (`DatasetSpec.prompt`) and
k shots from the train split (`pick_shots`: seeded, the same shots for every item of a
kind); group items can be asked as multiple choice over their statements
(`group_as_multiple`). `prompt_text` is the one place a chat template is applied.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from medray.data.registry import dataset_spec
from medray.data.schema import GROUP_CODES
from medray.prompts.spec import MEDQARO_FORMATS, SHOTS, PromptSpec

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

    def messages(self, n_images: int = 0) -> list[dict[str, Any]]:
        """The chat messages; with `n_images`, the user turn is content parts: the images
        first (where a vision-language model's template puts their tokens), then the text."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        user: Any = self.user
        if n_images:
            user = [{"type": "image"}] * n_images + [{"type": "text", "text": self.user}]
        return head + [{"role": "user", "content": user}]


def format_question_text(question: str, options: Sequence[Mapping[str, str]]) -> str:
    """%question-text%: the question, then one line per option ("A. ..." or "1. ...")."""
    lines = [question] + [f"{o['label']}. {o['text']}" for o in options]
    return "\n".join(lines)


def _shot_block(shot: Mapping[str, Any], kind: str) -> str:
    body = format_question_text(f"# Question: {shot['question']}", shot["options"])
    answer = "".join(shot["answer"])
    if kind == "group":
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
    return europemedqa_prompt(question_id(example), example["question"],
                              list(example["options"]), multi=example["kind"] == "multiple")


def robiology_item_prompt(example: Mapping[str, Any],
                          shots: Sequence[Mapping[str, Any]] = ()) -> ChatPrompt:
    """A prepared RoBiology item (Appendix B prompt of its kind)."""
    return robiology_prompt(example["question"], list(example["options"]), example["kind"], shots)


# ---------------------------------------------------------- the one chat-template site


def prompt_text(prompt: ChatPrompt, tokenizer: Any = None, spec: PromptSpec | None = None,
                n_images: int = 0, image_token: str = "<image>") -> str:
    """What a text-completion engine reads: the tokenizer's chat template where the spec
    uses it (`PromptSpec.uses_chat_template`), otherwise the flattened system + user text.

    A template that writes the BOS token itself loses it here when the tokenizer adds one
    on encoding: the text is always encoded with the tokenizer's special tokens (training,
    the engines, Serve), so the model sees one BOS, templated or not.

    `n_images`: the item's images for a vision-language model, placed by its chat template
    (image parts before the text), or without a template as `image_token`s before the text;
    the model's processor expands each into the image's tokens."""
    if not (spec or PromptSpec()).uses_chat_template(tokenizer):
        return image_token * n_images + prompt.text
    text = tokenizer.apply_chat_template(prompt.messages(n_images), tokenize=False,
                                         add_generation_prompt=True)
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        text = text[len(bos):]
    return text


def _adds_bos(tokenizer: Any) -> bool:
    bos_id = getattr(tokenizer, "bos_token_id", None)
    return bos_id is not None and tokenizer.encode("x", add_special_tokens=True)[:1] == [bos_id]


# ------------------------------------------------------- multiple-choice items and shots


def meta_dict(meta: Any) -> dict:
    if isinstance(meta, str):
        return json.loads(meta) if meta else {}
    return dict(meta or {})


def example_dict(row: Any) -> dict:
    """A prepared row with plain-Python options/answer/images (parquet gives numpy arrays)."""
    ex = dict(row)
    ex["options"] = [{"label": str(o["label"]), "text": str(o["text"])} for o in ex["options"]]
    ex["answer"] = [str(a) for a in ex.get("answer", [])]
    images = ex.get("images")
    ex["images"] = [str(p) for p in (images if images is not None else [])]
    return ex


def question_id(ex: Mapping[str, Any]) -> str:
    return str(meta_dict(ex.get("meta")).get("original_id") or ex["id"])


def pick_shots(examples: Any, kind: str, k: int, seed: int) -> list[dict]:
    """k train items of `kind` (a prepared examples DataFrame), drawn without replacement
    with `seed`, in table order."""
    import numpy as np

    if k == 0:
        return []
    pool = examples[(examples["split"] == "train") & (examples["kind"] == kind)]
    if len(pool) < k:
        raise ValueError(f"{k}-shot prompts need {k} train items of kind {kind!r}; "
                         f"the prepared data has {len(pool)}")
    idx = np.sort(np.random.default_rng(seed).choice(len(pool), size=k, replace=False))
    return [example_dict(pool.iloc[i]) for i in idx]


def shot_sets(examples: Any, kinds: Sequence[str], k: int, seed: int
              ) -> dict[str, list[dict]]:
    return {kind: pick_shots(examples, kind, k, seed) for kind in sorted(set(kinds))}


def asked_kind(ex: Mapping[str, Any], group_as_multiple: bool) -> str:
    return "multiple" if ex["kind"] == "group" and group_as_multiple else str(ex["kind"])


def _as_statement_shot(shot: dict) -> dict:
    return {**shot, "kind": "multiple",
            "answer": [str(n) for n in sorted(GROUP_CODES[shot["answer"][0]])]}


def mcq_prompt(ex: Mapping[str, Any], shots: Sequence[Mapping[str, Any]] = ()) -> ChatPrompt:
    """The prompt of a multiple-choice item: its dataset's (`DatasetSpec.prompt`)."""
    return dataset_spec(str(ex["dataset"])).prompt_fn()(ex, shots)


def render(ex: Mapping[str, Any], shots: Mapping[str, Sequence[dict]] | None = None,
           group_as_multiple: bool = False) -> ChatPrompt:
    """The item's system/user prompt (shots: per kind, from `shot_sets`)."""
    shots = shots or {}
    if ex["kind"] == "group" and group_as_multiple:
        asked = {**ex, "kind": "multiple"}
        return mcq_prompt(asked, [_as_statement_shot(s) for s in shots.get("group", [])])
    return mcq_prompt(ex, list(shots.get(str(ex["kind"]), [])))


def protocol_budget(ex: Mapping[str, Any], group_as_multiple: bool = False) -> int | None:
    """The protocol's minimal output budget for the item's dataset and asked kind (None:
    the protocol sets none; `PromptSpec.new_tokens` decides)."""
    kind = "group_as_multiple" if ex["kind"] == "group" and group_as_multiple else ex["kind"]
    return dataset_spec(str(ex["dataset"])).budget(str(kind))


def loglik_prompt(ex: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The log-likelihood form, lm-evaluation-harness ARC style: (the context
    "Question: ...\\nAnswer:", one continuation " option text" per option)."""
    return f"Question: {ex['question']}\nAnswer:", [" " + o["text"] for o in ex["options"]]
