"""LoRA target modules: the papers' attention projections per architecture, checked
against the model's linear layers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# LoRA on the attention projections, as in the papers (Table/section "LoRA adaptation").
ATTENTION_TARGETS: dict[str, list[str]] = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "mistral": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "mixtral": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "gemma": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "gemma2": ["q_proj", "k_proj", "v_proj", "o_proj"],
    # Phi-3 and Phi-4-mini (model_type "phi3") fuse q, k and v into one projection.
    "phi3": ["qkv_proj", "o_proj"],
    "phi4": ["qkv_proj", "o_proj"],
    "phi": ["q_proj", "k_proj", "v_proj", "dense"],
}


class LoraTargetError(ValueError):
    """A LoRA target module name matches no linear layer of the model."""


def resolve_lora_targets(model_type: str, targets: str | Sequence[str]) -> str | list[str]:
    """'auto' -> the papers' attention projections per architecture; 'all-linear' passes."""
    if isinstance(targets, str):
        if targets == "all-linear":
            return "all-linear"
        if targets != "auto":
            return [targets]
        if model_type not in ATTENTION_TARGETS:
            raise LoraTargetError(
                f"lora.target_modules 'auto': no default for model_type {model_type!r}; "
                f"name the modules (known: {sorted(ATTENTION_TARGETS)}) or use 'all-linear'"
            )
        return list(ATTENTION_TARGETS[model_type])
    return list(targets)


def linear_module_names(model: Any) -> list[str]:
    """Leaf names (last dotted part) of the model's Linear layers, lm_head excluded."""
    import torch

    linear = torch.nn.Linear
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, linear)}
    names.discard("lm_head")
    return sorted(names)


def check_lora_targets(model: Any, targets: str | Sequence[str]) -> str | list[str]:
    """Every named target must match at least one Linear layer; returns the resolved list."""
    resolved = resolve_lora_targets(getattr(model.config, "model_type", ""), targets)
    if resolved == "all-linear":
        return resolved
    available = linear_module_names(model)
    if "lm_head" in resolved:  # the output projection is a valid explicit target (vLLM too)
        available.append("lm_head")
    missing = [t for t in resolved if t not in available]
    if missing:
        raise LoraTargetError(
            f"lora.target_modules {missing} match no module of {type(model).__name__} "
            f"(model_type {model.config.model_type!r}); its linear layers are {available}"
        )
    return resolved
