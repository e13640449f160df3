"""Every use of Ray's private APIs, in one place: the pieces of Ray's LLM serving stack
that the Serve app extends but `ray.serve.llm` does not export.

Checked against Ray 2.60.0 (the version pyproject.toml pins); private modules move between
Ray releases, so a Ray upgrade re-checks this module and nothing else. Everything except
`CallbackBase` is imported inside a function: the vLLM engine class imports vLLM, which
only replicas load.
"""

from __future__ import annotations

import os
from typing import Any

# The base class of an LLMConfig `callback_config.callback_class` (no public export).
from ray.llm._internal.common.callbacks.base import CallbackBase

RAY_VERSION_CHECKED = "2.60.0"

__all__ = ["RAY_VERSION_CHECKED", "CallbackBase", "broadcast", "disk_multiplex_config",
           "engine_class_overridden", "openai_sse_packet", "prefix_tree_actor",
           "vllm_engine_class"]


def disk_multiplex_config(**fields: Any) -> Any:
    """What a LoRA `model_downloader` returns for an adapter folder on local disk."""
    from ray.llm._internal.serve.core.configs.llm_config import DiskMultiplexConfig

    return DiskMultiplexConfig(**fields)


def engine_class_overridden() -> bool:
    """Whether the replica's environment names its own engine class (Ray's override)."""
    from ray.llm._internal.serve.constants import RAYLLM_VLLM_ENGINE_CLS_ENV

    return bool(os.environ.get(RAYLLM_VLLM_ENGINE_CLS_ENV))


def vllm_engine_class() -> type:
    """ray.serve.llm's vLLM engine (imports vLLM)."""
    from ray.llm._internal.serve.engines.vllm.vllm_engine import VLLMEngine

    return VLLMEngine


def openai_sse_packet(item: Any) -> str:
    """One streamed response as the server-sent event(s) Ray's own OpenAI ingress writes."""
    from ray.llm._internal.serve.core.ingress.utils import _apply_openai_json_format

    return _apply_openai_json_format(item)


def prefix_tree_actor(deployment_id: Any) -> Any:
    """The prefix tree PrefixCacheAffinityRouter keeps for one LLM deployment: the actor
    Ray's router would create (same name and namespace, so every ingress replica shares
    it, and `serve.shutdown()` removes it), but with no CPU reserved. Ray's own reserves
    the default actor CPU for scheduling, which a CPU-only cluster whose CPUs all went to
    replicas never frees, and routing then waits forever."""
    import ray
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import (
        PrefixTreeActor,
    )
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    namespace = "::".join([SERVE_NAMESPACE, deployment_id.app_name, deployment_id.name])
    # On the router's own node where it can (not wherever a 0-CPU actor lands): losing
    # another node then leaves routing alone.
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    actor = PrefixTreeActor.options(name="LlmPrefixTreeActor", namespace=namespace,
                                    get_if_exists=True, lifetime="detached",
                                    num_cpus=0, scheduling_strategy=here).remote()
    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    ray.get(controller._register_shutdown_cleanup_actor.remote(actor))
    return actor


def broadcast(handle: Any, method: str) -> list[Any]:
    """Call `method` on every running replica of a deployment (Ray LLM's control-plane
    broadcast; blocking)."""
    from ray.llm._internal.serve.utils.broadcast import broadcast as ray_broadcast

    return ray_broadcast(handle, method)
