"""`train_loop_per_worker`: PEFT LoRA + DeepSpeed ZeRO inside a Ray Train worker.

Runs identically on CPU workers (gloo) and GPU workers (nccl). Heavy imports (torch,
deepspeed, peft) happen inside the function, never at module import.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medray.train.checkpoints import load_state, save_checkpoint
from medray.train.collate import STEP_SCALARS, micro_batches
from medray.train.config import TrainConfig, deepspeed_config, peft_lora_config
from medray.train.device import (
    all_reduce,
    cast_parameters,
    skip_shm_comm_build,
    synced,
    worker_device,
)
from medray.train.plan import RunPlan
from medray.train.progress import RelayedWriter, rank_zero_bar
from medray.train.step import eval_loss, train_step


def _epoch_batches(shard: Any, cfg: TrainConfig, pad_id: int, epoch: int) -> Any:
    from medray.train.data import iter_rows_from_batches

    d = cfg.data
    window = cfg.optim.micro_batch_size * (1 if d.batching == "pad" else d.group_window)
    # prefix: a patient's questions must arrive together to share their epicrisis; the
    # rows built from them are shuffled within the window instead
    shuffle = 0 if d.batching == "prefix" else d.shuffle_buffer
    batches = shard.iter_batches(
        batch_size=window, batch_format="numpy",
        local_shuffle_buffer_size=shuffle or None,
        local_shuffle_seed=cfg.optim.seed + epoch if shuffle else None,
    )
    max_len = cfg.prompt.context_tokens
    if d.batching == "prefix":
        max_len = d.prefix_tokens or 4 * max_len
    return micro_batches(iter_rows_from_batches(batches), batch_size=cfg.optim.micro_batch_size,
                         pad_id=pad_id, mode=d.batching, max_len=max_len,
                         window=d.group_window, seed=cfg.optim.seed + epoch)


def _log(rank: int, msg: str) -> None:
    if rank == 0:  # timings and aggregate numbers only: never clinical text
        print(f"[medray.train] {msg}", flush=True)


def _tensorboard(path: str | None, rank: int) -> Any:
    if rank != 0 or not path:
        return None
    from torch.utils.tensorboard import SummaryWriter

    fallback = False
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError:  # output dir not on this node: keep the files beside the worker
        import tempfile

        path, fallback = tempfile.mkdtemp(prefix="medray-tb-"), True
    writer = SummaryWriter(log_dir=path)
    writer.medray_fallback = fallback  # checkpoints then carry the event files
    return writer


def evaluate(engine: Any, cfg: TrainConfig, pad_id: int, plan: RunPlan, tokenizer: Any,
             rank: int, world: int, device: Any) -> dict[str, float]:
    """Validation loss (token-weighted, all workers) + greedy F1/EM on the fixed subset."""
    import ray.train
    import torch
    import torch.distributed as dist

    from medray.engines.hf import HFEngine
    from medray.eval.metrics.generative import em_medqaro, f1_medqaro

    engine.eval()
    loss_sum = n_tok = 0.0
    with torch.no_grad():
        shard = ray.train.get_dataset_shard("val")
        # prefix rows give each example the loss it has alone, at a fraction of the cost
        prefix = cfg.data.batching == "prefix"
        batches = micro_batches(_rows(shard), batch_size=cfg.optim.micro_batch_size,
                                pad_id=pad_id, mode="prefix" if prefix else "pad",
                                max_len=cfg.data.prefix_tokens or 4 * cfg.prompt.context_tokens,
                                window=cfg.data.group_window)
        for batch in synced(batches, device):
            summed, n = eval_loss(engine, batch, device)
            loss_sum += float(summed)
            n_tok += float(n)
    loss_sum, n_tok = all_reduce([loss_sum, n_tok], device)
    metrics = {"val_loss": loss_sum / max(n_tok, 1.0), "val_tokens": n_tok}

    items = plan.val_generate
    if items:
        per = math.ceil(len(items) / world)
        mine = items[rank * per:(rank + 1) * per]
        # Equal call counts on all ranks (ZeRO-3 gathers weights inside every forward).
        padded = mine + [items[0]] * (per - len(mine))
        hf = HFEngine(engine.module, tokenizer=tokenizer, batch_size=8,
                      synced_gpus=cfg.deepspeed.stage == 3 and world > 1)
        multiple_choice = plan.kind == "mcq"
        budget = (max(it["max_new_tokens"] for it in items) if multiple_choice
                  else cfg.prompt.max_new_tokens)
        gens = hf.generate_ids([it["prompt_ids"] for it in padded], max_new_tokens=budget)
        local = [(it["mcq"] if multiple_choice else it["answer"], g.text)
                 for it, g in zip(mine, gens, strict=False)]
        gathered: list[Any] = [None] * world
        if dist.is_initialized():
            dist.all_gather_object(gathered, local)
        else:
            gathered = [local]
        pairs = [p for part in gathered for p in part]
        if multiple_choice:
            from medray.train.mcq import accuracy

            metrics.update(accuracy(pairs))
        else:
            metrics["val_f1"] = sum(f1_medqaro(p, r) for r, p in pairs) / len(pairs)
            metrics["val_em"] = sum(em_medqaro(p, r) for r, p in pairs) / len(pairs)
        metrics["val_generated"] = len(pairs)
    engine.train()
    return metrics


def _rows(shard: Any) -> Any:
    from medray.train.data import iter_rows_from_batches

    return iter_rows_from_batches(shard.iter_batches(batch_size=32, batch_format="numpy"))


def _maybe_kill(cfg: TrainConfig, rank: int, step: int) -> None:
    """Test hook: die hard, once, to exercise FailureConfig + checkpoint resume."""
    f = cfg.fault
    if f.kill_rank is None or f.kill_rank != rank or f.kill_at_step != step or not f.kill_marker:
        return
    marker = Path(f.kill_marker)
    if marker.exists():
        return
    # Die once the controller has recorded the checkpoint just reported (it polls workers
    # every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, default 2 s): the test then knows exactly
    # which checkpoint the replacement workers must resume from.
    time.sleep(2 * float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2")) + 1)
    marker.write_text(json.dumps({"rank": rank, "step": step, "time": time.time()}))
    os._exit(1)


def build_engine(cfg: TrainConfig, plan: RunPlan, world: int, device: Any) -> tuple[Any, ...]:
    """Model on `device` (LoRA, parameters in the training dtype) inside a DeepSpeed engine.

    Returns (engine, peft model, tokenizer, scheduler).
    """
    import deepspeed
    import torch
    from peft import get_peft_model
    from transformers import get_scheduler

    from medray.models import check_lora_targets, load_model_and_tokenizer

    # ZeRO-3 with offloaded parameters partitions them from host memory.
    load_on = "cpu" if cfg.deepspeed.offload_params else device
    model, tokenizer = load_model_and_tokenizer(
        cfg.model.name_or_path, cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code,
        device=load_on, cache_dir=plan.cache_dir or cfg.model.cache_dir,
        attn_implementation=cfg.model.attn_implementation)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    targets = check_lora_targets(model, cfg.lora.target_modules)
    model = get_peft_model(model, peft_lora_config(cfg, targets))
    if cfg.model.dtype != "fp32":  # trainable LoRA weights in the training precision
        cast_parameters(model, getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[
            cfg.model.dtype]))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.optim.lr, betas=cfg.optim.betas,
                                  weight_decay=cfg.optim.weight_decay)
    total_steps = plan.total_steps
    scheduler = get_scheduler(cfg.optim.scheduler if cfg.optim.scheduler != "constant"
                              else "constant_with_warmup", optimizer,
                              num_warmup_steps=min(cfg.optim.warmup_steps, total_steps),
                              num_training_steps=total_steps)
    skip_shm_comm_build()
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           lr_scheduler=scheduler,
                                           config=deepspeed_config(cfg, world))
    return engine, model, tokenizer, scheduler


@dataclass
class WorkerRun:
    """One worker's training run: the engine and everything the epochs share."""

    cfg: TrainConfig
    plan: RunPlan
    rank: int
    world: int
    device: Any
    engine: Any
    model: Any
    tokenizer: Any
    scheduler: Any
    state: dict
    writer: Any
    bar: Any
    resumed: bool

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    def evaluate(self) -> dict[str, float]:
        return evaluate(self.engine, self.cfg, self.pad_id, self.plan, self.tokenizer,
                        self.rank, self.world, self.device)

    def checkpoint(self, record: dict) -> None:
        self.state["checkpoint_record"] = record  # what `medray train` reports as exported
        save_checkpoint(self.engine, self.model, self.tokenizer, self.state, self.cfg, record,
                        self.rank, self.world, self.writer)


