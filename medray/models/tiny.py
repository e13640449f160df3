"""The tiny CPU model: the offline default for tests and the demo.

A Llama-architecture model built from a config (random init) plus a byte-level BPE
tokenizer trained on the corpus, both written with `save_pretrained` so transformers and
vLLM load the directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from medray.io import atomic_directory

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
