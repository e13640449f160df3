"""vLLM's engine core inside the Serve replica's own process (CPU replicas).

ray.serve.llm's VLLMEngine builds vLLM's `AsyncLLM`, which always starts its engine core
in a child process, and Ray forces vLLM's multiprocess executor on CPU, which starts one
more worker process for the model. On CPU both only compete with the replica for the same
cores, and each imports torch and vLLM again (bench/serve_memory.py measures what they
hold). Here the replica runs the engine core itself, with vLLM's single-process executor,
as the offline engine (medray/engines/vllm.py) does.

vLLM has no asyncio in-process client, so `AsyncInprocClient` drives vLLM's synchronous
`InprocClient` from one thread: the engine core is only ever touched by that thread (it is
not thread-safe), and model steps run there while the replica's event loop keeps relaying
requests. The switch is the SERVE_INPROC_ENV variable of the replica's runtime env
(medray.serve.llm sets it on CPU); "0" keeps vLLM's multiprocess engine.
"""

from __future__ import annotations

import asyncio
import logging
import os
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from typing import Any

from vllm.v1.engine.core_client import EngineCoreClient, InprocClient

from medray.engines.vllm import SERVE_ENGINE_THREAD as ENGINE_THREAD
from medray.engines.vllm import SERVE_INPROC_ENV
from medray.serve.ray_internal import vllm_engine_class

# Serve's logger: its lines land in the replica's own log, beside the request log.
log = logging.getLogger("ray.serve")

# EngineCoreClient's `*_async` methods that map one-to-one onto InprocClient's sync ones.
_THREADED = ("get_supported_tasks", "abort_requests", "add_lora", "remove_lora",
             "list_loras", "pin_lora", "reset_mm_cache", "reset_prefix_cache",
             "reset_encoder_cache", "profile", "sleep", "wake_up", "is_sleeping",
             "release_kv_cache_memory", "collective_rpc", "save_sharded_state",
             "execute_dummy_batch", "set_weight_version", "get_weight_version")


def _name_os_thread() -> None:
    try:
        import setproctitle  # vLLM's dependency; names its own processes with it

        setproctitle.setthreadtitle(ENGINE_THREAD)
    except (ImportError, AttributeError):  # only a name for people
        pass


def in_process() -> bool:
    return os.environ.get(SERVE_INPROC_ENV) == "1"


class AsyncInprocClient(InprocClient):
    """The asyncio client AsyncLLM expects, over an engine core in this process."""

    def __init__(self, vllm_config: Any, executor_class: Any, log_stats: bool) -> None:
        super().__init__(vllm_config, executor_class, log_stats)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=ENGINE_THREAD,
                                          initializer=_name_os_thread)
        self._work = asyncio.Event()
        # What AsyncLLM reads of an MP client: its dead flag and the engines it runs.
        self.resources = types.SimpleNamespace(engine_dead=False)
        self.engine_ranks_managed = [0]

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, lambda: fn(*args, **kwargs))
        except RuntimeError as err:  # the thread is gone: shut down
            if self.resources.engine_dead:
                from vllm.v1.engine.exceptions import EngineDeadError

                raise EngineDeadError() from err
            raise

    async def get_output_async(self) -> Any:
        """The next step's outputs; waits (without stepping) while no request is in."""
        while True:
            self._work.clear()  # before the check: an add after it sets the event again
            if await self._call(self.engine_core.scheduler.has_requests):
                break
            await self._work.wait()
        try:
            return await self._call(self.get_output)
        except Exception:
            self.resources.engine_dead = True
            raise

    async def add_request_async(self, request: Any) -> None:
        await self._call(self.add_request, request)
        self._work.set()

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        await self._call(self.abort_requests, request_ids)
        self._work.set()

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the engine core on its own thread, after the step in flight (if any);
        waits `timeout` seconds at most (the thread finishes the stop regardless)."""
        self.resources.engine_dead = True
        try:
            stop = self._thread.submit(super().shutdown)
        except RuntimeError:  # stopped already
            return
        self._thread.shutdown(wait=False)
        try:
            stop.result(timeout)
        except FutureTimeout:
            log.info("[shutdown] in-process vLLM engine core: still stopping after %ss "
                     "(the step in flight ends first)", timeout)
            return
        log.info("[shutdown] in-process vLLM engine core: stopped")


def _threaded(name: str) -> Callable[..., Any]:
    async def method(self: AsyncInprocClient, *args: Any, **kwargs: Any) -> Any:
        return await self._call(getattr(self, name), *args, **kwargs)

    method.__name__ = f"{name}_async"
    return method


for _name in _THREADED:
    setattr(AsyncInprocClient, f"{_name}_async", _threaded(_name))


@contextmanager
def _inproc_core_client() -> Iterator[None]:
    """AsyncLLM's constructor builds its client with `make_async_mp_client` (no option):
    swapped for the in-process one while this replica's AsyncLLM is built (one engine
    per replica process), then put back."""
    original = EngineCoreClient.__dict__["make_async_mp_client"]

    def make(vllm_config: Any, executor_class: Any, log_stats: bool,
             *args: Any, **kwargs: Any) -> AsyncInprocClient:
        return AsyncInprocClient(vllm_config, executor_class, log_stats)

    EngineCoreClient.make_async_mp_client = staticmethod(make)  # type: ignore[method-assign]
    try:
        yield
    finally:
        EngineCoreClient.make_async_mp_client = original  # type: ignore[method-assign]


class InprocVLLMEngine(vllm_engine_class()):  # type: ignore[misc]
    """ray.serve.llm's VLLMEngine, with the engine core and model in the replica's process
    when SERVE_INPROC_ENV is "1" (CPU replicas); unchanged otherwise."""

    def _start_async_llm_engine(self, vllm_engine_args: Any, vllm_engine_config: Any,
                                placement_group: Any) -> Any:
        if not in_process():
            return super()._start_async_llm_engine(
                vllm_engine_args, vllm_engine_config, placement_group)
        # Ray sets "mp" for CPU; "uni" runs the model in the engine core's process.
        vllm_engine_config.parallel_config.distributed_executor_backend = "uni"
        with _inproc_core_client():
            return super()._start_async_llm_engine(
                vllm_engine_args, vllm_engine_config, placement_group)
