"""Multiple-choice baselines: seeded random guessing and the majority letter per kind.

The EXPECTED accuracy of random guessing is a formula (single 1/k, group 1/5, multiple
1/(2^k - 1)), reported by `medray score` as ``random_expected_accuracy``; the sampled
predictions here are one seeded draw from that guesser.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from medray.data.schema import GROUP_CODES
from medray.eval.runio import prediction_row


def _row(pid: str, prediction: str, model: str, **extra) -> dict:
    return prediction_row(pid, prediction, engine="baseline", model=model, **extra)


def _labels(options) -> list[str]:
    return [str(o["label"]) for o in options]


def majority_letters(train: pd.DataFrame) -> dict[str, str]:
    """Most frequent answer string per kind in the training split (ties: smallest)."""
    out = {}
    for kind, part in train.groupby("kind"):
        counts = Counter("".join(sorted(a)) for a in part["answer"])
        best = max(counts.values())
        out[str(kind)] = min(a for a, c in counts.items() if c == best)
    return out


def mcq_majority_predictions(examples: pd.DataFrame, train: pd.DataFrame) -> list[dict]:
    by_kind = majority_letters(train)
    overall = Counter(by_kind.values()).most_common(1)[0][0] if by_kind else "A"
    return [_row(i, by_kind.get(k, overall), "majority-letter")
            for i, k in zip(examples["id"], examples["kind"], strict=True)]


def mcq_random_predictions(examples: pd.DataFrame, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for pid, kind, opts in zip(examples["id"], examples["kind"], examples["options"],
                               strict=True):
        labels = _labels(opts)
        if kind == "group":
            pred = sorted(GROUP_CODES)[int(rng.integers(0, len(GROUP_CODES)))]
        elif kind == "multiple":
            mask = 0
            while mask == 0:  # uniform over non-empty subsets
                mask = int(rng.integers(0, 2 ** len(labels)))
            pred = "".join(lab for j, lab in enumerate(labels) if mask >> j & 1)
        else:
            pred = labels[int(rng.integers(0, len(labels)))]
        rows.append(_row(pid, pred, "random-guess", seed=seed))
    return rows
