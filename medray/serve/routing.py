"""Which LLM replica a request goes to, with several of them: the prefix-aware router.

/v1/qa sends token ids (the prompt the training code assembled), never text, and Ray Serve
LLM's PrefixCacheAffinityRouter only keys on text: token-id prompts read as "" to it (no
affinity, and a division by zero on the empty key). `PromptPrefixRouter` is that router
with a key for token ids, one character per token, so with prompt.format eqa a patient's
questions share their epicrisis as a key prefix and stay on the replica whose vLLM prefix
cache holds it; a new patient goes to the replica holding the fewest cached prompts.

The replica side: `count_prefix_cache` adds a counter of vLLM's prefix-cache stats to a
replica's engine, read per replica with `replica_cache_stats` (the benchmark and tests).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.llm.request_router import PrefixCacheAffinityRouter

from medray.serve.config import AppConfig
from medray.serve.ray_internal import broadcast, prefix_tree_actor

ROUTER_PATH = "medray.serve.routing.PromptPrefixRouter"
TREE_LOST = (RayActorError, ActorUnavailableError)  # the prefix tree's actor or node died
# Token ids as private-use code points: one character per token keeps the tree small and
# its prefix lengths in tokens; ids past the range wrap (a routing key only, never decoded).
_BASE, _SPAN = 0xE000, 0x10FFFF - 0xE000


def prompt_key(prompt: Any) -> str:
    """The routing key of a completion prompt: text as is, token ids (one list, or a
    batch of lists) one character per token; "" for anything else."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return "".join(chr(_BASE + t % _SPAN) for t in prompt)
    if isinstance(prompt, list):
        return "".join(prompt_key(p) for p in prompt if isinstance(p, str | list))
    return ""


class PromptPrefixRouter(PrefixCacheAffinityRouter):
    """PrefixCacheAffinityRouter keyed on token ids too, deciding one request at a time on
    an up-to-date tree (see `_prefix_match_best_replicas`); an empty key (nothing to
    match) or replicas whose ongoing requests differ by more than `imbalanced_threshold`
    fall back to Serve's least-loaded of two."""

    def initialize_state(self, **kwargs: Any) -> None:
        tree = kwargs.pop("tree_actor", None) or prefix_tree_actor(self._deployment_id)
        super().initialize_state(tree_actor=tree, **kwargs)
        self._deciding = asyncio.Lock()
        self._recorded: set[str] = set()  # requests whose prefix was recorded as routed

    def _extract_text_from_request(self, pending_request: Any) -> str:
        for arg in pending_request.args or ():
            prompt = getattr(arg, "prompt", None)
            if prompt is not None:
                return prompt_key(prompt)
            messages = getattr(arg, "messages", None)
            if messages is not None:  # chat: Ray's own reading of the messages' text
                return self._normalize_prompt_to_string(messages)
        return ""

    async def _loads(self, replicas: list[Any]) -> dict[Any, int]:
        """Ongoing requests per replica: the router's cache, probing the replicas it lacks."""
        loads, missing = {}, []
        for r in replicas:
            n = self._replica_queue_len_cache.get(r.replica_id)
            if n is None or n >= r.max_ongoing_requests:
                missing.append(r)
            else:
                loads[r.replica_id] = n
        if missing:
            for r, n in await self._probe_queue_lens(missing, 0):
                if n is not None:
                    loads[r.replica_id] = n
        return loads

    async def _prefix_match_best_replicas(self, pending_request: Any,
                                          candidate_replicas: list[Any]) -> list[Any]:
        """Ray's rule (follow the longest prefix match; below match_rate_threshold, the
        replica holding the fewest cached prompt characters, i.e. the fewest patients),
        ties to the replica with fewer ongoing requests, and the prefix recorded on the
        chosen replica before the next request decides: a new patient's concurrent
        questions (and other new patients) would otherwise read a tree without it and
        scatter or pile onto one replica. Ray records a prefix only once its request is
        sent, and blocks the router's event loop on each tree call (ray.get, three or
        four per request); here one awaited round trip per request decides."""
        key = self._extract_text_from_request(pending_request) if pending_request else ""
        if not key or not candidate_replicas:
            return [[]]
        loads = await self._loads(candidate_replicas)
        if loads and max(loads.values()) - min(loads.values()) > self._imbalanced_threshold:
            return [[]]  # Serve's least-loaded of two; on_request_routed records it
        by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
        async with self._deciding:  # one decision at a time, each on the last one's tree
            match = self._tree_actor.prefix_match.remote(key, list(by_id))
            smallest = self._tree_actor.get_smallest_tenants.remote()
            try:
                (matched, tenants), fewest = await match, await smallest
            except TREE_LOST:
                self._renew_tree()
                return [[]]  # Serve's least-loaded of two, this once
            if len(matched) < self._match_rate_threshold * len(key):
                tenants = fewest
            chosen = [by_id[t] for t in tenants or () if t in by_id] or candidate_replicas
            one = min(chosen, key=lambda r: loads.get(r.replica_id, 0))
            # Not awaited: the tree actor runs this router's calls in order, so the next
            # decision's match already sees it.
            self._tree_actor.insert.remote(key, one.replica_id.to_full_id_str(), time.time())
        if len(self._recorded) > 10_000:  # ids of requests cancelled before being sent
            self._recorded.clear()
        self._recorded.add(pending_request.metadata.internal_request_id)
        return [[one]]

    def _renew_tree(self) -> None:
        """A fresh prefix tree, every current replica a tenant: the old one was lost with
        its node (a routing decision, or a replica update, found it dead). Its records are
        gone, so patients find their replicas again as they come."""
        import ray

        self._tree_actor = prefix_tree_actor(self._deployment_id)
        ids = [rid.to_full_id_str() for rid in self._replica_id_set]
        ray.get(self._tree_actor.add_tenants.remote(ids, time.time()))
        self._eviction_loop_running = False  # the next replica update starts it there

    def update_replicas(self, replicas: list[Any]) -> None:
        try:  # Serve's replica set first, then Ray's tree updates (ray.get on the tree)
            super().update_replicas(replicas)
        except TREE_LOST:
            self._renew_tree()

    def on_replica_actor_died(self, replica_id: Any) -> None:
        try:
            super().on_replica_actor_died(replica_id)
        except TREE_LOST:
            self._renew_tree()

    def on_request_routed(self, pending_request: Any, replica_id: Any, result: Any) -> None:
        if pending_request is None:
            return
        rid = pending_request.metadata.internal_request_id
        if rid in self._recorded:  # recorded as it was chosen
            self._recorded.discard(rid)
            return
        key = self._extract_text_from_request(pending_request)
        if key:  # a load fallback: the prefix now lives on this replica too
            self._tree_actor.insert.remote(key, replica_id.to_full_id_str(), time.time())


