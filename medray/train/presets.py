"""Ready-made configs: the tiny CPU recipe (tests, demo) built in code from configs/."""

from __future__ import annotations

import os
from pathlib import Path

from medray.train.config import TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def tiny_config(model: str | os.PathLike, data: str | os.PathLike,
                overrides: list[str] | None = None) -> TrainConfig:
    """configs/tiny-cpu.yaml with the model and data paths filled in, plus overrides."""
    return load_config(CONFIGS / "tiny-cpu.yaml", [f"model.name_or_path={model}",
                                                   f"data.path={data}", *(overrides or [])])


def run_tiny_training(model: str | os.PathLike, data: str | os.PathLike,
                      output: str | os.PathLike, overrides: list[str] | None = None) -> Path:
    """Train the tiny recipe (used by tests and the demo); returns the output dir."""
    from medray.train.trainer import run_training

    run_training(tiny_config(model, data, overrides), output)
    return Path(output)
