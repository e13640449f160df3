"""Fake HTTP servers speaking the Anthropic Messages API and the OpenAI chat-completions
wire formats, bound to 127.0.0.1 on a free port in a daemon thread.

They count requests (`calls`), keep the request bodies and headers, and can answer the
first N requests with an error status (429 / 500) to prove the SDKs' own retries work.
`responder(body) -> str` decides the answer text.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[dict], str]


def _user_text(body: dict) -> str:
    """The text of the last user message (string or content blocks)."""
    content = [m for m in body.get("messages", []) if m.get("role") == "user"][-1]["content"]
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if b.get("type") == "text")


class FakeServer:
    path = "/"
    auth_header = ""

    def __init__(self, responder: Responder | None = None, fail_first: int = 0,
                 fail_status: int = 429) -> None:
        self.responder = responder or (lambda body: "A")
        self.fail_first, self.fail_status = fail_first, fail_status
        self.calls = 0  # every request that reached the server, failed ones included
        self.ok_calls = 0
        self.bodies: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    # --- wire format, per provider ---------------------------------------------------
    def ok_body(self, body: dict, text: str) -> dict:
        raise NotImplementedError

    def error_body(self, status: int) -> dict:
        raise NotImplementedError

    # --- lifecycle -------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> FakeServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                status, payload = server._handle(self.path, body, dict(self.headers))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status == 429:
                    self.send_header("retry-after-ms", "10")
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def _handle(self, path: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
        with self._lock:
            self.calls += 1
            n = self.calls
            self.headers.append(headers)
        if not path.rstrip("/").endswith(self.path):
            return 404, self.error_body(404)
        if n <= self.fail_first:
            return self.fail_status, self.error_body(self.fail_status)
        text = self.responder(body)
        with self._lock:
            self.ok_calls += 1
            self.bodies.append(body)
        return 200, self.ok_body(body, text)


class FakeAnthropic(FakeServer):
    path = "/v1/messages"

    def ok_body(self, body: dict, text: str) -> dict:
        return {
            "id": f"msg_{self.ok_calls:06d}", "type": "message", "role": "assistant",
            "model": body.get("model", "fake"), "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": len(_user_text(body).split()) + 7,
                      "output_tokens": max(1, len(text.split()))},
        }

    def error_body(self, status: int) -> dict:
        kind = {429: "rate_limit_error", 404: "not_found_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": f"fake {status}"}}


class FakeOpenAI(FakeServer):
    path = "/chat/completions"

    def ok_body(self, body: dict, text: str) -> dict:
        prompt = len(_user_text(body).split()) + 5
        completion = max(1, len(text.split()))
        return {
            "id": f"chatcmpl-{self.ok_calls:06d}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        }

    def error_body(self, status: int) -> dict:
        return {"error": {"message": f"fake {status}", "type": "server_error", "code": None}}
