"""Every engine medray can evaluate with, as plain data, and the one `EngineSpec` naming one.

`ENGINES[kind]` says where the engine class lives (imported only when built, so parsing a
spec never pulls in torch or vLLM), whether it is a third-party provider (governance), how
the eval runner executes it (a pool of Ray actors or in-process) and which spec fields it
takes. Adding an engine is one entry here plus its module.

The CLI shorthand `KIND:TARGET` (`openai:gpt-4o-mini`, `hf:PATH`, `serve:URL`, ...) parses
into the same EngineSpec an eval config's `engine:` block gives.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from medray.config import Strict


@dataclass(frozen=True)
class EngineEntry:
    target: str  # the spec field KIND:TARGET fills: model, url or baseline
    executor: Literal["ray", "local"]  # Ray actor pool, or in the driver process
    module: str | None = None  # None: answered without a model (baselines)
    cls: str = ""
    external: bool = False  # a third-party provider's SDK (governance: clinical text opt-in)
    images: bool = False  # takes images with a prompt (else image items are not asked)
    loglik: bool = False  # scores options by log-likelihood by default (local models)
    # Takes concurrent calls from several threads of one actor (vLLM's offline engine does
    # not: two at once abort the process).
    thread_safe: bool = True


ENGINES: dict[str, EngineEntry] = {
    "serve": EngineEntry("url", "ray", "medray.engines.serve", "ServeEngine"),
    "vllm": EngineEntry("model", "ray", "medray.engines.vllm", "VLLMEngine", loglik=True,
                        thread_safe=False),
    "hf": EngineEntry("model", "local", "medray.engines.hf", "HFEngine", loglik=True),
    "openai": EngineEntry("model", "local", "medray.engines.openai", "OpenAIEngine",
                          external=True, images=True),
    "anthropic": EngineEntry("model", "local", "medray.engines.anthropic", "AnthropicEngine",
                             external=True, images=True),
    "baseline": EngineEntry("baseline", "local"),
}
KINDS = tuple(ENGINES)
API_PROVIDERS = tuple(k for k, e in ENGINES.items() if e.external)


class EngineSpecError(ValueError):
    pass


class EngineSpec(Strict):
    """Who answers, and how it is reached or loaded."""

    kind: Literal["serve", "vllm", "hf", "openai", "anthropic", "baseline"]
    url: str | None = None  # serve: http://127.0.0.1:8000
    # serve: the Serve application's name (`serve run ... --name`, `medray serve`'s config
    # `name`). Set, the evaluation calls it through a DeploymentHandle from inside the Ray
    # cluster that serves it (no HTTP; no API key); unset, over HTTP at `url`.
    app: str | None = None
    # serve: MEDRAY_API_KEY; API engines: OPENAI_API_KEY / ANTHROPIC_API_KEY
    api_key_env: str | None = None
    model: str | None = None  # vllm/hf: path or hub id; API: model name; serve: served id
    adapter: str | None = None  # serve: adapter name; vllm/hf: PEFT adapter path
    baseline: Literal["majority", "random-token", "random"] | None = None
    tokens: int = 1024  # random-token budget N
    tokenizer: str | None = None  # random-token: HF tokenizer path (default whitespace)
    seed: int = 0
    max_model_len: int = 2048
    timeout_s: float = 300.0
    # vllm: where each evaluation actor runs its engine. On gpu an actor reserves
    # tensor_parallel_size GPUs from Ray (Ray does not hide GPUs from actors that ask for
    # none, so two zero-GPU actors on a node would both start on cuda:0).
    device: Literal["cpu", "gpu"] = "cpu"
    tensor_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    enable_prefix_caching: bool | None = None  # None: vLLM's default
    # vllm / hf on CPU: the CPUs one evaluation actor holds, and the threads torch and
    # vLLM run there; None: the machine's cores shared among the actors
    cpus: int | None = Field(None, ge=1)
    # API engines
    base_url: str | None = None
    concurrency: int = Field(4, ge=1)
    requests_per_minute: float | None = None
    max_retries: int = Field(5, ge=0)
    params: dict[str, Any] = Field(default_factory=dict)  # extra request fields

    @model_validator(mode="after")
    def _needs(self) -> EngineSpec:
        field = ENGINES[self.kind].target
        if self.app and self.kind != "serve":
            raise ValueError(f"engine.app is for engine.kind=serve, not {self.kind}")
        if not getattr(self, field) and not (self.kind == "serve" and self.app):
            raise ValueError(f"engine.kind={self.kind} needs engine.{field}"
                             + (" or engine.app" if self.kind == "serve" else ""))
        if self.device == "cpu" and self.tensor_parallel_size > 1:
            raise ValueError("engine.tensor_parallel_size > 1 needs engine.device=gpu")
        return self

    @property
    def entry(self) -> EngineEntry:
        return ENGINES[self.kind]

    @property
    def external(self) -> bool:
        """Sent through a third-party provider's SDK: governance treats it as external
        whatever its base URL (a local URL may still be a proxy to the provider)."""
        return self.entry.external

    @property
    def provider(self) -> str:
        return self.kind

    @property
    def target(self) -> str:
        if self.app:  # the in-cluster Serve app, as `serve:app:NAME` writes it
            return f"app:{self.app}"
        return str(getattr(self, self.entry.target))

    @property
    def label(self) -> str:
        """The model column of reports: the baseline, the model, or Serve's default id."""
        if self.kind == "baseline":
            return str(self.baseline)
        return str(self.model or "medray")

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}"

    def vllm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the in-process vLLM engine (medray.engines.vllm)."""
        kwargs: dict[str, Any] = {"max_model_len": self.max_model_len,
                                  "enable_prefix_caching": self.enable_prefix_caching}
        if self.device == "gpu":
            kwargs.update(tensor_parallel_size=self.tensor_parallel_size,
                          gpu_memory_utilization=self.gpu_memory_utilization)
            if self.tensor_parallel_size > 1:
                # Worker processes inside the actor, on the GPUs Ray gave it (not a Ray
                # placement group of its own).
                kwargs["distributed_executor_backend"] = "mp"
        return kwargs

    @property
    def runs_on_cpu(self) -> bool:
        """A model in the evaluation actor's own process, computing on its CPUs."""
        return self.kind in ("vllm", "hf") and self.device == "cpu"

    def actor_options(self, cpus: int = 1) -> dict[str, Any]:
        """What one evaluation actor asks Ray for; `cpus`: a CPU engine's share of the
        cores when `self.cpus` is unset. Ray sets OMP_NUM_THREADS to the CPUs an actor
        holds, so torch and vLLM (unbound threads) run that many threads."""
        if self.runs_on_cpu:
            return {"num_cpus": self.cpus or cpus}
        if self.kind == "vllm":  # on GPU
            return {"num_cpus": 1, "num_gpus": self.tensor_parallel_size}
        return {"num_cpus": 0.25}  # HTTP clients and baselines barely use a CPU

    def engine_kwargs(self) -> dict[str, Any]:
        """Constructor keywords of the engine class, from the spec's fields."""
        if self.kind == "serve":
            return {"api_key_env": self.api_key_env or "MEDRAY_API_KEY",
                    "model": self.model or "medray", "adapter": self.adapter,
                    "timeout": self.timeout_s, "app": self.app}
        if self.kind == "vllm":
            return {"adapter": self.adapter, **self.vllm_kwargs()}
        if self.kind == "hf":
            return {"adapter": self.adapter}
        if self.external:
            return {"base_url": self.base_url, "api_key_env": self.api_key_env,
                    "concurrency": self.concurrency,
                    "requests_per_minute": self.requests_per_minute,
                    "max_retries": self.max_retries, "timeout": self.timeout_s,
                    "params": dict(self.params)}
        return {}


