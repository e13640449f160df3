"""Prompt log-probs with LoRA served: one prompt per engine request.

With LoRA enabled a prompt-log-prob sequence must be alone in the engine's batch (llm.py);
the replica serialises such requests, and here a request with several prompts is split
into one request per prompt, answered as one response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from medray.serve.errors import APIError
from medray.serve.relay import Target, sse

Stream = Callable[[Target, str, Any], Awaitable[tuple[Any, Any]]]


async def last_response(first: Any, gen: Any) -> dict[str, Any]:
    """The final item of an LLM call's stream, as the OpenAI JSON body."""
    result = first
    async for item in gen:
        result = item
    result = result[-1] if isinstance(result, list) else result
    return result.model_dump(mode="json")


async def one_prompt_at_a_time(stream: Stream, target: Target, method: str, req: Any) -> Any:
    """Answer `req` with one engine request per prompt; `stream` is the ingress's call."""
    if getattr(req, "n", 1) not in (None, 1) or (getattr(req, "best_of", None) or 1) > 1:
        raise APIError(400, "unsupported", "with LoRA adapters served, prompt log-probs "
                       "(echo with logprobs, or prompt_logprobs) need n=1", "n")
    prompt = getattr(req, "prompt", None)
    several = isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)
    if not several or len(prompt) == 1:
        first, gen = await stream(target, method, req)
        if req.stream:
            return StreamingResponse(sse(first, gen), media_type="text/event-stream")
        return JSONResponse(await last_response(first, gen))
    if req.stream:
        raise APIError(400, "unsupported", "with LoRA adapters served, prompt log-probs "
                       "of several prompts cannot be streamed; send stream=false or one "
                       "prompt per request", "stream")
    merged: dict[str, Any] | None = None
    for i, one in enumerate(prompt):
        part = await last_response(*await stream(
            target, method, req.model_copy(update={"prompt": one})))
        for choice in part["choices"]:
            choice["index"] = i
        if merged is None:
            merged = part
            continue
        merged["choices"] += part["choices"]
        for key, value in (part.get("usage") or {}).items():
            if isinstance(value, int) and isinstance(merged["usage"].get(key), int):
                merged["usage"][key] += value
    return JSONResponse(merged)
