"""OpenAI (and any OpenAI-compatible server, medray's own Serve endpoint included) through
the official `openai` SDK's chat completions, behind the Engine protocol (see api.py)."""

from __future__ import annotations

from typing import Any

from medray.engines.api import APIEngine, ChatRequest, image_b64


class OpenAIEngine(APIEngine):
    name = "openai"
    default_key_env = "OPENAI_API_KEY"

    def __init__(self, model: str, *, max_tokens_param: str | None = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        # api.openai.com wants max_completion_tokens (max_tokens is deprecated and refused by
        # reasoning models); OpenAI-compatible servers (vLLM, Ray Serve LLM) all know max_tokens.
        self.max_tokens_param = max_tokens_param or (
            "max_tokens" if self.base_url else "max_completion_tokens")

    def _make_client(self, api_key: str) -> Any:
        from openai import OpenAI

        return OpenAI(api_key=api_key, base_url=self.base_url, max_retries=self.max_retries,
                      timeout=self.timeout)

    def payload(self, request: ChatRequest, max_new_tokens: int,
                temperature: float | None) -> dict:
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        if request.images:
            # Text first, then the images in the order given (protocol: case image, then
            # the sub-question image), as data URLs.
            content: list[dict[str, Any]] = [{"type": "text", "text": request.user}]
            for path in request.images:
                media, data = image_b64(path, request.image_root)
                content.append({"type": "image_url",
                                "image_url": {"url": f"data:{media};base64,{data}"}})
            messages.append({"role": "user", "content": content})
        else:
            messages.append({"role": "user", "content": request.user})
        body: dict[str, Any] = {"model": self.model, "messages": messages,
                                self.max_tokens_param: max_new_tokens, **self.params}
        if temperature is not None:
            body["temperature"] = temperature
        return body

    def _send(self, payload: dict) -> dict:
        resp = self.client.chat.completions.create(**self._sdk_kwargs(payload))
        choice = resp.choices[0]
        usage = resp.usage
        return {"text": choice.message.content or "",
                "input_tokens": getattr(usage, "prompt_tokens", 0) or 0,
                "output_tokens": getattr(usage, "completion_tokens", 0) or 0,
                "finish_reason": choice.finish_reason}
