"""Base models: loading by hub id or path (load), LoRA targets (lora), the tiny offline CPU
model (tiny), vision-language models and the tiny one (vision), real pretrained models
imported from GGUF files (gguf).

Every name is re-exported here, so `from medray.models import X` is the one way in.
"""

from __future__ import annotations

from medray.models.gguf import (
    SMOLLM2_FILE,
    SMOLLM2_PACKAGE,
    GGUFError,
    import_gguf,
    import_smollm2,
    inspect_gguf,
)
from medray.models.load import (
    ATTENTION_IMPLEMENTATIONS,
    DTYPES,
    check_attn_implementation,
    check_model_exists,
    load_model_and_tokenizer,
    load_tokenizer,
    meta_model,
    torch_dtype,
)
from medray.models.lora import (
    ATTENTION_TARGETS,
    LoraTargetError,
    check_lora_targets,
    linear_module_names,
    resolve_lora_targets,
)
from medray.models.tiny import (
    SPECIAL_TOKENS,
    TINY_CHAT_TEMPLATE,
    VLLM_CPU_HEAD_SIZES,
    build_tiny_model,
    corpus_from_prepared,
    train_bpe_tokenizer,
)
from medray.models.vision import (
    build_tiny_vlm,
    image_token,
    is_vision_model,
    load_images,
    load_processor,
    load_vision_model,
)

__all__ = [
    "ATTENTION_IMPLEMENTATIONS", "ATTENTION_TARGETS", "DTYPES", "SMOLLM2_FILE",
    "SMOLLM2_PACKAGE", "SPECIAL_TOKENS", "TINY_CHAT_TEMPLATE", "VLLM_CPU_HEAD_SIZES",
    "GGUFError", "LoraTargetError", "build_tiny_model", "check_attn_implementation",
    "check_lora_targets", "check_model_exists", "corpus_from_prepared", "import_gguf",
    "import_smollm2", "inspect_gguf", "linear_module_names", "load_model_and_tokenizer",
    "load_tokenizer", "meta_model", "resolve_lora_targets", "torch_dtype",
    "train_bpe_tokenizer", "build_tiny_vlm", "image_token", "is_vision_model", "load_images",
    "load_processor", "load_vision_model",
]
