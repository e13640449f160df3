"""The HTTP API's request and response bodies (pydantic; no Ray imports).

The request models are built per deployment from its configured limits (`Limits.of`):
the ingress validates every body with the very models /openapi.json shows, so the
document states each bound, required field and uniqueness rule the service enforces.
Validation is strict (no coercion: `0` is not a boolean, `"3"` not an integer).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    create_model,
    field_validator,
    model_validator,
)

from medray.data.images import DATA_URL
from medray.engines.vllm import MAX_IMAGES_PER_PROMPT
from medray.prompts.spec import PromptSpec

# A string that holds text: at least one character that is neither whitespace nor a control
# character (pydantic's and JSON Schema's `pattern` both search, unanchored).
HAS_TEXT = r"[^\s\x00-\x1f\x7f-\x9f]"
# Option labels: letters, or the numbers 1-10 (RoBiology's group items number their
# statements). A finite set, so the schema can state that labels do not repeat.
LABELS: tuple[str, ...] = (*string.ascii_uppercase, *string.ascii_lowercase,
                           *(str(i) for i in range(1, 11)))
MAX_OPTIONS = 10
STRICT = ConfigDict(extra="forbid", strict=True)
MCQ_MAX_NEW_TOKENS = 64  # a protocol's reply is a question id and a few letters
# An image in a request: a data URL (the server fetches nothing); its bytes are checked
# after the schema (medray.data.images.decode_data_url).
IMAGE_URL = Annotated[str, Field(pattern=DATA_URL.pattern, description=(
    "a PNG, JPEG, GIF or WebP image as a data URL (data:image/png;base64,...), at most "
    "max_image_bytes once decoded; remote URLs are refused"))]


def _json_integer(value: Any) -> Any:
    """JSON Schema's integers include 1.0; strict validation otherwise takes ints only."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def ints(low: int, high: int) -> Any:
    """An integer in [low, high] (the bounds inside: a union with None keeps them)."""
    return Annotated[int, Field(ge=low, le=high), BeforeValidator(_json_integer)]


@dataclass(frozen=True)
class Limits:
    """The bounds the request models state; `Limits.of(cfg, max_token_id)` per deployment."""

    text_chars: int = 8_000
    context_chars: int = 400_000
    context_tokens: int = 2048
    max_model_len: int = 2048
    max_n: int = 8
    max_logprobs: int = 20
    max_batch: int = 64
    max_questions: int = 64
    max_token_id: int = 2**31 - 1
    lora: bool = False  # LoRA adapters served: prompt log-probs one sequence at a time
    images: int = 0  # images per request; 0 when no served model takes images

    @classmethod
    def of(cls, cfg: Any, max_token_id: int) -> Limits:
        vision = any(cfg.takes_images(name) for name in (cfg.model_id, *cfg.models))
        return cls(text_chars=cfg.max_text_chars, context_chars=cfg.max_context_chars,
                   context_tokens=cfg.context_limit,
                   max_model_len=cfg.max_model_len, max_n=cfg.max_n,
                   max_logprobs=cfg.max_logprobs, max_batch=cfg.max_batch,
                   max_questions=cfg.max_questions,
                   max_token_id=max_token_id, lora=bool(cfg.adapters or cfg.lora_uri),
                   images=MAX_IMAGES_PER_PROMPT if vision else 0)


def prompt_field(name: str, high: int | None = None) -> Any:
    """PromptSpec's field `name` as an optional request field: its type and bounds (an
    integer's upper bound lowered to `high`, what the deployment serves); None keeps the
    served model's own value (its prompt spec, see /v1/models)."""
    info = PromptSpec.model_fields[name]
    if info.annotation is not int:
        return info.annotation | None
    low = next(m.ge for m in info.metadata if hasattr(m, "ge"))
    bounds = [m.le for m in info.metadata if hasattr(m, "le")] + ([high] if high else [])
    return ints(low, min(bounds)) | None


def text(max_chars: int, **kw: Any) -> Any:
    return Field(min_length=1, max_length=max_chars, pattern=HAS_TEXT, **kw)


# ------------------------------------------------------------------ /v1/qa
class QABase(BaseModel):
    model_config = STRICT
    # PromptSpec's `format`, under the name clients send; None (these): as the model's
    # prompt spec says (as trained; see /v1/models).
    prompt_format: prompt_field("format") = None  # type: ignore[valid-type]
    strategy: prompt_field("strategy") = None  # type: ignore[valid-type]
    # Echo the token ids the LLM received for each prompt (audits; off by default).
    return_prompt_ids: bool = False
    model: str | None = Field(None, max_length=256, description="a name from /v1/models")
    adapter: str | None = Field(None, max_length=256)


