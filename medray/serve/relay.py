"""Relaying to the LLM deployments: where a request goes, how engine failures map to HTTP
statuses, and server-sent events as vLLM's own server writes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from ray.serve.handle import DeploymentHandle

from medray.engines.base import Generation
from medray.serve.errors import OPENAI_TYPES, APIError


@dataclass
class Target:
    """Where a request goes: the LLM handle, vLLM's model name, and how medray reports it."""

    handle: DeploymentHandle
    vllm_model: str
    source: str  # model folder / hub id (its tokenizer)
    model: str
    adapter: str | None


def generations(response: Any) -> list[Generation]:
    out = []
    for choice in sorted(response.choices, key=lambda c: c.index):
        lps = choice.logprobs.token_logprobs if choice.logprobs else []
        out.append(Generation(
            text=choice.text,
            token_ids=list(choice.token_ids or []),
            prompt_ids=list(getattr(choice, "prompt_token_ids", None) or []),
            logprobs=[float(x) for x in lps if x is not None],
            raw=choice.text,
        ))
    return out


def engine_error(exc: BaseException) -> APIError:
    """Failures of the LLM deployment call: the engine's validation errors are the client's
    (400); an unavailable or overloaded replica is the service's (503/429)."""
    from ray import exceptions as rex
    from ray.serve.exceptions import BackPressureError

    cause = getattr(exc, "cause", None) or exc
    client_error = any(c.__name__ == "VLLMClientError" for c in type(cause).__mro__)
    if client_error or isinstance(cause, (ValueError, TypeError, OverflowError,
                                          ValidationError)):
        return APIError(400, "invalid_request_error", str(cause)[:1000])
    if isinstance(cause, BackPressureError):
        return APIError(429, "rate_limit", "too many requests in flight; retry later")
    if isinstance(exc, (rex.RayActorError, rex.ActorUnavailableError, TimeoutError)):
        return APIError(503, "unavailable", "the LLM replica is unavailable; retry later")
    return APIError(503, "engine_error", f"the LLM engine failed ({type(cause).__name__})")


def relayed_error(error: Any) -> APIError:
    """vLLM's ErrorResponse as medray's error: its status and message, OpenAI's type for
    the status; an engine fault (5xx) is the service's, a 503."""
    code = int(getattr(error, "code", 500) or 500)
    if code >= 500 or code not in OPENAI_TYPES:
        return APIError(503, "engine_error", "the LLM engine failed; retry later")
    param = getattr(error, "param", None)
    return APIError(code, OPENAI_TYPES[code], str(error.message)[:1000],
                    param if isinstance(param, str) else None)


async def sse(first: Any, gen: Any) -> Any:
    """Server-sent events as vLLM's own server writes them, ending with [DONE]; a failure
    mid-stream becomes an error event (the status line is already sent)."""
    import json

    from medray.serve.ray_internal import openai_sse_packet

    done = False
    try:
        for item in [first]:
            packet = openai_sse_packet(item)
            done |= packet.strip().endswith("data: [DONE]")
            yield packet
        async for item in gen:
            packet = openai_sse_packet(item)
            done |= packet.strip().endswith("data: [DONE]")
            yield packet
    except Exception as exc:  # noqa: BLE001
        err = engine_error(exc)
        yield "data: " + json.dumps({"error": {"message": err.message, "type": err.kind,
                                               "code": err.status}}) + "\n\n"
    if not done:
        yield "data: [DONE]\n\n"
