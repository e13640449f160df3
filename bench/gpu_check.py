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

    python bench/gpu_check.py                  # one GPU, < 8 minutes
    python bench/gpu_check.py --dry-run        # tiny shapes on CPU (gloo); in the test suite
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when run through runpy

from _medqaro_rows import (  # noqa: E402
    attention_context,
    batches_for,
    medqaro_rows,
    scaled_rows,
)

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


def matmul_params(model: Any) -> int:
    """Parameters that take part in matmuls: all but the input embedding (a lookup);
    a tied lm_head shares the embedding's weight but multiplies with it."""
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    return total if model.config.tie_word_embeddings else total - emb


def make_engine(model: Any, targets: list[str], lr: float, dtype_name: str) -> tuple[Any, str]:
    """medray's LoRA config + parameter cast + DeepSpeed config, as the workers build them."""
    import torch
    from peft import get_peft_model

    from medray.train.config import TrainConfig, deepspeed_config, peft_lora_config
    from medray.train.device import cast_parameters, skip_shm_comm_build
    from medray.train.step import TorchEngine

    cfg = TrainConfig.model_validate({
        "model": {"name_or_path": "random-init", "dtype": dtype_name},
        "data": {"path": "none"},
        "lora": {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": targets},
        "optim": {"lr": lr, "grad_accum": 1, "micro_batch_size": 1, "warmup_steps": 0},
        "deepspeed": {"stage": 2},
    })
    peft_model = get_peft_model(model, peft_lora_config(cfg, targets))
    cast_parameters(peft_model, getattr(torch, {"bf16": "bfloat16", "fp32": "float32"}[
        dtype_name]))
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr)
    try:
        import deepspeed
    except ImportError as exc:  # still measures medray's step, without ZeRO
        return TorchEngine(peft_model, optimizer, grad_clip=1.0), f"torch ({exc})"
    skip_shm_comm_build()
    engine, *_ = deepspeed.initialize(model=peft_model, optimizer=optimizer,
                                      config=deepspeed_config(cfg, 1))
    return engine, f"deepspeed {deepspeed.__version__} ZeRO-2"


def set_checkpointing(engine: Any, on: bool) -> None:
    base = engine.module.get_base_model()
    if on:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        base.gradient_checkpointing_disable()


