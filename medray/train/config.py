"""Training configuration: the pydantic sections of a `medray train` YAML.

Loaded by medray.config (strict models, dotted `key=value` overrides, errors naming the
file and key). Defaults are the papers' recipe (LoRA r=8, alpha=16, dropout 0.05, lr 2e-5,
100 warm-up steps, batch 1 x accumulation 8, 3 epochs, bf16) — see docs/benchmarks.md.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, model_validator

from medray.config import ConfigError, load_yaml, validate
from medray.config import Strict as _Strict
from medray.config import apply_overrides as apply_overrides
from medray.config import format_errors as format_errors
from medray.config import parse_override as parse_override
from medray.prompts.spec import TRAIN_STRATEGIES, PromptSpec, moved_prompt_keys
from medray.tracking import TrackingConfig


class ModelConfig(_Strict):
    name_or_path: str
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    # sdpa (default); flash_attention_2 where flash-attn is installed: with
    # data.batching=pack it attends within each packed example through the restarting
    # position ids (varlen kernels), instead of sdpa's dense block-diagonal mask.
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    # Hugging Face cache the workers download into. None: OUTPUT/hf-cache beside the run
    # (on the shared storage with it); a cluster config points all runs at one cache.
    cache_dir: str | None = None


class LoraConfig(_Strict):
    r: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    # "auto": the papers' attention projections per architecture (q,k,v,o; Phi: qkv,o).
    target_modules: list[str] | Literal["auto", "all-linear"] = "auto"
    # Modules trained in full and saved with the adapter (PEFT modules_to_save), e.g.
    # ["embed_tokens"]; tied input/output embeddings stay tied (ensure_weight_tying).
    # vLLM serves only plain LoRA: serve such an adapter merged (`medray export --merge`).
    modules_to_save: list[str] = Field(default_factory=list)


class DataConfig(_Strict):
    path: str
    train_split: str = "train"
    val_split: str = "val"
    batching: Literal["pad", "group", "pack", "prefix"] = "pad"
    # group/pack: micro-batches of examples buffered to sort or pack; prefix: the same
    # count of examples searched for a shared epicrisis (set it to hold several patients)
    group_window: int = Field(16, ge=1)
    # prefix: a row holds one shared prefix and as many tails as fit in this many tokens
    # (None: 4 x prompt.context_tokens)
    prefix_tokens: int | None = Field(None, ge=2)
    max_train_examples: int | None = Field(None, ge=1)
    max_val_examples: int | None = Field(None, ge=1)
    # Fixed validation subset answered greedily each epoch and scored by F1/EM.
    val_generate_examples: int = Field(32, ge=0)
    shuffle_buffer: int = Field(256, ge=0)
    # Ray Data actor pool size, used when there is too much text to tokenise in-process
    # (medray.train.data.tokenize_contexts says when).
    tokenize_actors: int = Field(2, ge=1)


class OptimConfig(_Strict):
    lr: float = Field(2e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(100, ge=0)
    scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    micro_batch_size: int = Field(1, ge=1)
    grad_accum: int = Field(8, ge=1)
    epochs: int = Field(3, ge=1)
    max_steps: int | None = Field(None, ge=1)  # optimiser steps; caps the schedule
    # Validate (and checkpoint, scored by checkpoint.metric) every N optimiser steps too,
    # not only at epoch ends: the RoBiology recipe measures accuracy every 100 steps.
    eval_every_steps: int | None = Field(None, ge=1)
    grad_clip: float = Field(1.0, ge=0)
    seed: int = 42


class DeepSpeedConfig(_Strict):
    stage: Literal[0, 1, 2, 3] = 2
    offload_optimizer: bool = False
    offload_params: bool = False  # ZeRO-3 only

    @model_validator(mode="after")
    def _offload(self) -> DeepSpeedConfig:
        if self.offload_params and self.stage != 3:
            raise ValueError("deepspeed.offload_params needs deepspeed.stage 3")
        if self.offload_optimizer and self.stage == 0:
            raise ValueError("deepspeed.offload_optimizer needs deepspeed.stage >= 1")
        return self


class ScalingConfig(_Strict):
    num_workers: int = Field(2, ge=1)
    use_gpu: bool = False
    cpus_per_worker: float = Field(1, gt=0)
    # How Ray places the workers: PACK fills a node first (NVLink between the GPUs of one
    # node); SPREAD / STRICT_SPREAD put them on different nodes.
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"

    def local_cpus(self) -> float:
        """Logical CPUs a local Ray needs for the run: the Train workers plus room for the
        driver and Ray Data's tasks (`min_cpus` of medray.cluster.connect)."""
        return self.num_workers * self.cpus_per_worker + 2


