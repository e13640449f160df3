"""Which prompt an evaluation uses: the evaluated model's own (as it was trained), with the
eval config's `prompt` fields laid over it (medray.prompts.resolve_prompt warns where an
override differs from training).

Where the model's prompt comes from, per engine kind:
- vllm, hf: the prompt.json beside the adapter (engine.adapter), else beside the model folder;
- serve: the endpoint's /v1/models card of the evaluated name (the Serve app read the
  same prompt.json from the folder it serves), in-cluster when engine.app is set;
- API engines: none (the config's, else the defaults); baselines read no prompt.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from medray.eval.config import EngineSpec, EvalConfig
from medray.prompts.spec import PromptSpec, load_prompt_spec, resolve_prompt


def _local_spec(path: str | None) -> PromptSpec | None:
    if path and Path(path).is_dir():
        return load_prompt_spec(path)
    return None


def served_prompt(engine: EngineSpec, api_key: str | None = None) -> PromptSpec | None:
    """The PromptSpec a medray endpoint reports for the evaluated model (None if it reports
    none)."""
    card = served_model(engine, api_key)
    return PromptSpec.model_validate(card["prompt"]) if card and card.get("prompt") else None


def served_model(engine: EngineSpec, api_key: str | None = None) -> dict | None:
    """The endpoint's /v1/models card of the evaluated name (None if it lists none); read
    in-cluster when `engine.app` is set, else over HTTP."""
    import httpx

    from medray.engines.registry import build_engine
    from medray.engines.serve import ServeError, served_card

    where = f"Serve app {engine.app!r}" if engine.app else f"{(engine.url or '').rstrip('/')}"
    client = build_engine(engine, api_key=api_key)  # EngineSpecError: app not callable
    try:
        models = client.models()
    except (httpx.HTTPError, ServeError) as err:
        raise ValueError(f"{where}/v1/models: cannot read the served model's card "
                         f"({err})") from None
    finally:
        client.close()
    return served_card(models, engine.model or "medray", engine.adapter)


def serve_api_key(cfg: EvalConfig) -> str | None:
    """The key a serve engine's config names (its api_key_env), if set here."""
    key_env = cfg.engine.engine_kwargs().get("api_key_env")
    return os.environ.get(key_env) if cfg.engine.kind == "serve" and key_env else None


def recorded_prompt(engine: EngineSpec, api_key: str | None = None) -> tuple[Any, str]:
    """(the evaluated model's recorded PromptSpec or None, where it came from)."""
    if engine.kind in ("vllm", "hf"):
        for path in (engine.adapter, engine.model):
            spec = _local_spec(path)
            if spec is not None:
                return spec, str(path)
        return None, str(engine.model)
    if engine.kind == "serve":
        where = f"Serve app {engine.app}" if engine.app else engine.url
        return served_prompt(engine, api_key), f"{where} ({engine.label})"
    return None, engine.label


def resolve_eval_prompt(cfg: EvalConfig, api_key: str | None = None,
                        warn: Any = None) -> PromptSpec:
    """The PromptSpec of this evaluation (computed once, on the driver)."""
    recorded, source = recorded_prompt(cfg.engine, api_key)
    return resolve_prompt(recorded, cfg.prompt, source=source, warn=warn)


def with_resolved_prompt(cfg: EvalConfig) -> EvalConfig:
    """The config with `prompt` resolved against the evaluated model's own (prompt.json, or
    the endpoint's card), so every actor uses exactly it. Baselines read no prompt."""
    if cfg.engine.kind == "baseline":
        return cfg
    spec = resolve_eval_prompt(cfg, serve_api_key(cfg))
    if cfg.engine.kind in ("vllm", "hf") and spec.chat_template == "auto":
        from medray.models import load_tokenizer

        try:  # recorded as what it becomes for the model's tokenizer
            spec = spec.with_chat_template_of(load_tokenizer(str(cfg.engine.model)))
        except (OSError, ValueError):  # no tokenizer here (an engine built elsewhere):
            pass  # the engine decides "auto" with its own, and the record says "auto"
    return cfg.model_copy(update={"prompt": spec})
