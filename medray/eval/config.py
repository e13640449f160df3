"""`medray eval --config X.yaml`: the evaluation run, validated with pydantic.

Example (served model; `MEDRAY_API_KEY` holds the bearer key)::

    data: runs/demo/data            # prepared dataset directory
    split: test                     # test | test_cross | val
    engine: {kind: serve, url: "http://127.0.0.1:8000", adapter: ft}
    #engine: {kind: vllm, model: runs/demo/model, adapter: runs/demo/train/adapter}
    #engine: {kind: vllm, model: M, device: gpu, tensor_parallel_size: 2,
    #         gpu_memory_utilization: 0.9, enable_prefix_caching: true}  # 2 GPUs per actor
    #engine: {kind: baseline, baseline: random-token, tokens: 1024, seed: 0}
    prompt_format: qea
    context_tokens: 1024
    strategy: trim                  # trim | chunks | retrieve
    actors: 2
    max_in_flight: 8
    score: {modes: [medqaro, robust], by: [question_type, cancer_type], resamples: 1000}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from medray.config import Strict, load_yaml


class EngineSpec(Strict):
    """Who answers: our Serve endpoint, an in-process vLLM engine, or a baseline."""

    kind: Literal["serve", "vllm", "baseline"]
    url: str | None = None  # serve: http://127.0.0.1:8000
    api_key_env: str = "MEDRAY_API_KEY"  # serve: env var holding the bearer key
    model: str | None = None  # vllm: model path; serve: the served model id
    adapter: str | None = None  # serve: adapter name; vllm: PEFT adapter path
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

    @model_validator(mode="after")
    def _needs(self) -> EngineSpec:
        if self.kind == "serve" and not self.url:
            raise ValueError("engine.kind=serve needs engine.url")
        if self.kind == "vllm" and not self.model:
            raise ValueError("engine.kind=vllm needs engine.model (a path or hub id)")
        if self.kind == "baseline" and not self.baseline:
            raise ValueError("engine.kind=baseline needs engine.baseline")
        if self.device == "cpu" and self.tensor_parallel_size > 1:
            raise ValueError("engine.tensor_parallel_size > 1 needs engine.device=gpu")
        return self

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

    def actor_options(self) -> dict[str, Any]:
        """What one evaluation actor asks Ray for."""
        if self.kind != "vllm":
            return {"num_cpus": 0.25}  # HTTP clients and baselines barely use a CPU
        if self.device == "gpu":
            return {"num_cpus": 1, "num_gpus": self.tensor_parallel_size}
        return {"num_cpus": 1}  # vLLM on CPU needs its core

    @property
    def label(self) -> str:
        if self.kind == "baseline":
            return str(self.baseline)
        return str(self.model or "medray")


class ScoreSpec(Strict):
    modes: list[Literal["medqaro", "robust"]] = ["medqaro"]
    by: list[str] = Field(default_factory=list)  # e.g. question_type, cancer_type
    resamples: int = Field(1000, ge=0)
    seed: int = 0
    wordnet: bool = True


class EvalConfig(Strict):
    data: Path
    split: str = "test"
    engine: EngineSpec
    prompt_format: Literal["qea", "eqa"] = "qea"
    context_tokens: int = Field(1024, ge=16)
    strategy: Literal["trim", "chunks", "retrieve"] = "trim"
    max_new_tokens: int = Field(10, ge=1)
    actors: int = Field(2, ge=1)
    max_in_flight: int = Field(4, ge=1)  # requests outstanding across all actors
    limit: int | None = Field(None, ge=1)  # first N items of the split (smoke runs)
    fine_tuned: bool | None = None  # for the report's "fine-tuned" column
    score: ScoreSpec = Field(default_factory=ScoreSpec)


def load_eval_config(path: str | Path) -> EvalConfig:
    """Read and validate (medray.config: errors name the file and the key); a relative
    `data` that does not exist from here is taken relative to the file."""
    path = Path(path)
    cfg = load_yaml(EvalConfig, path, what="eval config")
    if not cfg.data.is_absolute() and not cfg.data.exists():
        cfg.data = (path.parent / cfg.data).resolve()
    return cfg
