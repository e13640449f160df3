"""Ray Serve app: vLLM replicas from `ray.serve.llm` behind medray's QA ingress.

    medray serve --config serve/medqaro-cpu.yaml   # validates the config first
    serve run serve/medqaro-cpu.yaml               # Serve's own CLI

`build_llms` (llm.py) gives one LLM deployment per served model (ray.serve.llm's
LLMServer: vLLM, OpenAI request/response models, Serve multiplexing for LoRA). `QAIngress`
is the FastAPI deployment in front: API-key auth, size limits before tokenising, /v1/qa
(trim|chunks|retrieve with the training prompt code, qa.py) and /v1/qa/batch (one
patient's questions in one call), /v1/mcq, pass-through /v1/completions and
/v1/chat/completions (server-sent events with `stream`), /v1/models, /healthz (liveness)
and /readyz (an LLM replica answers). Every error is an OpenAI-shaped
JSON body (errors.py).

Why not `build_openai_app`: its ingress has no auth and no QA routes, and its LoRA loader
only takes cloud URIs; local adapters go through `LocalLoraLoader` (llm.py).
"""

from __future__ import annotations

import asyncio
import hmac
from collections import Counter
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle

from medray.engines.base import Generation
from medray.prompts.spec import PromptSpec
from medray.serve.config import AppConfig
from medray.serve.errors import APIError, context_error, from_validation, install_error_handlers
from medray.serve.health import Readiness
from medray.serve.images import chat_generation, check_images, image_chat_request
from medray.serve.incluster import InClusterCalls, Payload
from medray.serve.limits import chars_per_token, check_chars, check_openai_window, read_json
from medray.serve.llm import wants_prompt_logprobs
from medray.serve.openai_models import request_models
from medray.serve.openapi import document
from medray.serve.prompt_logprobs import last_response, one_prompt_at_a_time
from medray.serve.qa import QAAnswers
from medray.serve.relay import Target, engine_error, generations, relayed_error, sse
from medray.serve.schemas import (
    Health,
    Limits,
    MCQBase,
    MCQResponse,
    ModelCard,
    ModelList,
    QABatchResponse,
    QAResponse,
)

app = FastAPI(title="medray", description="Medical QA over Ray Serve + vLLM")
install_error_handlers(app)
route = document(app)


def _bearer(request: Request) -> bytes:
    header = request.headers.get("authorization", "")
    token = header[7:].strip() if header.lower().startswith("bearer ") else ""
    # Bytes: hmac.compare_digest refuses non-ASCII str (headers arrive latin-1 decoded).
    return token.encode("utf-8", "surrogateescape")


