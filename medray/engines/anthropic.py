"""Anthropic Claude through the official `anthropic` SDK's Messages API, behind the Engine
protocol (see api.py)."""

from __future__ import annotations

from typing import Any

from medray.engines.api import APIEngine, ChatRequest, image_b64


class AnthropicEngine(APIEngine):
    name = "anthropic"
    default_key_env = "ANTHROPIC_API_KEY"

    def _make_client(self, api_key: str) -> Any:
        from anthropic import Anthropic

        return Anthropic(api_key=api_key, base_url=self.base_url, max_retries=self.max_retries,
                         timeout=self.timeout)

    def payload(self, request: ChatRequest, max_new_tokens: int,
                temperature: float | None) -> dict:
        content: list[dict[str, Any]] = [{"type": "text", "text": request.user}]
        # Images after the text, in the order given (protocol: case image, then sub-question).
        for path in request.images:
            media, data = image_b64(path, request.image_root)
            content.append({"type": "image",
                            "source": {"type": "base64", "media_type": media, "data": data}})
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_new_tokens,
                                "messages": [{"role": "user", "content": content}],
                                **self.params}
        if request.system:
            body["system"] = request.system
        if temperature is not None:
            body["temperature"] = temperature
        return body

    def _send(self, payload: dict) -> dict:
        resp = self.client.messages.create(**self._sdk_kwargs(payload))
        text = "".join(getattr(b, "text", "") for b in resp.content if b.type == "text")
        return {"text": text, "input_tokens": resp.usage.input_tokens or 0,
                "output_tokens": resp.usage.output_tokens or 0,
                "finish_reason": resp.stop_reason}
