"""Batching for causal-LM training: dynamic padding, length grouping, packing.

- "pad": each micro-batch is padded to its own longest example (not to N).
- "group": like "pad", but examples are sorted by length inside a window of rows first,
  so a micro-batch holds similar lengths (less padding); micro-batch order is shuffled.
- "pack": several examples share one row of at most N tokens. Position ids restart at 0
  for each example and the attention mask is left out: transformers (>= 4.53,
  `masking_utils.find_packed_sequence_indices`) then builds a block-diagonal causal mask
  from the position-id resets, for sdpa and eager attention alike, so examples never
  attend to each other. This needs `use_cache=False` in the forward pass. With
  `model.attn_implementation: flash_attention_2` the same resets become the sequence
  boundaries of flash-attn's varlen kernel: no mask at all, memory linear in the row.

Batches are built on the host; the training step moves them to the worker's device
(medray.train.step, medray.train.device).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from medray.prompts.tokens import IGNORE_INDEX

BATCHING = ("pad", "group", "pack")

Row = dict[str, list[int]]


def pad_batch(rows: Sequence[Row], pad_id: int) -> dict[str, Any]:
    """Right-pad to the longest row; padded labels are -100, attention mask 0."""
    import torch

    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.tensor(r["input_ids"])
        labels[i, :n] = torch.tensor(r["labels"])
        mask[i, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask,
            "num_tokens": int(mask.sum())}


def pack_rows(rows: Sequence[Row], max_len: int) -> list[list[Row]]:
    """First-fit decreasing bin packing of rows into bins of at most max_len tokens."""
    bins: list[list[Row]] = []
    room: list[int] = []
    for r in sorted(rows, key=lambda r: len(r["input_ids"]), reverse=True):
        n = len(r["input_ids"])
        for b, left in enumerate(room):
            if n <= left:
                bins[b].append(r)
                room[b] -= n
                break
        else:
            bins.append([r])
            room.append(max_len - n)
    return bins


def packed_batch(bins: Sequence[Sequence[Row]], pad_id: int) -> dict[str, Any]:
    """Rows of concatenated examples with restarting position ids and no attention mask."""
    import torch

    width = max(sum(len(r["input_ids"]) for r in b) for b in bins)
    ids = torch.full((len(bins), width), pad_id, dtype=torch.long)
    labels = torch.full((len(bins), width), IGNORE_INDEX, dtype=torch.long)
    pos = torch.zeros((len(bins), width), dtype=torch.long)
    for i, b in enumerate(bins):
        at = 0
        for r in b:
            n = len(r["input_ids"])
            ids[i, at:at + n] = torch.tensor(r["input_ids"])
            labels[i, at:at + n] = torch.tensor(r["labels"])
            pos[i, at:at + n] = torch.arange(n)
            at += n
        # Trailing padding forms its own block (positions restart), so it attends only to
        # itself and carries no loss.
        pos[i, at:] = torch.arange(width - at)
    real = sum(len(r["input_ids"]) for b in bins for r in b)
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "num_tokens": real}


def micro_batches(
    rows: Iterable[Row],
    *,
    batch_size: int,
    pad_id: int,
    mode: str = "pad",
    max_len: int = 2048,
    window: int = 16,
    seed: int = 0,
) -> Iterator[dict[str, Any]]:
    """Turn a stream of rows into model-ready micro-batches (tensors)."""
    if mode not in BATCHING:
        raise ValueError(f"unknown data.batching {mode!r}; expected one of {BATCHING}")
    rng = random.Random(seed)
    buf: list[Row] = []
    size = batch_size if mode == "pad" else batch_size * window
    for row in rows:
        buf.append(row)
        if len(buf) >= size:
            yield from _flush(buf, batch_size, pad_id, mode, max_len, rng)
            buf = []
    if buf:
        yield from _flush(buf, batch_size, pad_id, mode, max_len, rng)


def _flush(buf: list[Row], batch_size: int, pad_id: int, mode: str, max_len: int,
           rng: random.Random) -> Iterator[dict[str, Any]]:
    if mode == "pad":
        yield pad_batch(buf, pad_id)
        return
    if mode == "group":
        ordered = sorted(buf, key=lambda r: len(r["input_ids"]))
        groups = [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]
        rng.shuffle(groups)
        for g in groups:
            yield pad_batch(g, pad_id)
        return
    bins = pack_rows(buf, max_len)
    rng.shuffle(bins)
    for i in range(0, len(bins), batch_size):
        yield packed_batch(bins[i:i + batch_size], pad_id)


def useful_tokens(batch: dict[str, Any]) -> int:
    """Non-padding tokens in a micro-batch (what tokens/s counts)."""
    return int(batch["num_tokens"])


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """The tensors the model's forward takes (drops bookkeeping such as num_tokens)."""
    return {k: v for k, v in batch.items() if k != "num_tokens"}