def parse_spec(spec: str, **fields: Any) -> EngineSpec:
    """`KIND:TARGET` (+ other EngineSpec fields) -> EngineSpec."""
    kind, sep, target = spec.partition(":")
    kind = kind.strip().lower()
    if not sep or not target.strip():
        raise EngineSpecError(f"engine spec {spec!r}: expected KIND:TARGET, e.g. "
                              "openai:gpt-4o-mini, anthropic:claude-3-5-haiku-20241022, "
                              "hf:PATH, vllm:PATH, serve:URL, serve:app:NAME, "
                              "baseline:majority")
    if kind not in ENGINES:
        raise EngineSpecError(f"engine spec {spec!r}: unknown kind {kind!r}; "
                              f"expected one of {', '.join(KINDS)}")
    from pydantic import ValidationError

    field, target = ENGINES[kind].target, target.strip()
    if kind == "serve" and target.startswith("app:"):  # serve:app:NAME, in-cluster
        field, target = "app", target[4:]
    try:
        return EngineSpec.model_validate({**fields, "kind": kind, field: target})
    except ValidationError as err:
        msgs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'engine'}: {e['msg']}"
                         for e in err.errors())
        raise EngineSpecError(f"engine spec {spec!r}: {msgs}") from None


def build_engine(spec: str | EngineSpec, **kwargs: Any) -> Any:
    """The engine object; `kwargs` (e.g. cache, api_key, temperature) override the spec's."""
    parsed = parse_spec(spec) if isinstance(spec, str) else spec
    entry = parsed.entry
    if entry.module is None:
        raise EngineSpecError(f"engine {parsed}: answered without an engine object")
    try:
        module = importlib.import_module(entry.module)
    except ModuleNotFoundError as err:
        if err.name and err.name.startswith("medray"):
            raise EngineSpecError(f"engine {parsed}: {entry.module} is not available") from err
        raise
    options = {k: v for k, v in parsed.engine_kwargs().items() if v is not None}
    return getattr(module, entry.cls)(getattr(parsed, entry.target), **{**options, **kwargs})
