"""Checks on raw request bodies, done before anything is tokenised or sent to vLLM: body
size, valid UTF-8 text (no lone surrogates), and the caps of the OpenAI routes."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from medray.serve_config import AppConfig
from medray.serving.errors import APIError


async def read_json(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object; 413 past max_bytes (the rest is never read)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(int(declared), max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(size, max_bytes)
        chunks.append(chunk)
    try:
        data = json.loads(b"".join(chunks))
    except (ValueError, RecursionError):
        raise APIError(400, "invalid_json", "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise APIError(422, "invalid_request_error", "request body must be a JSON object")
    check_text(data)
    return data


def _too_large(size: int, limit: int) -> APIError:
    return APIError(413, "request_too_large", f"request body has {size} bytes; limit is {limit}")


def check_text(value: Any, path: str = "") -> None:
    """Every string must be encodable text: JSON allows lone surrogates ("\\ud800"), which
    no tokenizer takes."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise APIError(400, "invalid_text", f"{path or 'body'}: not valid Unicode text "
                           "(lone surrogate)", path or None) from None
    elif isinstance(value, dict):
        for k, v in value.items():
            check_text(k, path)
            check_text(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_text(v, f"{path}[{i}]")


def _int_field(body: dict[str, Any], name: str, low: int, high: int) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(400, "invalid_request_error", f"{name} must be an integer", name)
    if not low <= value <= high:
        raise APIError(400, "invalid_request_error",
                       f"{name} is {value}; allowed {low}..{high}", name)


def check_openai(body: dict[str, Any], kind: str, cfg: AppConfig) -> None:
    """Caps for /v1/completions and /v1/chat/completions (vLLM validates the rest)."""
    if "model" in body and body["model"] is not None and not isinstance(body["model"], str):
        raise APIError(400, "invalid_request_error", "model must be a string", "model")
    _int_field(body, "n", 1, cfg.max_n)
    _int_field(body, "best_of", 1, cfg.max_n)
    _int_field(body, "max_tokens", 1, cfg.max_model_len)
    _int_field(body, "max_completion_tokens", 1, cfg.max_model_len)
    _int_field(body, "prompt_logprobs", 0, cfg.max_logprobs)
    _int_field(body, "top_logprobs", 0, cfg.max_logprobs)
    if kind == "completions":
        _int_field(body, "logprobs", 0, cfg.max_logprobs)
        _check_prompt(body.get("prompt"), cfg)
    else:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise APIError(400, "invalid_request_error", "messages must be a non-empty list",
                           "messages")
        if len(messages) > cfg.max_batch:
            raise APIError(413, "request_too_large", f"{len(messages)} messages; limit is "
                           f"{cfg.max_batch}", "messages")
        if _chars(messages) > cfg.max_context_chars:
            raise APIError(413, "request_too_large", "messages have more than "
                           f"{cfg.max_context_chars} characters", "messages")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    if len(stops) > 16 or any(isinstance(s, str) and len(s) > cfg.max_text_chars
                              for s in stops):
        raise APIError(413, "request_too_large", "stop: at most 16 sequences of "
                       f"{cfg.max_text_chars} characters", "stop")


def _check_prompt(prompt: Any, cfg: AppConfig) -> None:
    """A string, a list of strings, a token-id list or a list of token-id lists, non-empty."""
    if prompt is None:
        raise APIError(400, "invalid_request_error", "prompt is required", "prompt")
    items = prompt if isinstance(prompt, list) and prompt and not isinstance(
        prompt[0], int) else [prompt]
    if len(items) > cfg.max_batch:
        raise APIError(413, "request_too_large", f"{len(items)} prompts; limit is "
                       f"{cfg.max_batch}", "prompt")
    for item in items:
        if isinstance(item, str):
            if not item:
                raise APIError(400, "invalid_request_error", "prompt is empty", "prompt")
            if len(item) > cfg.max_context_chars:
                raise APIError(413, "request_too_large", f"prompt has {len(item)} characters;"
                               f" limit is {cfg.max_context_chars}", "prompt")
        elif isinstance(item, list):
            if not item or not all(isinstance(t, int) and not isinstance(t, bool)
                                   for t in item):
                raise APIError(400, "invalid_request_error",
                               "a token prompt must be a non-empty list of integers", "prompt")
            if len(item) > cfg.max_model_len:
                raise APIError(413, "request_too_large", f"prompt has {len(item)} tokens; "
                               f"max_model_len is {cfg.max_model_len}", "prompt")
        else:
            raise APIError(400, "invalid_request_error", "prompt must be text or token ids",
                           "prompt")


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 0
