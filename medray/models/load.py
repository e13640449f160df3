"""Base models and tokenizers by hub id or local path: dtypes, attention, existence checks."""

from __future__ import annotations

from typing import Any

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "auto": "auto"}


def torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}")
    return "auto" if name == "auto" else getattr(torch, DTYPES[name])


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False,
                   cache_dir: str | None = None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code,
                                        cache_dir=cache_dir)
    if tok.pad_token is None:
        # The reference code set none; any id works because padded labels are -100.
        tok.pad_token = tok.unk_token or tok.eos_token
    return tok


def load_model_and_tokenizer(
    name_or_path: str, dtype: str = "bf16", *, trust_remote_code: bool = False,
    device: Any = None, cache_dir: str | None = None, attn_implementation: str | None = None,
):
    """Any causal LM by hub id or local path, with a tokenizer that has a pad token.

    `device`: load the weights straight onto it (a device map), not into host RAM first.
    `cache_dir`: the Hugging Face cache to download into (shared storage on a cluster, so
    workers and restarts reuse one download). `attn_implementation`: sdpa, eager or
    flash_attention_2.
    """
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(name_or_path, trust_remote_code, cache_dir)
    extra: dict[str, Any] = {}
    if device is not None:
        extra["device_map"] = {"": str(device)}
    if attn_implementation:
        extra["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(
        name_or_path, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code,
        cache_dir=cache_dir, **extra,
    )
    return model, tokenizer


ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")


def check_attn_implementation(name: str) -> str:
    """sdpa / eager always; flash_attention_2 only where the flash-attn package is installed."""
    import importlib.util

    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"model.attn_implementation {name!r}: expected one of "
                         f"{ATTENTION_IMPLEMENTATIONS}")
    if name == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ValueError("model.attn_implementation 'flash_attention_2' needs the flash-attn "
                         "package (CUDA only); install it on the GPU workers or use 'sdpa'")
    return name


def check_model_exists(name_or_path: str, trust_remote_code: bool = False):
    """Fail early (before any worker starts) when the model cannot be resolved."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(
            f"model.name_or_path {name_or_path!r}: not a model directory and not a hub id "
            f"available here ({type(exc).__name__})"
        ) from exc



def meta_model(name_or_path: str, trust_remote_code: bool = False) -> Any:
    """The model's module tree without weights (meta device): cheap even for 8B models."""
    import torch
    from transformers import AutoModelForCausalLM

    config = check_model_exists(name_or_path, trust_remote_code)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
