"""Base models and tokenizers: load by hub id or path, LoRA targets, the tiny CPU model.

The tiny model is the offline default for tests and the demo: a Llama-architecture model
built from a config (random init) plus a byte-level BPE tokenizer trained on the corpus,
both written with `save_pretrained` so transformers and vLLM load the directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from medray.fsutil import atomic_directory

# vLLM on CPU accepts only these attention head sizes (docs/architecture.md).
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

SPECIAL_TOKENS = {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"}

# A plain chat template: a single user turn renders exactly as the raw prompt (the papers'
# prompts use no chat template), so /v1/chat/completions and /v1/completions agree.
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}"
    "{% endif %}{% endfor %}"
)

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

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "auto": "auto"}


class LoraTargetError(ValueError):
    """A LoRA target module name matches no linear layer of the model."""


# ----------------------------------------------------------------------------- tiny model


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2):
    """A byte-level BPE tokenizer (no unknown bytes) wrapped as PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(SPECIAL_TOKENS.values())
    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos = SPECIAL_TOKENS["bos"]
    # Like Llama: BOS in front of every encoded text (added by the tokenizer itself).
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=SPECIAL_TOKENS["eos"],
        pad_token=SPECIAL_TOKENS["pad"],
        unk_token=SPECIAL_TOKENS["unk"],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def build_tiny_model(
    out_dir: str | os.PathLike,
    texts: Iterable[str],
    *,
    vocab_size: int = 4096,
    hidden_size: int = 128,
    n_layers: int = 2,
    n_heads: int = 2,
    n_kv_heads: int | None = None,
    intermediate_size: int = 256,
    max_position_embeddings: int = 8192,
    tie_word_embeddings: bool = True,
    seed: int = 0,
) -> Path:
    """Train a tokenizer on `texts`, build a random-init Llama, save both to `out_dir`.

    Written to a temporary sibling and renamed, so a failure leaves no partial directory.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    head_dim = hidden_size // n_heads
    if hidden_size % n_heads or head_dim not in VLLM_CPU_HEAD_SIZES:
        raise ValueError(
            f"hidden_size {hidden_size} / n_heads {n_heads} gives head size "
            f"{hidden_size / n_heads:g}; vLLM on CPU needs one of {VLLM_CPU_HEAD_SIZES}"
        )
    tokenizer = train_bpe_tokenizer(texts, vocab_size=vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads or n_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=tie_word_embeddings,
        rope_theta=10000.0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id

    out = Path(out_dir)
    with atomic_directory(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "medray_tiny.json").write_text(json.dumps(
            {"kind": "tiny-llama", "seed": seed, "vocab_size": len(tokenizer),
             "hidden_size": hidden_size, "n_layers": n_layers, "n_heads": n_heads}, indent=2))
    return out


def corpus_from_prepared(data_dir: str | os.PathLike) -> list[str]:
    """Tokenizer corpus of a prepared dataset: contexts + questions + answers (+ options)."""
    from medray.data.prepared import load_prepared

    data = load_prepared(data_dir)
    texts: list[str] = []
    if data.contexts is not None:
        texts += data.contexts["text"].astype(str).tolist()
    texts += data.examples["question"].astype(str).tolist()
    if data.kind == "generative":
        texts += data.examples["answer"].astype(str).tolist()
    else:
        texts += [o["text"] for opts in data.examples["options"] for o in opts]
    return texts


# ------------------------------------------------------------------------ loading


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


# ---------------------------------------------------------------------- LoRA targets


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


def meta_model(name_or_path: str, trust_remote_code: bool = False) -> Any:
    """The model's module tree without weights (meta device): cheap even for 8B models."""
    import torch
    from transformers import AutoModelForCausalLM

    config = check_model_exists(name_or_path, trust_remote_code)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
