"""Checks on request bodies: body size and valid UTF-8 text (no lone surrogates) before
anything is parsed further; the context window (as vLLM checks it) before the engine is
called. Every other bound is in the request models (schemas.py, openai_models.py)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from medray.serve.errors import APIError, context_error


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


def prompt_tokens(prompt: Any, tokenizer: Any, bound: int) -> list[int]:
    """Tokens of each completion prompt as vLLM counts them (text with the tokenizer's
    special tokens). A text whose UTF-8 bytes, plus two special tokens, stay under `bound`
    is not tokenised: byte-level tokenizers give at most one token per byte."""
    items = prompt if isinstance(prompt, list) and prompt and not isinstance(
        prompt[0], int) else [prompt]
    out = []
    for item in items:
        if isinstance(item, list):
            out.append(len(item))
        elif len(item.encode("utf-8")) + 2 < bound:
            out.append(0)
        else:
            out.append(len(tokenizer.encode(item, add_special_tokens=True)))
    return out


def chat_tokens(messages: list[Any], tokenizer: Any) -> int | None:
    """Tokens of the rendered conversation (the model's chat template, as vLLM renders it:
    text parts joined by newlines); None where the template cannot render it (vLLM says why)."""
    conversation = []
    for m in messages:
        content = m.content
        if isinstance(content, list):
            # text parts only: image tokens are the model's processor's to count
            content = "\n".join(p.text for p in content if p.type == "text")
        conversation.append({"role": m.role, "content": content or ""})
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False,
                                             add_generation_prompt=True)
    except Exception:  # noqa: BLE001 -- no template, or one that refuses this conversation
        return None
    return len(tokenizer.encode(text, add_special_tokens=False))


def check_window(lengths: list[int], limit: int, new_tokens: int, param: str) -> None:
    """vLLM's rule: each prompt leaves room for the generated tokens it must produce (one;
    none for echo with max_tokens 0); longer max_tokens are clamped to what is left."""
    longest = max(lengths, default=0)
    if longest + new_tokens > limit:
        raise context_error(limit, longest, param, new_tokens=new_tokens)


def check_openai_window(body: Any, tokenizer: Any, limit: int) -> None:
    """Each prompt of a completion / the rendered chat fits the window with room for a
    generated token (vLLM's rule; with echo and max_tokens 0 vLLM still runs one step)."""
    if hasattr(body, "prompt"):
        check_window(prompt_tokens(body.prompt, tokenizer, limit), limit, 1, "prompt")
    else:
        check_window([chat_tokens(body.messages, tokenizer) or 0], limit, 1, "messages")


_CHARS_PER_TOKEN: dict[int, int] = {}


def chars_per_token(tokenizer: Any) -> int:
    """The longest token's length (per tokenizer object; the ingress keeps them)."""
    key = id(tokenizer)
    if key not in _CHARS_PER_TOKEN:
        _CHARS_PER_TOKEN[key] = max(map(len, tokenizer.get_vocab()))
    return _CHARS_PER_TOKEN[key]


def check_chars(chars: int, limit: int, chars_per_token: int, param: str) -> None:
    """vLLM's check before tokenising: text longer than the window's tokens can hold at the
    tokenizer's longest token is over the window, whatever its tokens."""
    if chars > limit * chars_per_token:
        raise APIError(400, "invalid_request_error", (
            f"This model's maximum context length is {limit} tokens; the text has {chars} "
            f"characters, more than {limit} tokens can hold. Shorten it."), param)
