"""The Serve app's config: the `args` of a Serve config file (serve/*.yaml).

Kept apart from medray/serve/ so `medray serve --config` can validate a YAML file without
importing Ray Serve or vLLM. The HTTP API's schemas are in medray/serve/schemas.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from medray.config import ConfigError, Strict, load_yaml
from medray.data.images import MAX_IMAGE_BYTES
from medray.prompts.spec import (
    PromptOverride,
    PromptSpec,
    load_prompt_spec,
    moved_prompt_keys,
    resolve_prompt,
)


class Autoscaling(Strict):
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    target_ongoing_requests: float = Field(4, gt=0)


class Replicas(Strict):
    """Either a fixed replica count or an autoscaling block (Serve's own fields)."""

    num_replicas: int | None = Field(1, ge=1)
    autoscaling: Autoscaling | None = None
    num_cpus: float = Field(1.0, gt=0)

    def serve_options(self) -> dict[str, Any]:
        if self.autoscaling is not None:
            return {"autoscaling_config": self.autoscaling.model_dump()}
        return {"num_replicas": self.num_replicas or 1}


class PrefixRouting(Strict):
    """Knobs of the prefix-aware router (Ray Serve LLM's PrefixCacheAffinityRouter)."""

    # None: a request always follows its prefix, however uneven the replicas' queues;
    # a number: past that many more ongoing requests on the busiest replica than on the
    # idlest, requests go to the less loaded of two replicas (prefix ignored).
    imbalanced_threshold: float | None = Field(None, ge=0)
    # A prompt whose best match covers less of it than this (a new patient) goes to the
    # replica holding the fewest cached prompt tokens.
    match_rate_threshold: float = Field(0.1, ge=0, le=1)
    # The router's prefix tree is trimmed to 90% of this many tokens once it holds more.
    max_tree_tokens: int = Field(400_000, ge=1000)

    def router_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"match_rate_threshold": self.match_rate_threshold,
                               "do_eviction": True,
                               "eviction_threshold_chars": self.max_tree_tokens,
                               "eviction_target_chars": self.max_tree_tokens * 9 // 10}
        if self.imbalanced_threshold is not None:  # Ray's default: never imbalanced
            out["imbalanced_threshold"] = self.imbalanced_threshold
        return out


class AppConfig(Strict):
    """Everything `medray.serve.app:build_app` needs; the `args` block of serve/*.yaml.

    Relative paths (model, models, adapters, api_keys_file) are resolved against
    `base_dir`: `medray serve --config FILE` sets it to FILE's folder; when unset (e.g. Serve's
    own `serve run`, whose builder does not see the file) the current directory is used.
    """

    model: str = Field(description="hub id or local path of the base (or merged) model")
    model_id: str = Field("medray", description="name clients use in the `model` field")
    # More full models by name (for example a fine-tuned model merged into its base), each
    # served by its own vLLM replicas beside `model`; /v1/qa and the OpenAI routes pick one
    # with their `model` field.
    models: dict[str, str] = Field(default_factory=dict)
    # Local PEFT adapters by name (served through ray.serve.llm's multiplexing with a
    # local loader); `lora_uri` instead names a cloud folder (s3://, gs://) of adapters for
    # Ray's own multi-LoRA loader.
    adapters: dict[str, str] = Field(default_factory=dict)
    lora_uri: str | None = None
    max_lora_rank: int = 16
    max_model_len: int = Field(2048, ge=64)
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    # Chosen by the config, never detected: the node that builds the app (often a CPU-only
    # head) says nothing about where the replicas run.
    device: Literal["cpu", "gpu"] = Field(description="where the vLLM replicas run")
    llm: Replicas = Field(default_factory=Replicas)
    # How the ingress picks an LLM replica: "prefix" keeps prompts that share a prefix (a
    # patient's epicrisis, with prompt.format eqa) on the replica that has it cached;
    # "default" is Serve's least-loaded of two. None: prefix with several LLM replicas.
    routing: Literal["prefix", "default"] | None = None
    prefix_routing: PrefixRouting = Field(default_factory=PrefixRouting)
    ingress: Replicas = Field(default_factory=lambda: Replicas(num_cpus=0.5))
    base_dir: str | None = None

    # Auth: keys (comma-separated) from the env var named here, and/or a secret file with
    # one key per line. Set require_auth false only for local experiments.
    api_keys_env: str | None = "MEDRAY_API_KEYS"
    api_keys_file: str | None = None
    require_auth: bool = True

    # How /v1/qa and /v1/mcq prompt each served model: None = as it was trained (the
    # prompt.json medray writes beside an adapter or merged model; the defaults for other
    # models). Fields set here override the recorded ones, with a warning where they differ.
    prompt: PromptOverride | None = None
    # /v1/qa limits.
    max_context_tokens: int | None = None  # defaults to max_model_len
    max_context_chars: int = Field(400_000, ge=1)

    # Limits of every route, checked before anything is tokenised.
    max_body_bytes: int = Field(2_000_000, ge=1024)
    max_text_chars: int = Field(8_000, ge=16, description="question, option, stop strings")
    max_n: int = Field(8, ge=1)
    max_logprobs: int = Field(20, ge=0)  # vLLM's own default cap
    max_batch: int = Field(64, ge=1, description="prompts per completion, messages per chat")
    max_questions: int = Field(64, ge=1, description="questions per /v1/qa/batch call")
    # Each image sent to a vision-language model (/v1/mcq `images`, chat image parts).
    max_image_bytes: int = Field(MAX_IMAGE_BYTES, ge=1024, le=MAX_IMAGE_BYTES)
    ready_cache_s: float = Field(5.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, raw: Any) -> Any:
        moved = moved_prompt_keys(raw, ("prompt_format", "context_tokens", "max_new_tokens",
                                        "reserve", "chunk_tokens"))
        if moved:
            raise ValueError("; ".join(moved))
        return raw

    @model_validator(mode="after")
    def _limits(self) -> AppConfig:
        problem = self.context_problem(self.prompt) if self.prompt is not None else None
        if problem:
            raise ValueError(problem)
        if self.max_context_tokens is None:
            self.max_context_tokens = self.max_model_len
        if self.routing is None:
            most = (self.llm.autoscaling.max_replicas if self.llm.autoscaling is not None
                    else self.llm.num_replicas or 1)
            self.routing = "prefix" if most > 1 else "default"
        if self.routing == "default" and self.prefix_routing != PrefixRouting():
            raise ValueError("prefix_routing is set but routing is 'default'; set routing: "
                             "prefix or drop prefix_routing")
        clash = ({self.model_id} | set(self.adapters)) & set(self.models)
        if clash:
            raise ValueError(f"models {sorted(clash)}: names already used by model_id/adapters")
        return self

    @property
    def context_limit(self) -> int:
        """The most tokens one prompt may budget (a prompt's `context_tokens`, and /v1/qa's
        `context_tokens` field): max_context_tokens, at most max_model_len."""
        return min(self.max_context_tokens or self.max_model_len, self.max_model_len)

    def context_problem(self, spec: PromptSpec) -> str | None:
        """Why a prompt cannot be served under the context limit; None when it can. The
        config, the start-up checks and the request schema all check this one rule."""
        if spec.context_tokens > self.context_limit:
            return (f"prompt.context_tokens {spec.context_tokens} > limit {self.context_limit}"
                    " (max_context_tokens, at most max_model_len)")
        return None

    def resolve(self, path: str) -> str:
        """A configured path made absolute against base_dir (hub ids are left alone)."""
        p = Path(path).expanduser()
        if p.is_absolute():
            return str(p)
        candidate = Path(self.base_dir or os.getcwd()) / p
        if candidate.exists() or _looks_local(path):
            return str(candidate.resolve())
        return path  # e.g. "org/model": a hub id

    def resolved(self) -> AppConfig:
        """A copy with every local path absolute, ready to be shipped to the replicas."""
        data = self.model_dump()
        data.update(
            model=self.resolve(self.model),
            models={k: self.resolve(v) for k, v in self.models.items()},
            adapters={k: self.resolve(v) for k, v in self.adapters.items()},
            api_keys_file=self.resolve(self.api_keys_file) if self.api_keys_file else None,
            base_dir=str(Path(self.base_dir or os.getcwd()).resolve()),
        )
        return AppConfig.model_validate(data)

    def served_folders(self) -> dict[str, str]:
        """Served name (as in /v1/models) -> the folder its prompt.json is read from."""
        out = {self.model_id: self.model, **self.models}
        out |= {f"{self.model_id}:{a}": p for a, p in self.adapters.items()}
        return out

    def takes_images(self, name: str) -> bool:
        """Whether served `name` is a vision-language model (its config has a vision tower:
        medray.models.vision), so its prompts may carry images."""
        from medray.models.vision import is_vision_model

        # An adapter rides on the base: the base decides.
        return is_vision_model(self.resolve(self.models.get(name, self.model)))

    def prompt_for(self, name: str, warn: Any = None) -> PromptSpec:
        """The PromptSpec of one served name: its folder's prompt.json (training's) with
        this config's `prompt` fields over it (a differing field is warned about)."""
        folder = self.resolve(self.served_folders()[name])
        recorded = load_prompt_spec(folder) if Path(folder).is_dir() else None
        return resolve_prompt(recorded, self.prompt, source=f"{name} ({folder})", warn=warn)

    def api_keys(self) -> set[str]:
        keys: set[str] = set()
        if self.api_keys_env and os.environ.get(self.api_keys_env):
            keys |= {k.strip() for k in os.environ[self.api_keys_env].split(",") if k.strip()}
        if self.api_keys_file:
            lines = Path(self.resolve(self.api_keys_file)).read_text().splitlines()
            keys |= {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}
        return keys


def _looks_local(path: str) -> bool:
    """A path a hub id cannot be: starts with . or ~, or has more than one slash."""
    return path.startswith((".", "~")) or path.count("/") > 1 or "\\" in path


class ServeFile(Strict):
    """The subset of a Serve config file that `medray serve --config` reads."""

    host: str = "127.0.0.1"
    port: int = 8000
    name: str = "medray"
    route_prefix: str = "/"
    args: AppConfig


def load_serve_file(path: str | os.PathLike) -> ServeFile:
    """Read serve/X.yaml (a Serve config file: http_options + applications[0].args).

    Relative paths in `args` are resolved against the file's folder; errors are
    ConfigErrors naming the file and the key (`applications.0.args.max_model_len`)."""
    file: dict[str, Any] = {}

    def app_args(raw: dict) -> tuple[dict, str]:
        apps = raw.get("applications") or []
        if not apps or not isinstance(apps, list) or not isinstance(apps[0], dict):
            raise ConfigError(f"{path}: no `applications` entry")
        file.update(http=raw.get("http_options") or {}, app=apps[0])
        args = {"base_dir": str(Path(path).resolve().parent), **(apps[0].get("args") or {})}
        return args, "applications.0.args"

    args = load_yaml(AppConfig, path, what="serve config", section=app_args)
    http, app = file["http"], file["app"]
    return ServeFile(host=http.get("host", "127.0.0.1"), port=http.get("port", 8000),
                     name=app.get("name", "medray"), route_prefix=app.get("route_prefix", "/"),
                     args=args)
