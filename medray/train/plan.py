"""The run plan: what the driver decided before any worker starts, shipped to every worker.

Built in steps by the driver (`medray.train.trainer`): `preflight` checks the run and says
which examples it uses (`Preflight`); once the epicrises are tokenised, `schedule` sizes
the optimiser schedule from exact example lengths and the driver fills in the rest
(`RunPlan`). Both are frozen: a later step makes a new value (`dataclasses.replace`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from medray.train.config import TrainConfig


@dataclass(frozen=True)
class Preflight:
    """What the checks before any worker found out about a run."""

    lora_targets: str | list[str]
    n_train: int
    n_val: int
    train_ids: list[str] | None  # a fixed subset (data.max_train_examples), else None
    val_ids: list[str] | None
    val_gen_ids: list[str]  # the validation items answered greedily each epoch
    # Per training example: its context room (PromptSpec.context_room) and epicrisis id
    # (the schedule is sized from them once the epicrises are tokenised).
    train_rooms: list[int] = field(repr=False)
    train_context_ids: list[str] = field(repr=False)
    kind: str = "generative"  # or "mcq": multiple-choice items, no epicrises
    # multiple choice: each training example's exact length (prompt + key + EOS)
    train_lengths: list[int] = field(default_factory=list, repr=False)


@dataclass(frozen=True)
class RunPlan:
    """What every worker needs besides the config."""

    lora_targets: str | list[str]
    n_train: int
    n_val: int
    train_ids: list[str] | None
    val_ids: list[str] | None
    steps_per_epoch_estimate: int
    total_steps: int
    cache_dir: str | None = None
    tensorboard_dir: str | None = None
    progress_board: str | None = None  # the driver's progress board actor, if it draws one
    tracked: bool = False  # rank 0 posts its scalars to the board for MLflow / W&B
    kind: str = "generative"  # or "mcq"
    # The fixed validation subset: {"id", "answer", "prompt_ids"} (the served prompt);
    # multiple choice: {"id", "mcq", "prompt_ids", "max_new_tokens"} (medray.train.mcq).
    val_generate: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        """The plan as recorded in metrics.json (no example ids or prompts)."""
        skip = {"val_generate", "train_ids", "val_ids", "progress_board"}
        return {k: v for k, v in asdict(self).items() if k not in skip}


def schedule(cfg: TrainConfig, checked: Preflight, contexts: dict) -> RunPlan:
    """The plan with optimiser steps per epoch and in total, from exact example lengths."""
    n_ctx = cfg.prompt.context_tokens
    lengths = list(checked.train_lengths)
    for room, cid in zip(checked.train_rooms, checked.train_context_ids, strict=True):
        fixed, n = n_ctx - room, len(contexts[cid])  # prompt without context + answer room
        if cfg.prompt.strategy == "chunks":  # one example per chunk of the context room
            step = max(room, 1)
            lengths += [min(n_ctx, fixed + min(step, n - s)) for s in range(0, max(n, 1), step)]
        else:
            lengths.append(min(n_ctx, fixed + n))
    world, mb = cfg.scaling.num_workers, cfg.optim.micro_batch_size
    if cfg.data.batching == "pack":
        micro = math.ceil(sum(lengths) / world / n_ctx / mb)
    elif cfg.data.batching == "prefix":
        micro = math.ceil(_prefix_rows(cfg, checked, contexts) / world / mb)
    else:
        micro = math.ceil((len(lengths) // world) / mb)
    per_epoch = max(1, micro // cfg.optim.grad_accum)
    total = per_epoch * cfg.optim.epochs
    return RunPlan(
        lora_targets=checked.lora_targets, n_train=checked.n_train, n_val=checked.n_val,
        train_ids=checked.train_ids, val_ids=checked.val_ids,
        steps_per_epoch_estimate=per_epoch,
        total_steps=min(total, cfg.optim.max_steps) if cfg.optim.max_steps else total,
        kind=checked.kind,
    )


def _prefix_rows(cfg: TrainConfig, checked: Preflight, contexts: dict) -> int:
    """Rows "prefix" batching makes of an epoch (an estimate): each window of examples
    holds an epicrisis once per row, with its questions' tails (prompt without the
    epicrisis, answer room) beside it, up to data.prefix_tokens a row."""
    n_ctx = cfg.prompt.context_tokens
    budget = cfg.data.prefix_tokens or 4 * n_ctx
    window = cfg.optim.micro_batch_size * cfg.data.group_window
    ids = list(zip(checked.train_context_ids, checked.train_rooms, strict=True))
    if not ids:  # multiple choice: no epicrisis to share, a row per example at most
        return checked.n_train
    rows = 0
    for start in range(0, len(ids), window):
        per_context: dict[str, list[int]] = {}
        for cid, room in ids[start:start + window]:
            per_context.setdefault(cid, []).append(room)
        for cid, rooms in per_context.items():
            prefix = min(len(contexts[cid]), max(rooms))
            tails = [n_ctx - room for room in rooms]
            per_row = max(1, (budget - prefix) // max(1, max(tails)))
            rows += math.ceil(len(rooms) / per_row)
    return rows
