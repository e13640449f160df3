"""Where training tensors live: the worker's device, collectives on it, the dtype cast.

One place for device handling, so CPU workers (gloo) and GPU workers (nccl) run the same
code: every tensor the loop builds is created on, or moved to, the worker's device
(`ray.train.torch.get_device()` unless one is injected, e.g. by a test or by
bench/gpu_check.py, which has no Ray). Nothing here imports Ray at module level.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

# NCCL has no CPU tensors and gloo no CUDA ones: name both, so a collective on either kind
# of tensor (object gathers, DeepSpeed's own CPU-side calls) finds a backend.
GPU_BACKEND = "cpu:gloo,cuda:nccl"
CPU_BACKEND = "gloo"


def torch_backend(use_gpu: bool) -> str:
    """The `TorchConfig(backend=...)` of a run."""
    return GPU_BACKEND if use_gpu else CPU_BACKEND


def skip_shm_comm_build() -> None:
    """Keep DeepSpeed from compiling its shared-memory all-reduce op before it sets up
    communication. On CPU it compiles it with gcc on first use and again whenever its build
    cache was last written from another environment (20-130 s on two cores), but only
    tensor-parallel inference calls it: ZeRO training reduces through torch.distributed.
    DeepSpeed keeps one dict of compatible ops, and edits to it persist."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def ray_device() -> Any:
    from ray.train.torch import get_device

    return get_device()


def worker_device(get_device: Callable[[], Any] | None = None) -> Any:
    """The torch.device this worker computes on; CUDA devices become the current device
    (NCCL object collectives and DeepSpeed use `torch.cuda.current_device()`)."""
    import torch

    device = torch.device((get_device or ray_device)())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def to_device(batch: Mapping[str, Any], device: Any) -> dict[str, Any]:
    """Every tensor of a batch on `device` (non-blocking from pinned memory); the rest as is."""
    import torch

    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()}


def reduce_tensor(values: list[float], device: Any, op: str = "sum") -> Any:
    """Sum (or min) a few scalars over all workers; the tensor lives on the worker's device
    (NCCL has no CPU tensors)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MIN)
    return t


def all_reduce(values: list[float], device: Any, op: str = "sum") -> list[float]:
    return reduce_tensor(values, device, op).tolist()


def synced(batches: Iterable[Any], device: Any) -> Iterator[Any]:
    """Yield batches while EVERY worker still has one: ZeRO collectives need equal counts."""
    it = iter(batches)
    while True:
        batch = next(it, None)
        if all_reduce([0.0 if batch is None else 1.0], device, op="min")[0] == 0.0:
            return
        yield batch


def cast_parameters(model: Any, dtype: Any) -> Any:
    """Parameters to the training dtype; buffers keep theirs.

    `module.to(bf16)` would also round RoPE's float32 `inv_freq` buffer to bf16: phase
    errors of several radians at a few thousand positions, unlike the full-precision RoPE
    vLLM serves with. DeepSpeed's own mixed-precision cast also leaves buffers alone.
    """
    for p in model.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return model


def float_buffers(model: Any) -> dict[str, Any]:
    """Name -> dtype of the floating-point buffers (what the dtype cast must preserve)."""
    return {n: b.dtype for n, b in model.named_buffers() if b.is_floating_point()}
