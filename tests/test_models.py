"""Tiny model factory, loading, LoRA target resolution (no Ray; ~15 s)."""

from __future__ import annotations

import json

import pytest

from medray.models import (
    VLLM_CPU_HEAD_SIZES,
    LoraTargetError,
    build_tiny_model,
    check_lora_targets,
    load_model_and_tokenizer,
    resolve_lora_targets,
)


def _meta(config):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_tiny_model_loads_with_specials_and_chat_template(tiny_model):
    model, tok = load_model_and_tokenizer(str(tiny_model), "fp32")
    cfg = model.config
    assert cfg.model_type == "llama"
    assert cfg.head_dim in VLLM_CPU_HEAD_SIZES and cfg.hidden_size // cfg.num_attention_heads == 64
    assert {tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token} == {
        "<s>", "</s>", "<pad>", "<unk>"}
    assert len({tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}) == 3
    ids = tok("Intrebare: Are pacientul metastaze? Raspuns:")["input_ids"]
    assert ids[0] == tok.bos_token_id  # BOS added like Llama tokenizers
    # Byte-level BPE: Romanian diacritics round-trip exactly, nothing becomes <unk>.
    text = "Pacienta prezintă leziuni hepatice și țesut cicatricial"
    enc = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in enc and tok.decode(enc) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "Intrebare: x Raspuns:"}],
                                   tokenize=False, add_generation_prompt=True)
    assert chat == "<s>Intrebare: x Raspuns:"
    assert model.config.vocab_size == len(tok)
    assert json.loads((tiny_model / "medray_tiny.json").read_text())["kind"] == "tiny-llama"


def test_tiny_model_rejects_head_size_vllm_cpu_cannot_serve(tmp_path):
    with pytest.raises(ValueError, match="head size 16"):
        build_tiny_model(tmp_path / "m", ["a b c"] * 10, hidden_size=64, n_heads=4)
    assert not (tmp_path / "m").exists()  # no partial output


def test_lora_targets_per_architecture():
    from transformers import LlamaConfig, MistralConfig, Phi3Config, Qwen2Config

    small = {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 32,
             "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    qkvo = ["q_proj", "k_proj", "v_proj", "o_proj"]
    for cfg_cls in (LlamaConfig, MistralConfig, Qwen2Config):
        assert check_lora_targets(_meta(cfg_cls(**small)), "auto") == qkvo
    phi = _meta(Phi3Config(**small))  # Phi-4-mini-instruct is model_type "phi3"
    assert check_lora_targets(phi, "auto") == ["qkv_proj", "o_proj"]
    assert check_lora_targets(phi, "all-linear") == "all-linear"
    with pytest.raises(LoraTargetError, match=r"\['q_proj'\].*qkv_proj"):
        check_lora_targets(phi, ["q_proj", "o_proj"])
    assert resolve_lora_targets("llama", "gate_proj") == ["gate_proj"]
    with pytest.raises(LoraTargetError, match="no default for model_type 'gpt2'"):
        resolve_lora_targets("gpt2", "auto")


def test_model_tiny_cli(medqaro_prepared, tmp_path):
    from typer.testing import CliRunner

    from medray.cli import app

    out = tmp_path / "tiny"
    res = CliRunner().invoke(app, ["model", "tiny", "--out", str(out), "--corpus",
                                   str(medqaro_prepared), "--vocab-size", "512"])
    assert res.exit_code == 0, res.output
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    res = CliRunner().invoke(app, ["model", "tiny", "--out", str(tmp_path / "x"), "--corpus",
                                   str(tmp_path / "missing")])
    assert res.exit_code == 2
    assert not (tmp_path / "x").exists()
