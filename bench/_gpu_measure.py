"""The GPU check's measurement of one model (bench/gpu_check.py): medray's LoRA setup and
training step, timed per case (padded vs packed at each context), with the loss and RoPE
checks. Used for the random-weight shapes and for the real model (bench/_gpu_real.py).
"""

from __future__ import annotations

import time
from typing import Any

from _medqaro_rows import attention_context, batches_for, medqaro_rows, scaled_rows


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


def measure_model(run: Any, name: str, model: Any, targets: list[str], contexts: list[int],
                  t_model: float) -> tuple[dict[str, Any], bool]:
    """One model's LoRA cases (loss check, then padded and packed at each context): its
    results entry and whether its checks passed. The engine is freed before returning."""
    import torch

    ok = True
    n_params = matmul_params(model)
    layers, hidden = model.config.num_hidden_layers, model.config.hidden_size
    vocab = model.config.vocab_size
    engine, engine_kind = make_engine(model, targets, run.args.lr, "bf16")
    engine.train()
    entry: dict[str, Any] = {"matmul_params": n_params, "engine": engine_kind,
                             "lora_targets": targets, "rope_inv_freq_float32":
                             rope_float32(engine), "cases": []}
    ok &= entry["rope_inv_freq_float32"]
    print(f"\n## {name}: {n_params / 1e6:,.1f}M matmul params, {engine_kind}, "
          f"LoRA r=8 on {targets}, setup {time.perf_counter() - t_model:.0f}s, "
          f"RoPE inv_freq float32: {entry['rope_inv_freq_float32']}", flush=True)
    # Dry run: one MedQARo-shaped sample, scaled down to each tiny context.
    base_rows = medqaro_rows(512, 65536, vocab, seed=1) if run.dry else []
    first = contexts[0]
    rows0 = scaled_rows(base_rows, first / 2048, first) if run.dry else medqaro_rows(
        64, first, vocab, seed=1)
    check = batches_for(rows0, "pack", max(1, run.per_batch // first), first, 0, 1)[0]
    set_checkpointing(engine, first >= run.ckpt_from)
    entry["loss_check"] = loss_check(engine, check, run.device, run.args.loss_steps)
    ok &= entry["loss_check"]["decreased"]
    print(f"loss check ({run.args.loss_steps} steps on one packed batch at {first}): "
          + " ".join(f"{x:.3f}" for x in entry["loss_check"]["losses"])
          + (" -> decreases" if entry["loss_check"]["decreased"] else " -> DID NOT DECREASE"),
          flush=True)
    print("| context | ckpt | batching | rows | useful tok/s | useful % | MFU | peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for context in contexts:
        ckpt = context >= run.ckpt_from
        set_checkpointing(engine, ckpt)
        rows = (scaled_rows(base_rows, context / 2048, context) if run.dry
                else medqaro_rows(256, context, vocab, seed=2))
        n_rows = max(1, run.per_batch // context)
        for mode in ("pad", "pack"):
            case = {"context": context, "checkpointing": ckpt,
                    "batching": "padded" if mode == "pad" else "packed",
                    "rows_per_batch": n_rows}
            if time.perf_counter() - run.t_start > run.args.budget_s:
                case["skipped"] = "time budget"
                entry["cases"].append(case)
                print(f"| {context} | {ckpt} | {case['batching']} | {n_rows} | "
                      "skipped (time budget) | | | |", flush=True)
                continue
            need = run.args.warmup + run.args.steps
            batches = batches_for(rows, mode, n_rows, context, 0, need)
            if len(batches) < need:
                raise RuntimeError(f"{len(batches)} micro-batches at {context}, {need} needed")
            try:
                case.update(run_case(engine, batches, run.device, Clock(run.device),
                                     run.args.warmup, run.peak_flops, n_params, layers,
                                     hidden))
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
    del engine
    return entry, bool(ok)
