"""medray's own request models of /v1/completions and /v1/chat/completions.

They cover the fields real clients send (the OpenAI Python SDK, lm-evaluation-harness's
local-completions / local-chat-completions) plus the vLLM fields medray's own clients use,
with this deployment's bounds; unknown fields are refused. The validated body is passed on
to vLLM's CompletionRequest / ChatCompletionRequest. Rules spanning fields are stated with
JSON Schema's `if`/`then` and `dependentRequired`, and checked by the same models.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, create_model, model_validator

from medray.engines.vllm import MAX_IMAGES_PER_PROMPT
from medray.serve.schemas import (
    IMAGE_URL,
    STRICT,
    Limits,
    ints,
    mcq_models,
    qa_batch_model,
    qa_model,
)

INT64 = 2**63 - 1
MAX_STOPS = 16
MAX_TOOLS = 128


def int_range_pattern(high: int) -> str:
    """A regex of the decimal numbers 0..high (no leading zeros), for token-id keys."""
    digits = str(high)
    parts = ["0", *(f"[1-9][0-9]{{{n - 1}}}" if n > 1 else "[1-9]" for n in
                    range(1, len(digits)))]
    for i, d in enumerate(digits):  # same length as high: a smaller digit at position i
        low = "1" if i == 0 else "0"
        if int(d) > int(low):
            rest = len(digits) - i - 1
            parts.append(digits[:i] + f"[{low}-{int(d) - 1}]" + (f"[0-9]{{{rest}}}" if rest
                                                                   else ""))
    parts.append(digits)
    return "^(" + "|".join(parts) + ")$"


def _no_other_keys(schema: dict[str, Any]) -> None:
    """pydantic states the key pattern as patternProperties; no other key is taken."""
    for alt in schema.get("anyOf", [schema]):
        if alt.get("type") == "object":
            alt["additionalProperties"] = False


def _null_unless(field: str, value: Any, other: str) -> dict[str, Any]:
    """`other` may only be set when `field` is `value`."""
    return {"if": {"not": {"properties": {field: {"const": value}}, "required": [field]}},
            "then": {"properties": {other: {"type": "null"}}}}


class OpenAIBase(BaseModel):
    model_config = STRICT
    model: str | None = Field(None, max_length=256, description="a name from /v1/models")
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    # vLLM takes any positive value; a tiny one divides the logits towards infinity.
    repetition_penalty: float | None = Field(None, ge=0.05, le=2, description="vLLM's")
    seed: ints(-INT64 - 1, INT64) | None = Field(
None)
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: ints(-1, 2**31 - 1) | None = Field(None, description="vLLM's; -1 or 0: off")
    min_p: float | None = Field(None, ge=0, le=1, description="vLLM's")
    user: str | None = Field(None, max_length=256)
    ignore_eos: bool = Field(False, description="vLLM's: generate past the end-of-text token")
    return_token_ids: bool | None = Field(
        None, description="vLLM's: the prompt's and the completion's token ids")

    def engine_body(self) -> dict[str, Any]:
        """What vLLM's request model receives: the fields the client set."""
        return self.model_dump(exclude_unset=True)

    @model_validator(mode="after")
    def _stream_options(self) -> OpenAIBase:
        if getattr(self, "stream_options", None) is not None and not self.stream:
            raise ValueError("stream_options: only with stream true")
        return self


def _common(lim: Limits) -> dict[str, Any]:
    stop = Annotated[str, Field(min_length=1, max_length=lim.text_chars)]
    key = Annotated[str, Field(pattern=int_range_pattern(lim.max_token_id))]
    bias = Annotated[float, Field(ge=-100, le=100)]
    options = create_model("StreamOptions", __config__=STRICT,
                           include_usage=(bool | None, None),
                           continuous_usage_stats=(bool | None, None))
    return {
        "n": (ints(1, lim.max_n), Field(1)),
        "stop": (stop | Annotated[list[stop], Field(max_length=MAX_STOPS)] | None,
                 Field(None, description=f"at most {MAX_STOPS} sequences")),
        "logit_bias": (dict[key, bias] | None, Field(None, max_length=300, description=(
            "token id (as a string, within the vocabulary) -> bias"),
            json_schema_extra=_no_other_keys)),
        "stream_options": (options | None, Field(None, description="only with stream")),
    }


