"""Engine specs -> Engine instances: `openai:MODEL`, `anthropic:MODEL`, `hf:PATH`,
`vllm:PATH`, `serve:URL`.

Local engines (hf.py, vllm.py, serve.py) are imported only when asked for, so parsing a
spec or building an API engine never pulls in torch/vLLM.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

API_PROVIDERS = ("openai", "anthropic")
LOCAL_PROVIDERS = ("hf", "vllm", "serve")
PROVIDERS = API_PROVIDERS + LOCAL_PROVIDERS

# provider -> (module, engine class): imported only when that provider is asked for.
_LOCAL_CLASSES: dict[str, tuple[str, str]] = {
    "hf": ("medray.engines.hf", "HFEngine"),
    "vllm": ("medray.engines.vllm", "VLLMEngine"),
    "serve": ("medray.engines.serve", "ServeEngine"),
}


class EngineSpecError(ValueError):
    pass


@dataclass(frozen=True)
class EngineSpec:
    provider: str
    target: str  # model name (API), path (hf/vllm) or URL (serve)

    @property
    def external(self) -> bool:
        """Sent through a third-party provider's SDK: governance treats it as external
        whatever its base URL (a local URL may still be a proxy to the provider)."""
        return self.provider in API_PROVIDERS

    def __str__(self) -> str:
        return f"{self.provider}:{self.target}"


def parse_spec(spec: str) -> EngineSpec:
    provider, sep, target = spec.partition(":")
    provider = provider.strip().lower()
    if not sep or not target.strip():
        raise EngineSpecError(f"engine spec {spec!r}: expected PROVIDER:TARGET, e.g. "
                              "openai:gpt-4o-mini, anthropic:claude-3-5-haiku-20241022, "
                              "hf:PATH, vllm:PATH, serve:URL")
    if provider not in PROVIDERS:
        raise EngineSpecError(f"engine spec {spec!r}: unknown provider {provider!r}; "
                              f"expected one of {', '.join(PROVIDERS)}")
    return EngineSpec(provider, target.strip())


def build_engine(spec: str | EngineSpec, *, base_url: str | None = None,
                 cache: str | Path | None = None, **kwargs: Any) -> Any:
    """Build the engine; `base_url` and `cache` apply to the API engines only."""
    parsed = parse_spec(spec) if isinstance(spec, str) else spec
    if parsed.provider == "openai":
        from medray.engines.openai import OpenAIEngine

        return OpenAIEngine(parsed.target, base_url=base_url, cache=cache, **kwargs)
    if parsed.provider == "anthropic":
        from medray.engines.anthropic import AnthropicEngine

        return AnthropicEngine(parsed.target, base_url=base_url, cache=cache, **kwargs)
    module_name, class_name = _LOCAL_CLASSES[parsed.provider]
    return getattr(importlib.import_module(module_name), class_name)(parsed.target, **kwargs)
