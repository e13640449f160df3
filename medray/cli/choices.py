"""Enumerated CLI values, as typer choices: a typo is a usage error (exit 2) listing them."""

from __future__ import annotations

from enum import StrEnum

from medray.data.registry import NAMES as DATASET_NAMES


class MetricMode(StrEnum):
    medqaro = "medqaro"
    robust = "robust"


class GroupMapping(StrEnum):
    off = "off"
    heuristic = "heuristic"
    first = "first"


class BaselineKind(StrEnum):
    majority = "majority"
    random_token = "random-token"
    random = "random"


class SearchAlg(StrEnum):
    grid = "grid"
    random = "random"
    optuna = "optuna"


class SweepMetric(StrEnum):
    val_f1 = "val_f1"
    val_loss = "val_loss"
    val_em = "val_em"
    val_accuracy = "val_accuracy"  # multiple choice
    val_conforming = "val_conforming"
    train_loss = "train_loss"


class OptMode(StrEnum):
    max = "max"
    min = "min"


# The benchmarks of medray.data.registry: a new DatasetSpec is a new choice.
Dataset = StrEnum("Dataset", {name: name for name in DATASET_NAMES})


class Scale(StrEnum):
    small = "small"
    paper = "paper"


class Compat(StrEnum):
    medqaro = "medqaro"


class PromptFormat(StrEnum):
    qea = "qea"
    eqa = "eqa"


class DType(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class DemoModel(StrEnum):
    tiny = "tiny"
    smollm2 = "smollm2"
