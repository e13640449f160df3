"""The run plan: what the driver decided before any worker starts, shipped to every worker.

Built in steps by the driver (`medray.train.trainer`): `preflight` checks the run and says
which examples it uses (`Preflight`); once the epicrises are tokenised, `schedule` sizes
the optimiser schedule from exact example lengths and the driver fills in the rest
(`RunPlan`). Both are frozen: a later step makes a new value (`dataclasses.replace`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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
