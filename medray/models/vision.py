"""Vision-language models: telling one from a text-only model, loading it with its processor,
reading an item's images, and the tiny offline one for tests (`medray model tiny-vlm`).

The tiny VLM is the SmolVLM architecture (Idefics3: a SigLIP-style vision tower, a pixel-
shuffle connector and a Llama text model), random-init from a config, with the tiny model's
byte-level BPE tokenizer plus the image tokens, and an image processor that needs neither
torchvision nor the hub. vLLM on CPU serves it; LLaVA, Qwen2-VL and Gemma 3 need
torchvision in vLLM's model code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from medray.io import atomic_directory, write_json_atomic

IMAGE_TOKEN = "<image>"
# Idefics3's processor expands each <image> into these around the image's patch tokens.
IMAGE_SPECIAL_TOKENS = ("<fake_token_around_image>", IMAGE_TOKEN, "<end_of_utterance>",
                        "<global-img>")
# The tiny model's template (medray.models.tiny) with content lists: an image part renders
# as <image>, where the processor puts the image's tokens.
TINY_VLM_CHAT_TEMPLATE = (
    "{% macro render(c) %}{% if c is string %}{{ c }}{% else %}{% for p in c %}"
    "{% if p['type'] == 'image' %}<image>{% else %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endmacro %}"
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ render(m['content']) }}\n\n"
    "{% elif m['role'] == 'user' %}{{ render(m['content']) }}"
    "{% elif m['role'] == 'assistant' %} {{ render(m['content']) }}{{ eos_token }}"
    "{% endif %}{% endfor %}"
)
TINY_VLM_TEXTS = ("Domanda risposta A B C D E uno due tre quattro cinque immagine caso",
                  "Question answer image case patient radiograph", "IT0001: A")


def is_vision_model(name_or_path: str | os.PathLike | None) -> bool:
    """True when the model's config has a vision tower (a vision-language model); a hub id
    not in the local cache counts as text-only (no download to find out)."""
    if not name_or_path:
        return False
    config = Path(name_or_path) / "config.json"
    if config.is_file():
        try:
            return "vision_config" in json.loads(config.read_text())
        except (OSError, ValueError):
            return False
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(str(name_or_path), local_files_only=True)
    except (OSError, ValueError):
        return False
    return getattr(cfg, "vision_config", None) is not None


def load_processor(name_or_path: str) -> Any:
    """The model's processor, its tokenizer given the processor's chat template when it has
    none of its own (SmolVLM keeps the template on the processor)."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(name_or_path)
    tok = processor.tokenizer
    if getattr(tok, "chat_template", None) is None and getattr(processor, "chat_template", None):
        tok.chat_template = processor.chat_template
    if tok.pad_token is None:
        tok.pad_token = tok.unk_token or tok.eos_token
    return processor


def load_vision_model(name_or_path: str, dtype: str = "fp32") -> tuple[Any, Any, Any]:
    """(model, tokenizer, processor) of a vision-language model by path or hub id."""
    from transformers import AutoModelForImageTextToText

    from medray.models.load import torch_dtype

    processor = load_processor(name_or_path)
    model = AutoModelForImageTextToText.from_pretrained(name_or_path, dtype=torch_dtype(dtype))
    return model, processor.tokenizer, processor


def image_token(processor: Any) -> str:
    return str(getattr(processor, "image_token", None) or IMAGE_TOKEN)


def load_images(paths: Sequence[str], root: str | None) -> list[Any]:
    """The item's images as RGB PIL images, each re-checked before it is read (inside
    `root`, a real image, under the size cap: medray.data.images)."""
    from PIL import Image

    from medray.data.images import confined_images

    images = []
    for real in confined_images(paths, root):
        with Image.open(real) as img:
            images.append(img.convert("RGB"))
    return images


def build_tiny_vlm(
    out_dir: str | os.PathLike,
    texts: Iterable[str] = TINY_VLM_TEXTS,
    *,
    vocab_size: int = 512,
    hidden_size: int = 128,
    n_layers: int = 2,
    n_heads: int = 2,
    image_size: int = 32,
    patch_size: int = 8,
    seed: int = 0,
) -> Path:
    """A random-init tiny Idefics3 (SmolVLM architecture) + processor, saved for
    transformers and vLLM; written to a temporary sibling and renamed."""
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        LlamaConfig,
    )
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    from medray.models.tiny import VLLM_CPU_HEAD_SIZES, train_bpe_tokenizer

    head_dim = hidden_size // n_heads
    if hidden_size % n_heads or head_dim not in VLLM_CPU_HEAD_SIZES:
        raise ValueError(f"hidden_size {hidden_size} / n_heads {n_heads}: vLLM on CPU needs a "
                         f"head size in {VLLM_CPU_HEAD_SIZES}")
    tok = train_bpe_tokenizer(list(texts) * 4, vocab_size=vocab_size, min_frequency=1)
    tok.add_special_tokens({"additional_special_tokens": list(IMAGE_SPECIAL_TOKENS)})
    tok.chat_template = TINY_VLM_CHAT_TEMPLATE
    scale = 2  # the connector's pixel shuffle: (image/patch)^2 / scale^2 tokens per image
    image_seq_len = (image_size // patch_size) ** 2 // scale**2
    vision = Idefics3VisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=2, image_size=image_size,
                                  patch_size=patch_size)
    text = LlamaConfig(vocab_size=len(tok), hidden_size=hidden_size,
                       intermediate_size=2 * hidden_size, num_hidden_layers=n_layers,
                       num_attention_heads=n_heads, num_key_value_heads=n_heads,
                       head_dim=head_dim, max_position_embeddings=4096,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    config = Idefics3Config(vision_config=vision.to_dict(), text_config=text.to_dict(),
                            image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN),
                            scale_factor=scale, tie_word_embeddings=False,
                            pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config).to(torch.float32)
    model.generation_config.pad_token_id = tok.pad_token_id
    edge = {"longest_edge": image_size}
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(do_image_splitting=False, size=edge,
                                                  max_image_size=edge),
        tokenizer=tok, image_seq_len=image_seq_len, chat_template=TINY_VLM_CHAT_TEMPLATE)
    out = Path(out_dir)
    with atomic_directory(out, command="model tiny-vlm") as tmp:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        write_json_atomic(tmp / "medray_tiny.json", {
            "kind": "tiny-vlm", "architecture": "Idefics3", "seed": seed,
            "vocab_size": len(tok), "hidden_size": hidden_size, "n_layers": n_layers,
            "n_heads": n_heads, "image_size": image_size, "image_tokens": image_seq_len})
    return out
