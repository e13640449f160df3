"""Short causal-LM pre-training of the tiny base (medray.demo.pretrain; plain torch, ~10 s)."""

from __future__ import annotations

import json

import pytest

from medray.demo.pretrain import _windows, lm_loss, pretrain_tiny_base


def _split_texts(prepared, split: str) -> list[str]:
    from medray.data.prepared import load_prepared

    data = load_prepared(prepared)
    ids = set(data.split(split)["context_id"])
    return data.contexts[data.contexts["context_id"].isin(ids)]["text"].tolist()


def test_pretraining_lowers_lm_loss_on_unseen_patients(tiny_model, medqaro_prepared, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    train_texts = _split_texts(medqaro_prepared, "train")
    val_texts = _split_texts(medqaro_prepared, "val")  # other patients: never trained on
    out = tmp_path / "pretrained"
    stats = pretrain_tiny_base(tiny_model, train_texts, steps=40, lr=3e-3, seq_len=128,
                               batch_size=4, seed=0, out_dir=out, progress=False)

    assert stats["out_dir"] == str(out) and stats["steps"] == 40
    assert stats["held_out_loss_after"] < stats["held_out_loss_before"] - 1.0

    tok = AutoTokenizer.from_pretrained(out)
    stream: list[int] = []
    for text in val_texts:
        stream += tok(text)["input_ids"] + [tok.eos_token_id]
    windows = _windows(stream, 128)[:8]
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    tuned = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    before, after = lm_loss(base, windows), lm_loss(tuned, windows)
    # Random init sits near ln(vocab); 40 steps on train epicrises must cut that clearly.
    assert after < before - 1.0, (before, after)

    # Same architecture and tokenizer (vLLM-CPU head size kept); provenance recorded.
    assert tuned.config.to_dict()["hidden_size"] == base.config.hidden_size
    assert tuned.config.head_dim == base.config.head_dim == 64
    assert len(tok) == len(AutoTokenizer.from_pretrained(tiny_model))
    meta = json.loads((out / "medray_tiny.json").read_text())
    assert meta["pretrain"]["steps"] == 40 and meta["pretrain"]["base"] == str(tiny_model)
    # The source base is left untouched (the zero-shot random model stays available).
    assert not (tiny_model / "medray_tiny.json").read_text().count("pretrain")
    assert not list(tmp_path.glob(".pretrained.*"))  # no temp dir left behind


def test_pretrain_rejects_bad_arguments(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="steps=0"):
        pretrain_tiny_base(tiny_model, ["a b c", "d e f"], steps=0, lr=1e-3, seq_len=8,
                           batch_size=2, seed=0, out_dir=tmp_path / "x", progress=False)
    with pytest.raises(ValueError, match="at least 2 non-empty texts"):
        pretrain_tiny_base(tiny_model, ["only one"], steps=1, lr=1e-3, seq_len=8,
                           batch_size=2, seed=0, out_dir=tmp_path / "x", progress=False)
    with pytest.raises(ValueError, match="fewer than seq_len"):
        pretrain_tiny_base(tiny_model, ["a b", "c d", "e f"], steps=1, lr=1e-3, seq_len=512,
                           batch_size=2, seed=0, out_dir=tmp_path / "x", progress=False)
    assert not (tmp_path / "x").exists()