def _qa_options(lim: Limits) -> dict[str, Any]:
    """The fields /v1/qa and /v1/qa/batch share: the context and the prompt settings."""
    return {
        "context": (str, text(lim.context_chars, description=(
            "the patient's record; it must hold text (not only whitespace or control "
            "characters). With strategy chunks it may give at most max_batch prompts of "
            "context_tokens each per question, else a 400"))),
        "context_tokens": (prompt_field("context_tokens", lim.context_tokens),
                           Field(None, description=(
            "token budget of each prompt (max_context_tokens, at most max_model_len); a "
            "question that alone does not fit it is a 400"))),
        "max_new_tokens": (prompt_field("max_new_tokens", lim.max_model_len), Field(None)),
    }


def qa_model(lim: Limits) -> type[BaseModel]:
    return create_model("QARequest", __base__=QABase,
                        question=(str, text(lim.text_chars)), **_qa_options(lim))


def qa_batch_model(lim: Limits) -> type[BaseModel]:
    return create_model(
        "QABatchRequest", __base__=QABase,
        __doc__="One patient's questions over their shared record, answered as /v1/qa "
                "answers each (the record tokenised once, the prompts sent together).",
        questions=(list[Annotated[str, text(lim.text_chars)]], Field(  # type: ignore[valid-type]
            min_length=1, max_length=lim.max_questions, description=(
                f"the questions, answered in this order; at most max_questions "
                f"({lim.max_questions})"))),
        **_qa_options(lim))


class QAResponse(BaseModel):
    answer: str
    logprob: float | None
    prompt_tokens: int
    strategy: str
    model: str
    adapter: str | None
    prompt: PromptSpec = Field(description="the prompt settings used (request over model)")
    prompt_ids: list[list[int]] | None = Field(
        None, description="with return_prompt_ids: the ids the LLM received, per prompt")


class QABatchResponse(BaseModel):
    answers: list[QAResponse] = Field(description="one per question, in the request's order")


# ------------------------------------------------------------------ /v1/mcq
def _distinct_labels(schema: dict[str, Any]) -> None:
    """JSON Schema has no "unique by field"; over a finite label set it is "each label at
    most once" (`contains` + `maxContains`, JSON Schema 2020-12, OpenAPI 3.1)."""
    schema["allOf"] = [{"contains": {"properties": {"label": {"const": label}}},
                        "minContains": 0, "maxContains": 1} for label in LABELS]
    schema["description"] = "option labels do not repeat"


def _check_distinct(options: list[Any]) -> list[Any]:
    labels = [o.label for o in options]
    if len(set(labels)) != len(labels):
        raise ValueError(f"option labels repeat: {labels}")
    return options


def _is(field: str, value: str, default: str | None = None) -> dict[str, Any]:
    """JSON Schema `if` for "field is value" (a default also matches an absent field)."""
    given = {"properties": {field: {"const": value}}, "required": [field]}
    return {"anyOf": [given, {"not": {"required": [field]}}]} if value == default else given


def _mcq_rules(schema: dict[str, Any]) -> None:
    """The dataset's protocol, stated in the schema: which datasets need a question id, how
    many shots each allows, a group item's answer (one group letter)."""
    from medray.data.registry import DATASETS

    rules: list[dict[str, Any]] = []
    for name, spec in DATASETS.items():
        if spec.kind != "mcq":
            continue
        then: dict[str, Any] = {"properties": {"shots": {"anyOf": [
            {"minItems": k, "maxItems": k} for k in spec.shots]}}}
        if spec.id_prefix:
            then["required"] = ["question_id"]
            then["properties"]["question_id"] = {"type": "string"}
        rules.append({"if": _is("dataset", name, DEFAULT_DATASET), "then": then})
    rules.append({"if": _is("kind", "group"), "then": {"properties": {"shots": {"items": {
        "properties": {"answer": {"maxItems": 1, "items": {"enum": list(GROUP_LETTERS)}}}}}}}})
    schema.setdefault("allOf", []).extend(rules)


DEFAULT_DATASET = "robiology"
GROUP_LETTERS = ("A", "B", "C", "D", "E")


