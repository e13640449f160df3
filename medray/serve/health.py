"""Readiness of the ingress: every LLM deployment has a running replica that answers a
1-token request (cached while it holds); Serve's own health check once the app was ready."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ray import serve

from medray.serve.errors import APIError
from medray.serve.relay import Target


class Readiness:
    """Mixed into the ingress (medray.serve.app.QAIngress), which sets `cfg`, `llms`,
    `tokenizer`, `_call` and the `_ready_*` state."""

    cfg: Any
    llms: dict[str, Any]
    tokenizer: Any
    _ready_cache: tuple[float, bool, str]
    _ready_lock: asyncio.Lock
    _was_ready: bool
    _call: Any  # QAIngress._call: the last item of an LLM call

    async def _ready(self) -> tuple[bool, str]:
        """Every LLM deployment has a RUNNING replica and answers a 1-token request;
        a success is cached for ready_cache_s so probes cost the engine almost nothing (a
        failure is not: the next probe may already see the replica that just started)."""
        async with self._ready_lock:
            at, ok, detail = self._ready_cache
            if ok and time.monotonic() - at < self.cfg.ready_cache_s:
                return ok, detail
            ok, detail = await self._probe()
            self._ready_cache = (time.monotonic(), ok, detail)
            self._was_ready |= ok
            return ok, detail

    async def _probe(self) -> tuple[bool, str]:
        from ray.serve.llm.openai_api_models import CompletionRequest

        try:
            status = await asyncio.to_thread(serve.status)
        except Exception as exc:  # noqa: BLE001
            return False, f"Serve status unavailable ({type(exc).__name__})"
        token = self.tokenizer.bos_token_id or self.tokenizer.eos_token_id or 0
        for name, handle in self.llms.items():
            app_status = status.applications.get(handle.app_name)
            dep = app_status.deployments.get(handle.deployment_name) if app_status else None
            running = (dep.replica_states.get("RUNNING", 0) if dep else 0)
            if not running:
                return False, f"{name}: no running LLM replica"
            req = CompletionRequest(model=name, prompt=[token], max_tokens=1)
            try:
                await asyncio.wait_for(self._call(Target(handle, name, "", name, None),
                                                  "completions", req), timeout=30)
            except (TimeoutError, APIError) as exc:
                return False, f"{name}: {getattr(exc, 'message', 'timed out')}"
        return True, "ok"

    async def check_health(self) -> None:
        """Serve's own health check: readiness, once the app has been ready (a replica that
        is still starting its LLM is not restarted for it)."""
        ok, detail = await self._ready()
        if not ok and self._was_ready:
            raise RuntimeError(f"not ready: {detail}")