@serve.deployment(max_ongoing_requests=64)
@serve.ingress(app)
class QAIngress(InClusterCalls, Readiness, QAAnswers):  # `call`: in-cluster routes
    def __init__(self, llms: dict[str, DeploymentHandle], config: dict[str, Any]) -> None:
        self.cfg = AppConfig.model_validate(config)
        keys = self.cfg.api_keys()
        if self.cfg.require_auth and not keys:
            raise RuntimeError(
                f"require_auth is on but no API keys were found (env var "
                f"{self.cfg.api_keys_env!r}, file {self.cfg.api_keys_file!r})"
            )
        self._keys = [k.encode("utf-8") for k in keys]
        self.llms = {name: h.options(stream=True) for name, h in llms.items()}
        self._lora_handles: dict[str, DeploymentHandle] = {}
        self._tokenizers: dict[str, Any] = {}
        self._image_tokens: dict[str, str | None] = {}  # None: a text-only model
        self._prompts: dict[str, PromptSpec] = {}
        self.tokenizer = self._tokenizer(self.cfg.model)
        # The request models with this deployment's limits: what the routes validate with
        # and what /openapi.json shows. Token ids: within every served model's vocabulary.
        sources = {self.cfg.model, *self.cfg.models.values()}
        max_id = min(len(self._tokenizer(p)) - 1 for p in sources)
        self.schemas = request_models(Limits.of(self.cfg, max_id))
        route.use(self.schemas)
        self.counts: Counter[str] = Counter()
        self._ready_cache: tuple[float, bool, str] = (-1e9, False, "not checked yet")
        self._ready_lock = asyncio.Lock()
        self._answered_at: dict[str, float] = {}

    # ------------------------------------------------------------------ plumbing
    def _tokenizer(self, source: str) -> Any:
        """The model's tokenizer; a vision-language model's as its processor gives it (with
        the processor's chat template), as the offline vLLM engine reads it."""
        if source not in self._tokenizers:
            from medray.models.vision import image_token, is_vision_model, load_processor

            if is_vision_model(source):
                processor = load_processor(source)
                tok, self._image_tokens[source] = processor.tokenizer, image_token(processor)
            else:
                from transformers import AutoTokenizer

                tok, self._image_tokens[source] = AutoTokenizer.from_pretrained(source), None
            self._tokenizers[source] = tok
        return self._tokenizers[source]

    def _check_images(self, target: Target, urls: list[tuple[str, str]], status: int) -> None:
        self._tokenizer(target.source)
        check_images(urls, target.model, self._image_tokens[target.source] is not None,
                     self.cfg.max_image_bytes, status)

    def _prompt_of(self, name: str) -> PromptSpec:
        """How served `name` is prompted: as trained (its folder's prompt.json) unless the
        config overrides it (medray.serve.config.AppConfig.prompt_for)."""
        if name not in self._prompts:  # "auto" decided for the tokenizer that reads it
            source = self.cfg.models.get(name, self.cfg.model)
            self._prompts[name] = self.cfg.prompt_for(name).with_chat_template_of(
                self._tokenizer(source))
        return self._prompts[name]

    def _prompt(self, target: Target) -> PromptSpec:
        return self._prompt_of(target.model)

    def _auth(self, request: Request) -> None:
        """Checked first in every route but the health probes, before the body is read."""
        if not self.cfg.require_auth or isinstance(request, Payload):  # in-cluster: trusted
            return
        token = _bearer(request)
        if not token or not any(hmac.compare_digest(token, k) for k in self._keys):
            raise APIError(401, "unauthorized", "missing or invalid API key",
                           headers={"WWW-Authenticate": "Bearer"})

    async def _body(self, request: Request, schema: str, status: int = 422) -> Any:
        """The body validated with this deployment's model `schema` (schemas.py); the
        OpenAI routes answer an invalid body with a 400, as OpenAI's and vLLM's do."""
        self._auth(request)
        data = request.data if isinstance(request, Payload) else await read_json(
            request, self.cfg.max_body_bytes)
        try:
            return self.schemas[schema].model_validate(data)
        except ValidationError as exc:
            raise from_validation(exc, status) from None

    def _target(self, model: str | None, adapter: str | None = None) -> Target:
        cfg = self.cfg
        if model in cfg.models and adapter is None:
            return Target(self.llms[model], model, cfg.models[model], model, None)
        if model not in (None, cfg.model_id) and adapter is None:
            # OpenAI clients name an adapter as "BASE:ADAPTER" or just "ADAPTER".
            adapter = model.split(":", 1)[1] if model.startswith(f"{cfg.model_id}:") else model
            if adapter not in cfg.adapters:
                raise APIError(404, "model_not_found", f"model {model!r} is not served; "
                               f"known: {self.served_names()}", "model")
        elif model not in (None, cfg.model_id):
            raise APIError(404, "model_not_found", f"adapter {adapter!r} rides on "
                           f"{cfg.model_id!r}, not on {model!r}", "model")
        base = self.llms[cfg.model_id]
        if adapter is None:
            return Target(base, cfg.model_id, cfg.model, cfg.model_id, None)
        if adapter not in cfg.adapters:
            raise APIError(404, "unknown_adapter", f"adapter {adapter!r} is not served; "
                           f"known: {sorted(cfg.adapters)}", "adapter")
        name = f"{cfg.model_id}:{adapter}"
        if adapter not in self._lora_handles:  # cache: each .options() makes a new handle
            self._lora_handles[adapter] = base.options(multiplexed_model_id=name)
        return Target(self._lora_handles[adapter], name, cfg.model, name, adapter)

    def served_names(self) -> list[str]:
        cfg = self.cfg
        return [cfg.model_id, *[f"{cfg.model_id}:{a}" for a in cfg.adapters], *cfg.models]

    async def _stream(self, target: Target, method: str, request: Any) -> Any:
        """The first item of the LLM call (a response, or a list of SSE chunks) and the
        generator of the rest; errors (first item an ErrorResponse) raised as APIError."""
        gen = getattr(target.handle, method).remote(request, None)
        try:
            first = await gen.__anext__()
        except StopAsyncIteration:
            raise APIError(503, "engine_error", "the LLM engine returned nothing") from None
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 -- every failure gets a JSON answer
            raise engine_error(exc) from None
        head = first[0] if isinstance(first, list) and first else first
        error = getattr(head, "error", None)
        if error is not None:
            raise relayed_error(error)
        return first, gen

    async def _call(self, target: Target, method: str, request: Any) -> Any:
        first, gen = await self._stream(target, method, request)
        result = first
        async for item in gen:
            result = item
        self._answered(target.handle)
        return result[-1] if isinstance(result, list) else result

    async def generate_ids(self, target: Target, prompts: list[list[int]],
                           max_new_tokens: int) -> list[Generation]:
        from ray.serve.llm.openai_api_models import CompletionRequest

        req = CompletionRequest(
            model=target.vllm_model, prompt=prompts, max_tokens=max_new_tokens,
            temperature=0.0, logprobs=1, return_token_ids=True,
        )
        gens = generations(await self._call(target, "completions", req))
        for g, p in zip(gens, prompts, strict=True):
            g.prompt_tokens = len(p)
        return gens

    # ------------------------------------------------------------------ routes
    @route.get("/healthz", response_model=Health, public=True)
    async def healthz(self) -> Health:
        """Liveness: this ingress replica answers (it says nothing about the LLM)."""
        return Health(status="ok", model=self.cfg.model_id)

    @route.get("/readyz", response_model=Health, public=True)
    async def readyz(self) -> JSONResponse:
        """Readiness: every LLM deployment has a running replica that answers."""
        ok, detail = await self._ready()
        body = Health(status="ok" if ok else "unavailable", model=self.cfg.model_id,
                      detail=None if ok else detail)
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

    @route.get("/v1/models", response_model=ModelList)
    async def models(self, request: Request) -> ModelList:
        self._auth(request)
        cfg = self.cfg
        window = cfg.max_model_len
        cards = [ModelCard(id=cfg.model_id, root=cfg.model, max_model_len=window)]
        cards += [ModelCard(id=f"{cfg.model_id}:{a}", root=p, parent=cfg.model_id,
                            max_model_len=window) for a, p in cfg.adapters.items()]
        cards += [ModelCard(id=name, root=p, max_model_len=window)
                  for name, p in cfg.models.items()]
        for card in cards:
            card.prompt, card.images = self._prompt_of(card.id), cfg.takes_images(card.id)
        return ModelList(data=cards)

    @route.get("/v1/stats", response_model=dict[str, int])
    async def stats(self, request: Request) -> dict[str, int]:
        """Requests this ingress replica answered, per route (used by the resume test), and
        `ready_probe`: the readiness probes it sent to its LLMs."""
        self._auth(request)
        return dict(self.counts)

    @route.post("/v1/qa", response_model=QAResponse, body="QARequest")
    async def qa(self, request: Request) -> QAResponse:
        # Sizes, context_tokens (at most the context limit) and text: checked by the model.
        body: Any = await self._body(request, "QARequest")
        return (await self._answers(body, [body.question]))[0]

    @route.post("/v1/qa/batch", response_model=QABatchResponse, body="QABatchRequest")
    async def qa_batch(self, request: Request) -> QABatchResponse:
        """One patient's questions over their shared record, each answered as /v1/qa
        answers it; the record is tokenised once and the prompts go to vLLM together."""
        body: Any = await self._body(request, "QABatchRequest")
        self.counts["qa_batch"] += 1
        return QABatchResponse(answers=await self._answers(body, body.questions, "questions"))

    @route.post("/v1/mcq", response_model=MCQResponse, body="MCQRequest")
    async def mcq(self, request: Request) -> MCQResponse:
        from medray.eval.mcq import read_answer
        from medray.prompts.text import prompt_text, protocol_budget, render

        body: Any = await self._body(request, "MCQRequest")
        assert isinstance(body, MCQBase)
        target = self._target(body.model, body.adapter)
        self._check_images(target, [(f"images.{i}", u) for i, u in enumerate(body.images)], 422)
        tokenizer = self._tokenizer(target.source)
        texts = [body.question, *(o.text for o in body.options)]  # type: ignore[attr-defined]
        texts += [t for s in body.shots for t in (s.question, *(o.text for o in s.options))]  # type: ignore[attr-defined]
        check_chars(sum(map(len, texts)), self.cfg.max_model_len,
                    chars_per_token(tokenizer), "options")
        item = body.item()
        try:  # the item's dataset prompt, exactly as the eval runner renders it
            prompt = render(item, body.shot_set())
        except (ValueError, KeyError) as err:  # e.g. shots for a protocol without them,
            # or a group shot whose answer is no group letter
            raise APIError(422, "invalid_request", f"shots: {err}", "shots") from None
        spec = self._prompt(target)
        # With images: their tokens where the chat template puts them (each image's own
        # tokens are the processor's, counted by vLLM against the window).
        text = prompt_text(prompt, tokenizer, spec, len(body.images),
                           self._image_tokens[target.source] or "")
        ids = tokenizer.encode(text, add_special_tokens=True)
        budget = spec.new_tokens(body.max_new_tokens, protocol_budget(item))
        if len(ids) + budget > self.cfg.max_model_len:
            raise context_error(self.cfg.max_model_len, len(ids), "options",
                                "the rendered item", budget)
        if body.images:
            req = image_chat_request(target.vllm_model, text, body.images, budget)
            gen = chat_generation(await self._call(target, "chat", req))
        else:
            gen = (await self.generate_ids(target, [ids], budget))[0]
        _, labels, conforming = read_answer(gen.text, item)
        self.counts["mcq"] += 1
        return MCQResponse(answer=list(labels), conforming=conforming, raw=gen.text,
                           prompt_tokens=gen.prompt_tokens)

    async def _openai(self, kind: str, request: Request) -> Any:
        from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

        name = "CompletionRequest" if kind == "completions" else "ChatCompletionRequest"
        body = await self._body(request, name, 400)
        target = self._target(body.model)
        if kind == "chat":
            self._check_images(target, body.image_urls(), 400)
        # Before the engine, so the answer names the limit (vLLM clamps max_tokens to the rest).
        check_openai_window(body, self._tokenizer(target.source), self.cfg.max_model_len)
        cls = CompletionRequest if kind == "completions" else ChatCompletionRequest
        try:
            req = cls.model_validate({**body.engine_body(), "model": target.vllm_model})
        except ValidationError as exc:
            raise from_validation(exc, 400) from None
        except Exception as exc:  # noqa: BLE001 -- vLLM's validators raise their own types
            raise APIError(400, "invalid_request_error", str(exc)[:1000]) from None
        method = "completions" if kind == "completions" else "chat"
        if self._lora_on(target) and wants_prompt_logprobs(req):
            return await one_prompt_at_a_time(self._stream, target, method, req)
        first, gen = await self._stream(target, method, req)
        self.counts[kind] += 1
        if not req.stream:
            return JSONResponse(await last_response(first, gen))
        return StreamingResponse(sse(first, gen), media_type="text/event-stream")

    def _lora_on(self, target: Target) -> bool:
        return target.source == self.cfg.model and bool(self.cfg.adapters or self.cfg.lora_uri)

    @route.post("/v1/completions", body="CompletionRequest", response="CompletionResponse")
    async def completions(self, request: Request) -> Any:
        """OpenAI completions (`stream` gives server-sent events; `echo` with `max_tokens`
        0 scores the prompt only)."""
        return await self._openai("completions", request)

    @route.post("/v1/chat/completions", body="ChatCompletionRequest",
                response="ChatCompletionResponse")
    async def chat(self, request: Request) -> Any:
        """OpenAI chat completions (`stream` gives server-sent events)."""
        return await self._openai("chat", request)


def build_app(args: AppConfig | dict[str, Any]) -> Any:
    """Serve application builder (`import_path: medray.serve.app:build_app`).

    Every model and adapter is checked here, before any replica starts."""
    from medray.serve.llm import build_llms
    from medray.serve.validation import check_servable

    raw = args if isinstance(args, AppConfig) else AppConfig.model_validate(args)
    cfg = raw.resolved()
    check_servable(cfg, raw)
    ingress = QAIngress.options(
        ray_actor_options={"num_cpus": cfg.ingress.num_cpus}, **cfg.ingress.serve_options()
    )
    return ingress.bind(build_llms(cfg), cfg.model_dump(mode="json"))
