"""MedQARo-shaped training rows for the bench scripts (gpu_check, train_throughput), and
the micro-batches medray's collate makes of them.

Lengths follow the paper's statistics: epicrisis log-normal with mean 7,829 tokens, clipped
to 207..34,247; questions 7..30 tokens; answers mean 4 tokens (1..60).
"""

from __future__ import annotations

import math
import random
from typing import Any


def draw_lengths(rng: random.Random) -> tuple[int, int, int]:
    """(epicrisis, question, answer) token counts of one MedQARo-like example."""
    sigma = 0.75
    mu = math.log(7829) - sigma**2 / 2  # log-normal with the paper's mean
    epicrisis = min(max(int(rng.lognormvariate(mu, sigma)), 207), 34247)
    answer = min(max(int(rng.expovariate(1 / 4)), 1), 60)
    question = rng.randint(7, 30)
    return epicrisis, question, answer


def medqaro_rows(n: int, context: int, vocab: int, seed: int) -> list[dict]:
    """Token rows shaped like MedQARo examples trimmed to `context` (loss on answer+EOS)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        epicrisis, question, answer = draw_lengths(rng)
        answer += 1  # + EOS
        question += 8  # + the prompt's fixed words
        prompt = min(context - answer, question + epicrisis)
        ids = [rng.randrange(4, vocab) for _ in range(prompt + answer)]
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


def scaled_rows(rows: list[dict], factor: float, context: int) -> list[dict]:
    """Dry run: the same shape distribution at tiny lengths."""
    out = []
    for r in rows:
        n = max(4, min(context, int(len(r["input_ids"]) * factor)))
        answer = max(1, sum(x != -100 for x in r["labels"]))
        answer = min(answer, n - 2)
        out.append({"input_ids": r["input_ids"][:n],
                    "labels": [-100] * (n - answer) + r["input_ids"][n - answer:n]})
    return out


def attention_context(batches: list[dict]) -> float:
    """s = sum(len^2) / sum(len) over the examples of the timed batches."""
    lens = [n for b in batches for n in b["example_lengths"]]
    return sum(n * n for n in lens) / max(sum(lens), 1)


def batches_for(rows: list[dict], mode: str, rows_per_batch: int, context: int,
                pad_id: int, need: int) -> list[dict]:
    """The first `need` micro-batches of medray's collate, with their example lengths."""
    from medray.train.collate import micro_batches

    out = []
    for b in micro_batches(rows, batch_size=rows_per_batch, pad_id=pad_id, mode=mode,
                           max_len=context, window=64, seed=0):
        b["example_lengths"] = (b["attention_mask"].sum(1).tolist() if mode == "pad"
                                else _segments(b["position_ids"]))
        out.append(b)
        if len(out) == need:
            break
    return out


def _segments(pos: Any) -> list[int]:
    """Lengths of the position-id runs (each packed example restarts at 0)."""
    lengths = []
    for row in pos.tolist():
        run = 0
        for p in row:
            if p == 0 and run:
                lengths.append(run)
                run = 0
            run += 1
        lengths.append(run)
    return lengths