def mcq_models(lim: Limits) -> type[BaseModel]:
    from medray.data.registry import DATASETS

    option = create_model("Option", __config__=STRICT,
                          label=(Literal[LABELS], ...),  # type: ignore[valid-type]
                          # No length of its own: the body size and the context window bound
                          # it (a per-option maxLength makes the label rule too costly for
                          # schema-driven generators to satisfy).
                          text=(str, Field(min_length=1, pattern=HAS_TEXT)))
    options = (list[option], Field(min_length=2, max_length=MAX_OPTIONS,  # type: ignore
                                   json_schema_extra=_distinct_labels))
    shot = create_model(
        "MCQShot", __config__=STRICT, __doc__="An in-context example: a solved item.",
        __validators__={"distinct": field_validator("options")(_check_distinct)},
        question=(str, text(lim.text_chars)), options=options,
        answer=(list[Literal[LABELS]], Field(min_length=1, max_length=MAX_OPTIONS)))  # type: ignore
    datasets = tuple(n for n, spec in DATASETS.items() if spec.kind == "mcq")
    validators = {"distinct": field_validator("options")(_check_distinct)}
    if not lim.images:
        validators["no_images"] = field_validator("images")(no_images)
    return create_model(
        "MCQRequest", __base__=MCQBase, __validators__=validators,  # type: ignore[arg-type]
        question=(str, text(lim.text_chars)), options=options,
        dataset=(Literal[datasets], Field(DEFAULT_DATASET, description=(  # type: ignore
            "whose prompt and answer format the item gets (medray.data.registry)"))),
        shots=(list[shot], Field(default_factory=list, max_length=max(  # type: ignore
            k for spec in DATASETS.values() for k in spec.shots))),
        images=(list[IMAGE_URL], images_field(lim.images, "the item's images, shown before "  # type: ignore
                                              "the question as the model's chat template "
                                              "places them")),
    )


def images_field(most: int, what: str) -> Any:
    """A list of at most `most` images; a deployment with no vision-language model states
    (maxItems 0) and says (a validator's message) that it takes none."""
    if most:
        return Field(default_factory=list, max_length=most, description=(
            f"{what}; at most {most}, only for a model whose /v1/models card says `images: "
            "true` (else a 400)"))
    return Field(default_factory=list, json_schema_extra={"maxItems": 0},
                 description="no served model takes images (none is a vision-language model)")


def no_images(value: list[Any]) -> list[Any]:
    if value:
        raise ValueError("no served model takes images (none is a vision-language model)")
    return value


class MCQBase(BaseModel):
    """One multiple-choice item, asked with its dataset's prompt (medray/prompts/text.py)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_mcq_rules)
    kind: Literal["single", "group", "multiple"] = "single"
    question_id: str | None = Field(
        None, max_length=64, pattern=r"^[A-Za-z0-9_:.-]+$",
        description="EuropeMedQA: the id the prompt shows and the reply must start with")
    max_new_tokens: prompt_field("max_new_tokens", MCQ_MAX_NEW_TOKENS) = Field(  # type: ignore[valid-type]
        None, description="default: the dataset's minimal budget for the kind")
    model: str | None = Field(None, max_length=256, description="a name from /v1/models")
    adapter: str | None = Field(None, max_length=256)

    @model_validator(mode="after")
    def _protocol(self) -> MCQBase:
        from medray.data.registry import dataset_spec

        spec = dataset_spec(self.dataset)  # type: ignore[attr-defined]
        shots = self.shots  # type: ignore[attr-defined]
        if spec.id_prefix and not self.question_id:
            raise ValueError(f"question_id: required for dataset {self.dataset} (the "  # type: ignore[attr-defined]
                             "protocol's prompt shows it and the reply starts with it)")
        if len(shots) not in spec.shots:
            raise ValueError(f"shots: {len(shots)} given; {spec.name} allows {spec.shots}")
        if self.kind == "group" and any(len(s.answer) != 1 or s.answer[0] not in GROUP_LETTERS
                                        for s in shots):
            raise ValueError(f"shots: a group item's answer is one of {GROUP_LETTERS}")
        return self

    def item(self) -> dict:
        """The request as a prepared item (the shape medray/prompts/text.py renders)."""
        d: Any = self
        return {"id": self.question_id or "item", "dataset": d.dataset, "kind": self.kind,
                "question": d.question, "options": [o.model_dump() for o in d.options],
                "meta": {"original_id": self.question_id} if self.question_id else {},
                "images": []}

    def shot_set(self) -> dict[str, list[dict]]:
        d: Any = self
        return {self.kind: [{"question": s.question, "kind": self.kind, "dataset": d.dataset,
                             "options": [o.model_dump() for o in s.options],
                             "answer": list(s.answer)} for s in d.shots]}


class MCQResponse(BaseModel):
    answer: list[str]
    conforming: bool
    raw: str
    prompt_tokens: int = Field(description="tokens of the rendered prompt")


# ------------------------------------------------------------------ other bodies
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "medray"
    root: str = Field(description="the served base model (or merged model) path")
    parent: str | None = Field(None, description="for an adapter: the model it rides on")
    max_model_len: int = Field(description=(
        "context window in tokens: prompt plus generated tokens (a longer prompt is a 400)"))
    prompt: PromptSpec | None = Field(
        None, description="how /v1/qa prompts it: as trained unless the config overrides")
    images: bool = Field(False, description=(
        "a vision-language model: /v1/mcq `images` and chat image parts reach it (else "
        "they are a 400)"))


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    model: str
    detail: str | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: int
    param: str | None = None


class ErrorBody(BaseModel):
    """The OpenAI error shape, used for every non-2xx answer."""

    error: ErrorDetail