class CheckpointConfig(_Strict):
    every_steps: int | None = Field(None, ge=1)  # optimiser steps; also at each epoch end
    # Where Ray Train keeps checkpoints: a folder every node sees (NFS) or a pyarrow
    # filesystem URI (s3://, gs://). None: OUTPUT/ray (a single node, or OUTPUT on NFS).
    storage_path: str | None = None
    num_to_keep: int = Field(2, ge=1)
    metric: str = "val_loss"
    mode: Literal["min", "max"] = "min"
    export: Literal["best", "last"] = "best"


class FaultConfig(_Strict):
    max_failures: int = Field(0, ge=-1)
    # Test hook: worker `kill_rank` calls os._exit at optimiser step `kill_at_step`, once
    # (a marker file records that it happened, so the restarted worker carries on).
    kill_rank: int | None = None
    kill_at_step: int | None = None
    kill_marker: str | None = None


class TrainConfig(_Strict):
    model: ModelConfig
    lora: LoraConfig = LoraConfig()
    data: DataConfig
    # How examples are prompted (format, budget N, answer reserve, trim|chunks): written
    # beside the adapter so serving and evaluation prompt the model the same way.
    prompt: PromptSpec = PromptSpec()
    optim: OptimConfig = OptimConfig()
    deepspeed: DeepSpeedConfig = DeepSpeedConfig()
    scaling: ScalingConfig = ScalingConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    fault: FaultConfig = FaultConfig()
    # MLflow / W&B (medray.tracking); off by default. A sweep tracks with its base config's.
    tracking: TrackingConfig = TrackingConfig()
    name: str = "medray-finetune"

    @model_validator(mode="after")
    def _trainable_prompt(self) -> TrainConfig:
        if self.prompt.strategy not in TRAIN_STRATEGIES:
            raise ValueError(f"prompt.strategy {self.prompt.strategy!r} cannot be trained; "
                             f"expected one of {TRAIN_STRATEGIES}")
        if self.data.batching == "prefix" and self.model.attn_implementation != "sdpa":
            # the shared-prefix rows carry a 4-D boolean mask: sdpa takes it as it is
            raise ValueError("data.batching 'prefix' needs model.attn_implementation 'sdpa' "
                             f"(got {self.model.attn_implementation!r})")
        return self


# ----------------------------------------------------------------------- loading


# Keys a shipped config leaves empty on purpose: they name this machine's files.
REQUIRED_PATHS = {("model", "name_or_path"): "PATH (a model folder or hub id)",
                  ("data", "path"): "DIR (a `medray data prepare` output)"}


def check_raw(raw: dict, source: str) -> None:
    """What a TrainConfig cannot say about itself: keys that moved, paths left unset."""
    moved = moved_prompt_keys(raw.get("data"), ("prompt_format", "context_tokens",
                                                "max_new_tokens", "mode"), "data.")
    if moved:
        raise ConfigError("\n".join(f"{source}: {m}" for m in moved))
    for (section, key), what in REQUIRED_PATHS.items():
        if (raw.get(section) or {}).get(key) in (None, ""):
            raise ConfigError(f"{source}: {section}.{key} is not set: pass "
                              f"{section}.{key}={what} after the command's options")


def validate_config(raw: dict, source: str = "<config>") -> TrainConfig:
    check_raw(raw, source)
    return validate(TrainConfig, raw, source)


def load_config(path: str | os.PathLike, overrides: list[str] | None = None) -> TrainConfig:
    """Read YAML, apply dotted `key=value` overrides, validate."""
    return load_yaml(TrainConfig, path, overrides, check=check_raw)


def peft_lora_config(cfg: TrainConfig, targets: str | list[str]) -> Any:
    """The PEFT LoraConfig of a run (training, the demo's recipe study)."""
    from peft import LoraConfig as PeftLoraConfig

    save = list(cfg.lora.modules_to_save)
    return PeftLoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                          target_modules=targets, task_type="CAUSAL_LM", bias="none",
                          modules_to_save=save or None, ensure_weight_tying=bool(save))


def deepspeed_config(cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    """The DeepSpeed JSON config generated from ours (the optimiser is passed separately)."""
    zero: dict[str, Any] = {"stage": cfg.deepspeed.stage}
    if cfg.deepspeed.stage >= 2:
        zero.update(overlap_comm=False, contiguous_gradients=True)
    if cfg.deepspeed.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cfg.scaling.use_gpu}
    if cfg.deepspeed.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cfg.scaling.use_gpu}
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": cfg.optim.micro_batch_size,
        "gradient_accumulation_steps": cfg.optim.grad_accum,
        "train_batch_size": cfg.optim.micro_batch_size * cfg.optim.grad_accum * world_size,
        "gradient_clipping": cfg.optim.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.model.dtype == "bf16"},
        "fp16": {"enabled": cfg.model.dtype == "fp16"},
        "steps_per_print": 10**9,  # our own progress bar reports
        "wall_clock_breakdown": False,
    }
    if cfg.deepspeed.offload_optimizer:
        # A torch optimiser on offloaded states: DeepSpeed would otherwise insist on CPUAdam.
        ds["zero_force_ds_cpu_optimizer"] = False
    return ds