def request_router_config(cfg: AppConfig) -> dict[str, Any] | None:
    """The LLM deployments' `request_router_config`; None keeps Serve's default router."""
    if cfg.routing != "prefix":
        return None
    return {"request_router_class": ROUTER_PATH,
            "request_router_kwargs": cfg.prefix_routing.router_kwargs()}


def count_prefix_cache(engine_client: Any) -> dict[str, int] | None:
    """Totals of vLLM's prefix-cache stats (requests, queried and hit prompt tokens, the
    numbers behind vllm:prefix_cache_queries/hits) kept by a stat logger added to this
    replica's engine; None when the engine keeps no stats. Imports vLLM: replicas only."""
    from vllm.v1.metrics.loggers import AggregateStatLoggerBase

    manager = getattr(engine_client, "logger_manager", None)
    if manager is None:
        return None
    totals = {"requests": 0, "queries": 0, "hits": 0}

    class PrefixCacheCounter(AggregateStatLoggerBase):
        def __init__(self) -> None:  # no per-engine state: totals above
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any,
                   mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            stats = getattr(scheduler_stats, "prefix_cache_stats", None)
            if stats is not None:
                for name in totals:
                    totals[name] += getattr(stats, name)

        def log_engine_initialized(self) -> None:
            pass

    manager.stat_loggers.append(PrefixCacheCounter())
    return totals


def replica_cache_stats(app_name: str, deployment: str) -> dict[str, dict[str, int]]:
    """{replica id: prefix-cache totals} of every running replica of an LLM deployment."""
    from ray import serve

    handle = serve.get_deployment_handle(deployment, app_name=app_name)
    return {r["replica"]: r["totals"] for r in broadcast(handle, "prefix_cache_stats")}


def llm_deployments(app_name: str) -> list[str]:
    """The LLM deployments of a running medray app (all but the ingress)."""
    from ray import serve

    app = serve.status().applications[app_name]
    return sorted(d for d in app.deployments if d != "QAIngress")
