"""Shared machinery of the paid-API engines (openai.py, anthropic.py).

One call per item, through the provider's official SDK. Transport failures (429, 5xx,
timeouts, connection errors) are retried with backoff by the SDK itself (`max_retries`,
`timeout`); an answer is never retried because of its content. Every answer goes through
the on-disk cache first, so a rerun or resumed run makes no new calls. Keys come only
from the environment and are never logged, cached or written anywhere.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import mimetypes
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from medray.engines.accounting import RateLimiter, Usage
from medray.engines.base import Generation, OptionScore
from medray.engines.cache import ResponseCache, cache_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChatRequest:
    """A system + user message and images (paths, in the order they must be sent)."""

    system: str | None
    user: str
    images: tuple[str, ...] = ()
    # The folder every image must resolve inside (the prepared dataset's input folder).
    image_root: str | None = None


@dataclass
class APIGeneration(Generation):
    output_tokens: int = 0
    cached: bool = False
    finish_reason: str | None = None


class MissingAPIKey(RuntimeError):
    pass


def image_b64(path: str, root: str | None = None) -> tuple[str, str]:
    """(media type, base64 data) of an image file, re-checked before it is read: inside
    `root` (default: the link's own folder, so a symlink cannot lead elsewhere), a real
    image, under the size cap (medray.data.images)."""
    from medray.data.images import confined_images, media_type

    real = confined_images([path], root)[0]
    data = real.read_bytes()
    media = media_type(data[:16]) or mimetypes.guess_type(path)[0] or "image/png"
    return media, base64.b64encode(data).decode("ascii")


def is_loopback(url: str | None) -> bool:
    if not url:
        return False
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key_from_env(env_var: str, base_url: str | None) -> str:
    key = os.environ.get(env_var)
    if key:
        return key
    if is_loopback(base_url):  # a local OpenAI-compatible server without auth
        return "EMPTY"
    raise MissingAPIKey(f"no API key: set the environment variable {env_var}")


class APIEngine:
    """Engine protocol over a chat API; `chat` is the full interface (system, images)."""

    name = "api"
    default_key_env = ""
    supports_images = True

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str | None = None,
        max_retries: int = 5,
        timeout: float = 60.0,
        concurrency: int = 4,
        requests_per_minute: float | None = None,
        temperature: float | None = None,
        params: dict[str, Any] | None = None,
        cache: ResponseCache | str | Path | None = None,
    ) -> None:
        self.model = model
        self.adapter = None
        self.base_url = base_url.rstrip("/") if base_url else None
        self.api_key_env = api_key_env or self.default_key_env
        self.max_retries, self.timeout = max_retries, timeout
        self.concurrency = max(1, concurrency)
        self.temperature = temperature  # None: the provider's default decoding
        self.params = dict(params or {})
        self.cache = ResponseCache(cache) if isinstance(cache, str | Path) else cache
        self.usage = Usage(model)
        self.limiter = RateLimiter(requests_per_minute)
        self._client: Any = None

    # -- provider-specific ------------------------------------------------------------
    def _make_client(self, api_key: str) -> Any:
        raise NotImplementedError

    def payload(self, request: ChatRequest, max_new_tokens: int,
                temperature: float | None) -> dict:
        raise NotImplementedError

    def _send(self, payload: dict) -> dict:
        """One SDK call -> {"text", "input_tokens", "output_tokens", "finish_reason"}."""
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------
    def _sdk_kwargs(self, payload: dict) -> dict:
        """Configured extra fields go in the JSON body as they are (`extra_body`), so any
        provider field works whatever the installed SDK version's signature knows."""
        extra = {k: payload[k] for k in self.params if k in payload}
        kwargs = {k: v for k, v in payload.items() if k not in extra}
        return {**kwargs, "extra_body": extra} if extra else kwargs

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self._make_client(api_key_from_env(self.api_key_env, self.base_url))
        return self._client

    def describe(self) -> dict:
        return {"engine": self.name, "model": self.model, "base_url": self.base_url,
                "api_key_env": self.api_key_env, "max_retries": self.max_retries,
                "timeout_s": self.timeout, "concurrency": self.concurrency,
                "temperature": self.temperature if self.temperature is not None
                else "provider default", "params": self.params}

    def _one(self, request: ChatRequest, max_new_tokens: int,
             temperature: float | None) -> APIGeneration:
        payload = self.payload(request, max_new_tokens, temperature)
        key = cache_key(self.name, self.base_url, self.model, payload)
        hit = self.cache.get(key) if self.cache is not None else None
        if hit is None:
            self.limiter.wait()
            hit = self._send(payload)
            if self.cache is not None:
                self.cache.put(key, self.name, self.model, hit)
            cached = False
        else:
            cached = True
        self.usage.add(hit.get("input_tokens", 0), hit.get("output_tokens", 0), cached)
        return APIGeneration(text=hit["text"], prompt_tokens=int(hit.get("input_tokens") or 0),
                             raw=hit["text"], output_tokens=int(hit.get("output_tokens") or 0),
                             cached=cached, finish_reason=hit.get("finish_reason"))

    def chat(self, requests: Sequence[ChatRequest], *, max_new_tokens: int,
             temperature: float | None = None) -> list[APIGeneration]:
        """One call per request (cache first), at most `concurrency` in flight, in order."""
        temp = self.temperature if temperature is None else temperature
        if len(requests) <= 1 or self.concurrency == 1:
            return [self._one(r, max_new_tokens, temp) for r in requests]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futures = [pool.submit(self._one, r, max_new_tokens, temp) for r in requests]
            return [f.result() for f in futures]

    def generate(self, prompts: Sequence[str], *, max_new_tokens: int,
                 temperature: float | None = None) -> list[Generation]:
        """Plain prompts sent as one user message each (no system prompt)."""
        return list(self.chat([ChatRequest(None, p) for p in prompts],
                              max_new_tokens=max_new_tokens, temperature=temperature))

    def score_options(self, prompt: str, continuations: Sequence[str]) -> list[OptionScore]:
        raise NotImplementedError(
            f"{self.name} engines cannot score option log-likelihoods (chat APIs return no "
            "prompt log-probs); use generation-based multiple-choice scoring")