class Clock:
    def __init__(self, device: Any) -> None:
        self.device = device

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def reset_peak(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_gib(self) -> float | None:
        import torch

        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**30
        return None


def run_case(engine: Any, batches: list[dict], device: Any, clock: Clock, warmup: int,
             peak_flops: float | None, n_params: int, layers: int, hidden: int) -> dict:
    import torch

    from medray.train.device import synced
    from medray.train.step import train_step

    clock.reset_peak()
    stream = synced(batches, device)  # one all-reduce per batch over the NCCL group
    for _ in range(warmup):
        train_step(engine, next(stream), device)
    clock.sync()
    t0 = time.perf_counter()
    tokens = 0
    losses = []
    timed = batches[warmup:]
    for batch in stream:
        res = train_step(engine, batch, device)
        tokens += res.tokens
        losses.append(res.loss)
    clock.sync()
    seconds = time.perf_counter() - t0
    slots = sum(int(b["input_ids"].numel()) for b in timed)
    tok_s = tokens / seconds
    s = attention_context(timed)
    flops_per_token = 6 * n_params + 6 * layers * hidden * s
    return {
        "useful_tokens_per_s": tok_s,
        "useful_fraction": tokens / max(slots, 1),
        "mfu": tok_s * flops_per_token / peak_flops if peak_flops else None,
        "peak_mem_gib": clock.peak_gib(),
        "steps": len(timed), "seconds": seconds,
        "loss": float(torch.stack(losses).float().mean()) if losses else None,
    }


def loss_check(engine: Any, batch: dict, device: Any, steps: int) -> dict:
    from medray.train.step import train_step

    losses = [float(train_step(engine, batch, device).loss) for _ in range(steps)]
    return {"losses": losses, "decreased": losses[-1] < losses[0] * 0.99}


def rope_float32(engine: Any) -> bool:
    import torch

    from medray.train.device import float_buffers

    buffers = {n: d for n, d in float_buffers(engine.module).items() if "inv_freq" in n}
    return bool(buffers) and set(buffers.values()) == {torch.float32}


def write_gpu_results(results: dict[str, Any], argv: list[str]) -> None:
    """docs/results/gpu_check.json (bench/_results.py), rendered by bench/render_results.py."""
    from _results import write_results

    hw, checks = results["header"]["hardware"], "ok" if results["ok"] else "FAILED"
    rows = [[name, c["context"], c["checkpointing"], c["batching"],
             c.get("error") or c.get("skipped") or c["useful_tokens_per_s"], c.get("mfu"),
             c.get("peak_mem_gib")]
            for name, entry in results["models"].items() for c in entry["cases"]]
    write_results("gpu_check", {
        "headline": f"medray's training step ran on one {hw} at the papers' model shapes "
                    f"(loss and RoPE checks {checks})",
        "tables": [{"title": f"bf16, LoRA r=8, one-process NCCL group, {hw}", "rows": rows,
                    "columns": ["model", "context", "checkpointing", "batching",
                                "useful tok/s", "MFU", "peak GiB"]}],
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
    for name in args.models.split(","):
        t_model = time.perf_counter()
        model, spec = build_model(name, dry, device, torch.bfloat16)
        n_params = matmul_params(model)
        layers, hidden = model.config.num_hidden_layers, model.config.hidden_size
        vocab = model.config.vocab_size
        engine, engine_kind = make_engine(model, spec["targets"], args.lr, "bf16")
        engine.train()
        entry: dict[str, Any] = {"matmul_params": n_params, "engine": engine_kind,
                                 "lora_targets": spec["targets"], "rope_inv_freq_float32":
                                 rope_float32(engine), "cases": []}
        ok &= entry["rope_inv_freq_float32"]
        print(f"\n## {name}: {n_params / 1e6:,.1f}M matmul params, {engine_kind}, "
              f"LoRA r=8 on {spec['targets']}, setup {time.perf_counter() - t_model:.0f}s, "
              f"RoPE inv_freq float32: {entry['rope_inv_freq_float32']}", flush=True)
        # Dry run: one MedQARo-shaped sample, scaled down to each tiny context.
        base_rows = medqaro_rows(512, 65536, vocab, seed=1) if dry else []
        first = contexts[0]
        rows0 = scaled_rows(base_rows, first / 2048, first) if dry else medqaro_rows(
            64, first, vocab, seed=1)
        check = batches_for(rows0, "pack", max(1, per_batch // first), first, 0, 1)[0]
        set_checkpointing(engine, first >= ckpt_from)
        entry["loss_check"] = loss_check(engine, check, device, args.loss_steps)
        ok &= entry["loss_check"]["decreased"]
        print(f"loss check ({args.loss_steps} steps on one packed batch at {first}): "
              + " ".join(f"{x:.3f}" for x in entry["loss_check"]["losses"])
              + (" -> decreases" if entry["loss_check"]["decreased"] else " -> DID NOT DECREASE"),
              flush=True)
        print("| context | ckpt | batching | rows | useful tok/s | useful % | MFU | peak GiB |")
        print("|---|---|---|---|---|---|---|---|")
        for context in contexts:
            ckpt = context >= ckpt_from
            set_checkpointing(engine, ckpt)
            rows = (scaled_rows(base_rows, context / 2048, context) if dry
                    else medqaro_rows(256, context, vocab, seed=2))
            n_rows = max(1, per_batch // context)
            for mode in ("pad", "pack"):
                case = {"context": context, "checkpointing": ckpt,
                        "batching": "padded" if mode == "pad" else "packed",
                        "rows_per_batch": n_rows}
                if time.perf_counter() - t_start > args.budget_s:
                    case["skipped"] = "time budget"
                    entry["cases"].append(case)
                    print(f"| {context} | {ckpt} | {case['batching']} | {n_rows} | "
                          "skipped (time budget) | | | |", flush=True)
                    continue
                need = args.warmup + args.steps
                batches = batches_for(rows, mode, n_rows, context, 0, need)
                if len(batches) < need:
                    raise RuntimeError(f"{len(batches)} micro-batches at {context}, {need} needed")
                try:
                    case.update(run_case(engine, batches, device, Clock(device), args.warmup,
                                         peak_flops, n_params, layers, hidden))
                except torch.cuda.OutOfMemoryError:
                    engine.optimizer.zero_grad(set_to_none=True)
                    torch.cuda.empty_cache()
                    case["error"] = "out of memory"
                entry["cases"].append(case)
                if "error" in case:
                    print(f"| {context} | {ckpt} | {case['batching']} | {n_rows} | OOM | | | |",
                          flush=True)
                    continue
                mfu = f"{case['mfu']:.1%}" if case["mfu"] is not None else "n/a"
                mem = f"{case['peak_mem_gib']:.1f}" if case["peak_mem_gib"] else "n/a"
                print(f"| {context} | {ckpt} | {case['batching']} | {n_rows} | "
                      f"{case['useful_tokens_per_s']:,.0f} | {case['useful_fraction']:.0%} | "
                      f"{mfu} | {mem} |", flush=True)
        for context in contexts:
            pair = {c["batching"]: c for c in entry["cases"]
                    if c["context"] == context and "useful_tokens_per_s" in c}
            if len(pair) == 2:
                ratio = pair["packed"]["useful_tokens_per_s"] / pair["padded"][
                    "useful_tokens_per_s"]
                print(f"packed / padded useful tok/s at {context}: {ratio:.2f}x")
        results["models"][name] = entry
        del engine, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    results["total_s"] = time.perf_counter() - t_start
    results["ok"] = bool(ok)
    print(f"\ntotal {results['total_s']:.0f}s; checks (loss decreases, RoPE float32): "
          f"{'ok' if ok else 'FAILED'}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if not dry:  # a dry run checks the code path; its numbers are not a measurement
        write_gpu_results(results, argv if argv is not None else sys.argv[1:])
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
