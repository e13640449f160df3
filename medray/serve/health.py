"""Readiness of the ingress: every LLM deployment has a running replica that answers.

An LLM that answered any request within the probe's timeout is ready without a probe: under
load a 1-token probe waits behind every prompt in the engine's queue, and a busy engine is
not a dead one. Serve's health check of the ingress is Serve's own (the replica answers):
tying it to the LLM would get the ingress restarted while its LLM works through a long
queue, dropping every request in flight. Each LLM replica has its engine's own check."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ray import serve

from medray.serve.errors import APIError
from medray.serve.relay import Target

PROBE_TIMEOUT_S = 30.0


class Readiness:
    """Mixed into the ingress (medray.serve.app.QAIngress), which sets `cfg`, `llms`,
    `tokenizer`, `_call`, `counts` and the `_ready_*` state, and calls `_answered` after
    every LLM answer."""

    cfg: Any
    llms: dict[str, Any]
    tokenizer: Any
    _ready_cache: tuple[float, bool, str]
    _ready_lock: asyncio.Lock
    _answered_at: dict[str, float]  # LLM deployment -> when it last answered (monotonic)
    counts: Any
    _call: Any  # QAIngress._call: the last item of an LLM call

    def _answered(self, handle: Any) -> None:
        self._answered_at[handle.deployment_name] = time.monotonic()

    async def _ready(self) -> tuple[bool, str]:
        """Every LLM deployment has a RUNNING replica and has answered within the probe's
        timeout, or answers a 1-token request now; a success is cached for ready_cache_s (a
        failure is not: the next probe may already see the replica that just started)."""
        async with self._ready_lock:
            at, ok, detail = self._ready_cache
            if ok and time.monotonic() - at < self.cfg.ready_cache_s:
                return ok, detail
            ok, detail = await self._probe()
            self._ready_cache = (time.monotonic(), ok, detail)
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
            answered = self._answered_at.get(handle.deployment_name)
            if answered is not None and time.monotonic() - answered < PROBE_TIMEOUT_S:
                continue  # busy answering others: ready, and no probe joins its queue
            self.counts["ready_probe"] += 1
            req = CompletionRequest(model=name, prompt=[token], max_tokens=1)
            try:
                await asyncio.wait_for(self._call(Target(handle, name, "", name, None),
                                                  "completions", req),
                                       timeout=PROBE_TIMEOUT_S)
            except (TimeoutError, APIError) as exc:
                return False, f"{name}: {getattr(exc, 'message', 'timed out')}"
        return True, "ok"
