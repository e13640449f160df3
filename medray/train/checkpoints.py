"""Checkpoints (PEFT adapter + DeepSpeed state + loop state) and adapter export / merge.

Layout of one reported checkpoint directory (all workers' files merged by Ray Train):
    adapter/            PEFT adapter (adapter_config.json + adapter_model.safetensors)
                        + prompt.json (the PromptSpec it is trained with)
    ds/                 DeepSpeed engine state: trainable weights (frozen base excluded),
                        ZeRO optimiser shards (one per rank), scheduler
    state.json          epoch, micro-batch in epoch, per-epoch history, best metric
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from medray.io import atomic_directory
from medray.prompts.spec import PromptSpec, load_prompt_spec, write_prompt_spec

STATE = "state.json"
ADAPTER = "adapter"


def load_state(ckpt_dir: str | os.PathLike) -> dict:
    return json.loads((Path(ckpt_dir) / STATE).read_text())


def _score(metrics: dict, metric: str, mode: str) -> float:
    """Mid-epoch checkpoints (for resuming) get the worst score: never exported as best.

    Ray Train always keeps the latest checkpoint, whatever its score.
    """
    if metric in metrics:
        return float(metrics[metric])
    return 1e30 if mode == "min" else -1e30


def save_checkpoint(engine: Any, model: Any, tokenizer: Any, state: dict, cfg: Any,
                    metrics: dict, rank: int, world: int, writer: Any = None) -> None:
    """Every rank writes its shard into a local temp dir and reports it; Ray merges them."""
    import deepspeed
    import ray.train
    from ray.train import Checkpoint

    tmp = Path(tempfile.mkdtemp(prefix=f"medray-ckpt-r{rank}-"))
    try:
        engine.save_checkpoint(str(tmp), tag="ds", exclude_frozen_parameters=True)
        trainable = [p for p in model.parameters() if p.requires_grad]
        # ZeRO-3 partitions parameters: gather the (small) LoRA weights before saving.
        with deepspeed.zero.GatheredParameters(trainable, enabled=cfg.deepspeed.stage == 3):
            if rank == 0:
                model.save_pretrained(str(tmp / ADAPTER))
                write_prompt_spec(tmp / ADAPTER, cfg.prompt)
        if rank == 0:
            (tmp / STATE).write_text(json.dumps(state, indent=2))
            if writer is not None and getattr(writer, "medray_fallback", False):
                # TensorBoard files could not go to the output dir: ship them along.
                shutil.copytree(writer.log_dir, tmp / "tensorboard", dirs_exist_ok=True)
        report = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        report[cfg.checkpoint.metric] = _score(metrics, cfg.checkpoint.metric,
                                               cfg.checkpoint.mode)
        report["epoch"] = metrics.get("epoch", state.get("epoch", 0))
        report["step"] = engine.global_steps
        ray.train.report(report, checkpoint=Checkpoint.from_directory(str(tmp)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export_adapter(ckpt_dir: str | os.PathLike, out_dir: str | os.PathLike,
                   force: bool = False, prompt: PromptSpec | None = None) -> Path:
    """Copy a checkpoint's PEFT adapter to out_dir (loadable by PeftModel and vLLM LoRA),
    with its prompt.json (`prompt` when given, else the checkpoint's own)."""
    src = Path(ckpt_dir) / ADAPTER
    if not (src / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{ckpt_dir} holds no PEFT adapter ({ADAPTER}/adapter_config.json)")
    with atomic_directory(out_dir, inputs=[ckpt_dir], force=force, command="export") as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        if prompt is not None:
            write_prompt_spec(tmp, prompt)
    return Path(out_dir)


def merge_adapter(base: str, adapter_dir: str | os.PathLike, out_dir: str | os.PathLike,
                  dtype: str = "fp32", force: bool = False) -> Path:
    """Merge LoRA weights into the base model and save a plain transformers model."""
    from peft import PeftModel

    from medray.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(base, dtype)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    out = Path(out_dir)
    inputs = [adapter_dir, *([base] if Path(base).exists() else [])]
    with atomic_directory(out, inputs=inputs, force=force, command="export --merge") as tmp:
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        spec = load_prompt_spec(adapter_dir)
        if spec is not None:  # the merged model is prompted as its adapter was trained
            write_prompt_spec(tmp, spec)
    return out


def base_model_of(adapter_dir: str | os.PathLike) -> str:
    cfg = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    return cfg["base_model_name_or_path"]