def worker_nodes(world: int) -> list[dict[str, str]]:
    """Where every rank of this (re)start runs, gathered over the process group."""
    import ray
    import torch.distributed as dist

    mine = {"node_ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id()}
    if world == 1 or not dist.is_initialized():
        return [mine]
    every: list[Any] = [None] * world
    dist.all_gather_object(every, mine)
    return every


def setup_worker(config: dict) -> WorkerRun:
    """Seed, threads, model + LoRA + DeepSpeed engine; resume from Ray Train's checkpoint."""
    import ray.train
    import torch

    t_start = time.perf_counter()
    cfg = TrainConfig.model_validate(config["cfg"])
    plan: RunPlan = config["plan"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = worker_device()
    torch.manual_seed(cfg.optim.seed)
    if not cfg.scaling.use_gpu:
        torch.set_num_threads(max(1, int(cfg.scaling.cpus_per_worker)))

    engine, model, tokenizer, scheduler = build_engine(cfg, plan, world, device)
    state = {"epoch": 0, "micro_in_epoch": 0, "history": [], "best": None, "resumed_from": None}
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            engine.load_checkpoint(d, tag="ds", load_module_strict=False)
            state = load_state(d)
        state["resumed_from"] = engine.global_steps
    state.setdefault("workers", []).append(worker_nodes(world))
    writer = _tensorboard(plan.tensorboard_dir, rank)
    if writer and plan.tracked and plan.progress_board:  # the driver logs them (tracking)
        writer = RelayedWriter(writer, plan.progress_board)
    bar = rank_zero_bar(plan.total_steps, engine.global_steps, rank, plan.progress_board)
    _log(rank, f"worker ready on {device}: {time.perf_counter() - t_start:.1f}s "
               "(model, LoRA, DeepSpeed)")
    return WorkerRun(cfg, plan, rank, world, device, engine, model, tokenizer, scheduler,
                     state, writer, bar, resumed=checkpoint is not None)


def initial_evaluation(run: WorkerRun) -> None:
    """Validation before the first step (a fresh run only): the untrained baseline."""
    t_eval = time.perf_counter()
    initial = run.evaluate()
    _log(run.rank, f"initial validation {time.perf_counter() - t_eval:.1f}s: "
                   f"val_loss {initial['val_loss']:.4f}")
    run.state["initial"] = initial
    if run.writer:
        run.writer.add_scalar("val/loss", initial["val_loss"], 0)


def train_epoch(run: WorkerRun) -> tuple[float, float, float, float]:
    """One pass over this worker's shard (from where a resumed epoch stopped), with
    mid-epoch checkpoints. Returns (loss sum, micro-batches, tokens, seconds) of all ranks."""
    import ray.train

    cfg, engine, state, epoch = run.cfg, run.engine, run.state, run.state["epoch"]
    total_steps = run.plan.total_steps
    shard = ray.train.get_dataset_shard("train")
    loss_sum = n_micro = tokens = 0.0
    t0 = time.perf_counter()
    skip = state["micro_in_epoch"]  # resuming mid-epoch: skip consumed micro-batches
    batches = synced(_epoch_batches(shard, cfg, run.pad_id, epoch), run.device)
    counts: dict[str, int] = {}
    for i, batch in enumerate(batches):
        if i < skip:
            continue
        res = train_step(engine, batch, run.device)
        loss = float(res.loss)
        loss_sum, n_micro, tokens = loss_sum + loss, n_micro + 1, tokens + res.tokens
        counts = {n: counts.get(n, 0) + batch[k] for k, n in STEP_SCALARS.items()}
        state["micro_in_epoch"] = i + 1
        if not res.boundary:
            continue
        step = engine.global_steps
        lr = run.scheduler.get_last_lr()[0]
        run.bar.update(1)
        tok_s = tokens * run.world / (time.perf_counter() - t0)
        run.bar.set_description(f"epoch {epoch + 1} loss {loss:.3f} lr {lr:.2e} "
                                f"tok/s {tok_s:.0f}")
        if run.writer:  # and what the step trained (rank 0's micro-batches)
            for name, value in {"train/loss": loss, "train/lr": lr, **counts}.items():
                run.writer.add_scalar(name, value, step)
        counts = {}
        _maybe_kill(cfg, run.rank, step)
        every, every_eval = cfg.checkpoint.every_steps, cfg.optim.eval_every_steps
        if every_eval and step % every_eval == 0 and step < total_steps:
            # every rank evaluates at the same step (the metrics are all-reduced)
            record = {"step": step, "epoch": epoch, "train_loss": loss, **run.evaluate()}
            state.setdefault("evaluations", []).append(record)
            _log(run.rank, _summary(record))
            _to_tensorboard(run, record, step)
            run.checkpoint(record)
        elif every and step % every == 0 and step < total_steps:
            run.checkpoint({"step": step, "epoch": epoch, "train_loss": loss})
        if step >= total_steps:
            break
    elapsed = time.perf_counter() - t0
    loss_sum, n_micro, tokens = all_reduce([loss_sum, n_micro, tokens], run.device)
    return loss_sum, n_micro, tokens, elapsed


def end_epoch(run: WorkerRun, loss_sum: float, n_micro: float, tokens: float,
              elapsed: float) -> None:
    """Validate, record the epoch, log it and checkpoint (the exportable checkpoints)."""
    epoch, engine = run.state["epoch"], run.engine
    t_eval = time.perf_counter()
    val = run.evaluate()
    _log(run.rank, f"epoch {epoch + 1}: train {elapsed:.1f}s, validation "
                   f"{time.perf_counter() - t_eval:.1f}s, {_summary(val)}")
    record = {"epoch": epoch + 1, "step": engine.global_steps,
              "train_loss": loss_sum / max(n_micro, 1.0),
              "tokens_per_s": tokens / max(elapsed, 1e-9), "train_tokens": tokens,
              "seconds": elapsed, **val}
    run.state["history"].append(record)
    run.state["epoch"], run.state["micro_in_epoch"] = epoch + 1, 0
    _to_tensorboard(run, record, engine.global_steps)
    run.checkpoint(record)


def _summary(val: dict) -> str:
    if "val_accuracy" in val:
        return (f"val_loss {val['val_loss']:.4f}, val_accuracy {val['val_accuracy']:.4f} "
                f"(all-correct rule), conforming {val['val_conforming']:.2f}")
    return (f"val_loss {val['val_loss']:.4f}, val_f1 {val.get('val_f1', float('nan')):.4f} "
            "(medqaro mode)")


def _to_tensorboard(run: WorkerRun, record: dict, step: int) -> None:
    if not run.writer:
        return
    for k, v in record.items():
        if k.startswith("val_") and k not in ("val_tokens", "val_generated"):
            run.writer.add_scalar(f"val/{k[4:]}", v, step)
    if "tokens_per_s" in record:
        run.writer.add_scalar("train/tokens_per_s", record["tokens_per_s"], step)
    run.writer.flush()


def _finished(run: WorkerRun) -> bool:
    return (run.state["epoch"] >= run.cfg.optim.epochs
            or run.engine.global_steps >= run.plan.total_steps)


def report_final_again(run: WorkerRun) -> None:
    """A restart that finds the last checkpoint saved has nothing left to train, but the
    interruption may have come before that checkpoint's report reached the caller (a Tune
    trial would end on its previous epoch): report the final epoch again, with a checkpoint."""
    record = run.state["history"][-1]
    _log(run.rank, f"resumed after the last epoch ({record['epoch']}): reporting it again")
    run.checkpoint(record)


def train_loop_per_worker(config: dict) -> None:
    run = setup_worker(config)
    if not run.resumed:
        initial_evaluation(run)
    elif _finished(run) and run.state["history"]:
        report_final_again(run)
    while not _finished(run):
        end_epoch(run, *train_epoch(run))
    run.bar.close()
    if run.writer:
        run.writer.close()
