"""The HTTP API's request and response bodies (pydantic; no Ray imports).

Size limits here are hard ceilings that also appear in the OpenAPI document; the
deployment's config (medray/serve_config.py) may set lower ones (checked in limits.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from medray.prompts import PromptSpec

QUESTION_CHARS = 8_000
OPTION_CHARS = 4_000
CONTEXT_CHARS = 2_000_000


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must contain non-whitespace text")
    return value


class QARequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, max_length=QUESTION_CHARS)
    context: str = Field(max_length=CONTEXT_CHARS)
    prompt_format: Literal["qea", "eqa"] | None = None
    context_tokens: int | None = Field(None, ge=16, le=1_000_000)
    # None (these four): as the model's prompt spec says (as trained; see /v1/models)
    strategy: Literal["trim", "chunks", "retrieve"] | None = None
    max_new_tokens: int | None = Field(None, ge=1, le=512)
    # Echo the token ids the LLM received for each prompt (audits; off by default).
    return_prompt_ids: bool = False
    model: str | None = Field(None, max_length=256, description="a name from /v1/models")
    adapter: str | None = Field(None, max_length=256)

    _question = field_validator("question")(_not_blank)


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


class Option(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str = Field(min_length=1, max_length=2, pattern=r"^[A-Za-z0-9]{1,2}$")
    text: str = Field(min_length=1, max_length=OPTION_CHARS)

    _text = field_validator("text")(_not_blank)


class MCQShot(BaseModel):
    """An in-context example: a solved item of the same kind."""

    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, max_length=QUESTION_CHARS)
    options: list[Option] = Field(min_length=2, max_length=10)
    answer: list[str] = Field(min_length=1, max_length=10)


class MCQRequest(BaseModel):
    """One multiple-choice item, asked with its dataset's prompt (medray/eval/mcq.py)."""

    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, max_length=QUESTION_CHARS)
    options: list[Option] = Field(min_length=2, max_length=10)
    kind: Literal["single", "group", "multiple"] = "single"
    dataset: str = Field("robiology", max_length=64, description=(
        "whose prompt and answer format the item gets: a multiple-choice dataset of "
        "medray.datasets (robiology, europemedqa)"))
    question_id: str | None = Field(
        None, max_length=64, pattern=r"^[A-Za-z0-9_:.-]+$",
        description="EuropeMedQA: the id the prompt shows and the reply must start with")
    shots: list[MCQShot] = Field(default_factory=list, max_length=5)
    max_new_tokens: int | None = Field(
        None, ge=1, le=64, description="default: the dataset's minimal budget for the kind")
    model: str | None = Field(None, max_length=256, description="a name from /v1/models")
    adapter: str | None = Field(None, max_length=256)

    _question = field_validator("question")(_not_blank)

    @field_validator("options")
    @classmethod
    def _unique_labels(cls, options: list[Option]) -> list[Option]:
        labels = [o.label for o in options]
        if len(set(labels)) != len(labels):
            raise ValueError(f"option labels repeat: {labels}")
        return options

    @field_validator("dataset")
    @classmethod
    def _mcq_dataset(cls, name: str) -> str:
        from medray.datasets import DATASETS

        choices = [n for n, spec in DATASETS.items() if spec.kind == "mcq"]
        if name not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {name!r}")
        return name

    @model_validator(mode="after")
    def _id_when_the_reply_carries_it(self) -> MCQRequest:
        from medray.datasets import dataset_spec

        if dataset_spec(self.dataset).id_prefix and not self.question_id:
            raise ValueError(f"question_id: required for dataset {self.dataset} (the "
                             "protocol's prompt shows it and the reply starts with it)")
        return self

    def item(self) -> dict:
        """The request as a prepared item (the shape medray/eval/mcq.py renders)."""
        return {"id": self.question_id or "item", "dataset": self.dataset, "kind": self.kind,
                "question": self.question, "options": [o.model_dump() for o in self.options],
                "meta": {"original_id": self.question_id} if self.question_id else {},
                "images": []}

    def shot_set(self) -> dict[str, list[dict]]:
        return {self.kind: [{"question": s.question, "kind": self.kind, "dataset": self.dataset,
                             "options": [o.model_dump() for o in s.options],
                             "answer": list(s.answer)} for s in self.shots]}


class MCQResponse(BaseModel):
    answer: list[str]
    conforming: bool
    raw: str
    prompt_tokens: int = Field(description="tokens of the rendered prompt")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "medray"
    root: str = Field(description="the served base model (or merged model) path")
    parent: str | None = Field(None, description="for an adapter: the model it rides on")
    prompt: PromptSpec | None = Field(
        None, description="how /v1/qa prompts it: as trained unless the config overrides")


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
