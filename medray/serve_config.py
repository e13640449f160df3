"""Schemas of the Serve app: its config (the `args` of a Serve config file) and its API.

Kept apart from serve_app.py so `medray serve --config` can validate a YAML file without
importing Ray Serve or vLLM.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Autoscaling(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    target_ongoing_requests: float = Field(4, gt=0)


class Replicas(BaseModel):
    """Either a fixed replica count or an autoscaling block (Serve's own fields)."""

    model_config = ConfigDict(extra="forbid")
    num_replicas: int | None = Field(1, ge=1)
    autoscaling: Autoscaling | None = None
    num_cpus: float = Field(1.0, gt=0)

    def serve_options(self) -> dict[str, Any]:
        if self.autoscaling is not None:
            return {"autoscaling_config": self.autoscaling.model_dump()}
        return {"num_replicas": self.num_replicas or 1}


class AppConfig(BaseModel):
    """Everything `medray.serve_app:build_app` needs; the `args` block of serve/*.yaml."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="hub id or local path of the base (or merged) model")
    model_id: str = Field("medray", description="name clients use in the `model` field")
    # Local PEFT adapters by name (served through ray.serve.llm's multiplexing with a
    # local loader); `lora_uri` instead names a cloud folder (s3://, gs://) of adapters for
    # Ray's own multi-LoRA loader. A merged model is just another `model` path.
    adapters: dict[str, str] = Field(default_factory=dict)
    lora_uri: str | None = None
    max_lora_rank: int = 16
    max_model_len: int = Field(2048, ge=64)
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    # Chosen by the config, never detected: the node that builds the app (often a CPU-only
    # head) says nothing about where the replicas run.
    device: Literal["cpu", "gpu"] = "cpu"
    llm: Replicas = Field(default_factory=Replicas)
    ingress: Replicas = Field(default_factory=lambda: Replicas(num_cpus=0.5))

    # Auth: keys (comma-separated) from the env var named here, and/or a secret file with
    # one key per line. Set require_auth false only for local experiments.
    api_keys_env: str | None = "MEDRAY_API_KEYS"
    api_keys_file: str | None = None
    require_auth: bool = True

    # /v1/qa defaults and limits.
    prompt_format: Literal["qea", "eqa"] = "qea"
    context_tokens: int = Field(1024, ge=16)
    max_context_tokens: int | None = None  # defaults to max_model_len
    max_context_chars: int = Field(400_000, ge=1)
    chunk_tokens: int | None = None  # chunks/retrieve piece size; None = the whole budget
    max_new_tokens: int = Field(10, ge=1, le=512)  # the reference decodes 10 new tokens
    # Tokens kept free for the answer inside context_tokens; None = max_new_tokens.
    reserve: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _limits(self) -> AppConfig:
        limit = self.max_context_tokens or self.max_model_len
        if self.context_tokens > limit:
            raise ValueError(f"context_tokens {self.context_tokens} > limit {limit}")
        if self.reserve is None:
            self.reserve = self.max_new_tokens
        if self.max_context_tokens is None:
            self.max_context_tokens = self.max_model_len
        return self

    @field_validator("adapters")
    @classmethod
    def _adapters_exist(cls, value: dict[str, str]) -> dict[str, str]:
        for name, path in value.items():
            if not (Path(path) / "adapter_config.json").is_file():
                raise ValueError(f"adapter {name!r}: {path} has no adapter_config.json")
        return value

    def api_keys(self) -> set[str]:
        keys: set[str] = set()
        if self.api_keys_env and os.environ.get(self.api_keys_env):
            keys |= {k.strip() for k in os.environ[self.api_keys_env].split(",") if k.strip()}
        if self.api_keys_file:
            lines = Path(self.api_keys_file).read_text().splitlines()
            keys |= {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}
        return keys


class ServeFile(BaseModel):
    """The subset of a Serve config file that `medray serve --config` reads."""

    host: str = "127.0.0.1"
    port: int = 8000
    name: str = "medray"
    route_prefix: str = "/"
    args: AppConfig


def load_serve_file(path: str | os.PathLike) -> ServeFile:
    """Read serve/X.yaml (a Serve config file: http_options + applications[0].args)."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    apps = raw.get("applications") or []
    if not apps:
        raise ValueError(f"{path}: no `applications` entry")
    app = apps[0]
    http = raw.get("http_options") or {}
    return ServeFile(
        host=http.get("host", "127.0.0.1"),
        port=http.get("port", 8000),
        name=app.get("name", "medray"),
        route_prefix=app.get("route_prefix", "/"),
        args=AppConfig.model_validate(app.get("args") or {}),
    )


# ------------------------------------------------------------------------ API schemas


class QARequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1)
    context: str
    prompt_format: Literal["qea", "eqa"] | None = None
    context_tokens: int | None = Field(None, ge=16)
    strategy: Literal["trim", "chunks", "retrieve"] = "trim"
    adapter: str | None = None


class QAResponse(BaseModel):
    answer: str
    logprob: float | None
    prompt_tokens: int
    strategy: str
    model: str
    adapter: str | None


class Option(BaseModel):
    label: str = Field(min_length=1, max_length=2)
    text: str


class MCQRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1)
    options: list[Option] = Field(min_length=2, max_length=10)
    kind: Literal["single", "group", "multiple"] = "single"
    adapter: str | None = None


class MCQResponse(BaseModel):
    answer: list[str]
    conforming: bool
    raw: str