def _completion_rules(schema: dict[str, Any]) -> None:
    schema["allOf"] = [
        _null_unless("stream", True, "stream_options"),
        {"if": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
         "then": {"properties": {"prompt_logprobs": {"type": "null"}}}},
        # max_tokens 0 scores the prompt only (echo: its log-probs), as vLLM's server does
        {"if": {"not": {"properties": {"echo": {"const": True}}, "required": ["echo"]}},
         "then": {"properties": {"max_tokens": {"anyOf": [{"type": "integer", "minimum": 1},
                                                          {"type": "null"}]}}}},
    ]


class CompletionBase(OpenAIBase):
    model_config = {**STRICT, "json_schema_extra": _completion_rules}
    echo: bool = False

    @model_validator(mode="after")
    def _rules(self) -> CompletionBase:
        d: Any = self
        if d.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens: 0 only with echo true (the prompt's log-probs)")
        if d.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs: not with stream")
        return self


# With LoRA served, a prompt-log-prob sequence runs alone in the engine (medray/serve/llm.py):
# one request per prompt, so one choice per prompt and no stream of several prompts.
PROMPT_LOGPROBS = {"anyOf": [
    {"properties": {"echo": {"const": True}, "logprobs": {"type": "integer"}},
     "required": ["echo", "logprobs"]},
    {"properties": {"prompt_logprobs": {"type": "integer"}}, "required": ["prompt_logprobs"]}]}
SEVERAL_STREAMED = {"properties": {"stream": {"const": True}, "prompt": {
    "type": "array", "minItems": 2, "items": {"type": ["string", "array"]}}},
    "required": ["stream", "prompt"]}


def _lora_rules(schema: dict[str, Any]) -> None:
    _completion_rules(schema)
    schema["allOf"].append({"if": PROMPT_LOGPROBS, "then": {
        "properties": {"n": {"const": 1}}, "not": SEVERAL_STREAMED}})


class CompletionLoRABase(CompletionBase):
    """The rules of a deployment that serves LoRA adapters."""

    model_config = {**STRICT, "json_schema_extra": _lora_rules}

    @model_validator(mode="after")
    def _one_at_a_time(self) -> CompletionLoRABase:
        d: Any = self
        if not (d.prompt_logprobs is not None or (self.echo and d.logprobs is not None)):
            return self
        if d.n != 1:
            raise ValueError("n: with LoRA adapters served, prompt log-probs (echo with "
                             "logprobs, or prompt_logprobs) need n=1")
        several = isinstance(d.prompt, list) and len(d.prompt) > 1 and not isinstance(
            d.prompt[0], int)
        if several and self.stream:
            raise ValueError("stream: with LoRA adapters served, prompt log-probs of several "
                             "prompts cannot be streamed")
        return self


def completion_model(lim: Limits) -> type[BaseModel]:
    token = ints(0, lim.max_token_id)
    ids = Annotated[list[token], Field(min_length=1, max_length=lim.max_model_len)]
    words = Annotated[str, Field(min_length=1, max_length=lim.context_chars)]
    batch = {"min_length": 1, "max_length": lim.max_batch}
    prompt = (words | Annotated[list[words], Field(**batch)] | ids
              | Annotated[list[ids], Field(**batch)])
    return create_model(
        "CompletionRequest", __base__=CompletionLoRABase if lim.lora else CompletionBase,
        **_common(lim),
        prompt=(prompt, Field(description=(
            "text, a list of texts, token ids, or a list of token-id lists; each must fit "
            f"max_model_len ({lim.max_model_len} tokens) with room for one generated token "
            "(none with echo and max_tokens 0), else a 400"))),
        max_tokens=(ints(0, lim.max_model_len) | None, Field(16, description=(
            "clamped to what the window leaves after the prompt, as vLLM does; 0 only with "
            "echo"))),
        logprobs=(ints(0, lim.max_logprobs) | None, Field(None)),
        prompt_logprobs=(ints(0, lim.max_logprobs) | None, Field(None,
                                           description="vLLM's; not with stream")),
    )


# ------------------------------------------------------------------ chat
def _chat_rules(schema: dict[str, Any]) -> None:
    tools = {"properties": {"tools": {"type": "array", "minItems": 1}}, "required": ["tools"]}
    schema["allOf"] = [_null_unless("stream", True, "stream_options"),
                       _null_unless("logprobs", True, "top_logprobs"),
                       {"if": tools, "then": {"properties": {"tool_choice": {"const": "none"}},
                                              "required": ["tool_choice"]}}]


class ChatBase(OpenAIBase):
    model_config = {**STRICT, "json_schema_extra": _chat_rules}
    logprobs: bool = False
    tool_choice: Literal["none"] | None = Field(None, description=(
        "this deployment parses no tool calls: with tools, send tool_choice 'none' (the "
        "tools are shown to the model's chat template only)"))
    parallel_tool_calls: bool | None = None

    def engine_body(self) -> dict[str, Any]:
        """As OpenAIBase's; in messages and tools a null is an absent field (vLLM's message
        types take no null `name`, for one)."""
        body = super().engine_body()
        d: Any = self
        for key in ("messages", "tools"):
            if body.get(key) is not None:
                body[key] = [x.model_dump(exclude_unset=True, exclude_none=True)
                             for x in getattr(d, key)]
        return body

    @model_validator(mode="after")
    def _rules(self) -> ChatBase:
        d: Any = self
        if d.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: only with logprobs true")
        if d.tools and self.tool_choice != "none":
            raise ValueError("tool_choice: required with tools ('none': no tool-call parser)")
        if len(self.image_urls()) > MAX_IMAGES_PER_PROMPT:
            raise ValueError(f"messages: {len(self.image_urls())} images; at most "
                             f"{MAX_IMAGES_PER_PROMPT} per request")
        return self

    def image_urls(self) -> list[tuple[str, str]]:
        """(where, data URL) of every image part, in order."""
        d: Any = self
        return [(f"messages.{i}.content.{j}.image_url.url", p.image_url.url)
                for i, m in enumerate(d.messages) if isinstance(m.content, list)
                for j, p in enumerate(m.content) if p.type == "image_url"]


def chat_model(lim: Limits) -> type[BaseModel]:
    content = Annotated[str, Field(max_length=lim.context_chars)]
    part = create_model("TextPart", __config__=STRICT, type=(Literal["text"], ...),
                        text=(content, ...))
    url = create_model("ImageURL", __config__=STRICT, url=(IMAGE_URL, ...),
                       detail=(Literal["auto", "low", "high"] | None, None))
    image = create_model("ImagePart", __config__=STRICT, __doc__=(
        "An image for a vision-language model (user messages only; at most "
        f"{MAX_IMAGES_PER_PROMPT} in all)."), type=(Literal["image_url"], ...),
        image_url=(url, ...))
    parts = Annotated[list[part], Field(min_length=1, max_length=lim.max_batch)]  # type: ignore
    # Image parts only where a served model takes images (the document says so too).
    user_parts = Annotated[list[Annotated[part | image, Field(discriminator="type")]],  # type: ignore
                           Field(min_length=1, max_length=lim.max_batch)] if lim.images else parts
    name = (str | None, Field(None, max_length=64))
    messages = [
        create_model(f"{role.title()}Message", __config__=STRICT, role=(Literal[role], ...),
                     content=(content | (user_parts if role == "user" else parts)
                              | (None if role == "assistant" else content),
                              None if role == "assistant" else ...), name=name)
        for role in ("system", "developer", "user", "assistant")]
    message = Annotated[messages[0] | messages[1] | messages[2] | messages[3],  # type: ignore
                        Field(discriminator="role")]
    function = create_model(
        "FunctionDefinition", __config__=STRICT,
        name=(str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")),
        description=(str | None, Field(None, max_length=lim.text_chars)),
        parameters=(dict[str, Any] | None, Field(None, description="a JSON Schema object")),
        strict=(bool | None, None))
    tool = create_model("Tool", __config__=STRICT, type=(Literal["function"], ...),
                        function=(function, ...))
    tokens = (ints(1, lim.max_model_len) | None, Field(None, description=(
        "clamped to what the window leaves after the prompt, as vLLM does")))
    return create_model(
        "ChatCompletionRequest", __base__=ChatBase, **_common(lim),
        messages=(list[message], Field(min_length=1, max_length=lim.max_batch,  # type: ignore
                                       description=(
            f"the rendered conversation must fit max_model_len ({lim.max_model_len} tokens) "
            "with room for one generated token, else a 400"))),
        max_tokens=tokens, max_completion_tokens=tokens,
        top_logprobs=(ints(0, lim.max_logprobs) | None, Field(None,
                                        description="only with logprobs true")),
        tools=(list[tool] | None, Field(None, max_length=MAX_TOOLS)),  # type: ignore
    )


def request_models(lim: Limits) -> dict[str, type[BaseModel]]:
    """Every route's request model, by the name /openapi.json gives it."""
    return {"QARequest": qa_model(lim), "QABatchRequest": qa_batch_model(lim),
            "MCQRequest": mcq_models(lim),
            "CompletionRequest": completion_model(lim),
            "ChatCompletionRequest": chat_model(lim)}
