"""`medray eval --config X.yaml`: the evaluation run, validated with pydantic.

Example (served model; `MEDRAY_API_KEY` holds the bearer key)::

    data: runs/demo/data            # prepared dataset directory
    split: test                     # test | test_cross | val
    engine: {kind: serve, url: "http://127.0.0.1:8000", adapter: ft}
    #engine: {kind: vllm, model: runs/demo/model, adapter: runs/demo/train/adapter}
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
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class EngineSpec(BaseModel):
    """Who answers: our Serve endpoint, an in-process vLLM engine, or a baseline."""

    model_config = ConfigDict(extra="forbid")
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

    @model_validator(mode="after")
    def _needs(self) -> EngineSpec:
        if self.kind == "serve" and not self.url:
            raise ValueError("engine.kind=serve needs engine.url")
        if self.kind == "vllm" and not self.model:
            raise ValueError("engine.kind=vllm needs engine.model (a path or hub id)")
        if self.kind == "baseline" and not self.baseline:
            raise ValueError("engine.kind=baseline needs engine.baseline")
        return self

    @property
    def label(self) -> str:
        if self.kind == "baseline":
            return str(self.baseline)
        return str(self.model or "medray")


class ScoreSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    modes: list[Literal["medqaro", "robust"]] = ["medqaro"]
    by: list[str] = Field(default_factory=list)  # e.g. question_type, cancer_type
    resamples: int = Field(1000, ge=0)
    seed: int = 0
    wordnet: bool = True


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
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
    """Read and validate; errors name the file and the field."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: cannot read YAML ({err})") from None
    try:
        cfg = EvalConfig.model_validate(raw)
    except ValidationError as err:
        lines = [f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in err.errors()]
        raise ValueError(f"{path}: invalid eval config:\n  " + "\n  ".join(lines)) from None
    if not cfg.data.is_absolute() and not cfg.data.exists():  # else: relative to the file
        cfg.data = (path.parent / cfg.data).resolve()
    return cfg
