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
- "prefix": the examples that share a prompt prefix (one epicrisis, its questions) become
  one row: the prefix once, then each example's own tail. A 4-D mask lets every tail see
  the whole prefix and itself, never another tail, and each tail's position ids continue
  from the prefix, so every example's loss is exactly what it is alone (sdpa attention),
  while the epicrisis is computed once per row instead of once per question.

Batches are built on the host; the training step moves them to the worker's device
(medray.train.step, medray.train.device).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from medray.prompts.tokens import IGNORE_INDEX

BATCHING = ("pad", "group", "pack", "prefix")
# Examples share a row only where their common prefix is at least this long: below it
# the mask costs more than the shared computation saves.
MIN_SHARED_PREFIX = 32

Row = dict[str, list[int]]


# A micro-batch's bookkeeping beside its tensors (model_inputs leaves it out):
# num_tokens     non-padding tokens computed (a shared prefix once);
# num_examples   examples in it;
# example_tokens the examples' tokens as each would be alone (a shared prefix per example);
# target_tokens  tokens with a loss target.
BOOKKEEPING = ("num_tokens", "num_examples", "example_tokens", "target_tokens")
# Training writes each count summed over an optimiser step as a TensorBoard scalar: with
# the events' wall times, throughput over any window of steps, start-up left out.
STEP_SCALARS = {"num_tokens": "train/tokens", "num_examples": "train/examples",
                "example_tokens": "train/example_tokens", "target_tokens": "train/target_tokens"}


def _counts(tokens: int, examples: int, alone: int, labels: Any) -> dict[str, int]:
    return {"num_tokens": tokens, "num_examples": examples, "example_tokens": alone,
            "target_tokens": int((labels != IGNORE_INDEX).sum())}


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
            **_counts(int(mask.sum()), len(rows), int(mask.sum()), labels)}


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
    return {"input_ids": ids, "labels": labels, "position_ids": pos,
            **_counts(real, sum(len(b) for b in bins), real, labels)}


class PrefixTree:
    """Examples with one common prefix: the prefix once, then each example's tail."""

    def __init__(self, prefix_ids: list[int], prefix_labels: list[int]) -> None:
        self.prefix_ids, self.prefix_labels = prefix_ids, prefix_labels
        self.tails: list[Row] = []

    def __len__(self) -> int:
        return len(self.prefix_ids) + sum(len(t["input_ids"]) for t in self.tails)


def _shared_prefix(a: Row, b: Row) -> int:
    """Tokens two examples can share: their common prefix, shortened until it carries no
    loss (a shared target would count once instead of once per example) and leaves each
    tail a first token without a target (its prediction comes from the shared last token,
    which cannot predict two different tokens)."""
    n = 0
    for x, y in zip(a["input_ids"], b["input_ids"], strict=False):
        if x != y:
            break
        n += 1
    n = min(n, len(a["input_ids"]) - 1, len(b["input_ids"]) - 1)
    for labels in (a["labels"], b["labels"]):
        first_target = next((i for i, t in enumerate(labels) if t != IGNORE_INDEX), n)
        n = min(n, first_target)
    return n


def prefix_trees(rows: Sequence[Row], max_tokens: int,
                 min_shared: int = MIN_SHARED_PREFIX) -> list[PrefixTree]:
    """Group examples by shared prefix (sorted token ids put them side by side) into trees
    of at most max_tokens; an example that shares too little is a tree of its own."""
    trees: list[PrefixTree] = []
    ordered = sorted(rows, key=lambda r: r["input_ids"])
    i = 0
    while i < len(ordered):
        group, shared = [ordered[i]], len(ordered[i]["input_ids"]) - 1
        while i + len(group) < len(ordered):
            nxt = ordered[i + len(group)]
            common = min(shared, _shared_prefix(group[0], nxt))
            tails = sum(len(r["input_ids"]) for r in [*group, nxt]) - common * (len(group) + 1)
            if common < min_shared or common + tails > max_tokens:
                break
            group.append(nxt)
            shared = common
        if len(group) == 1:
            shared = 0
        tree = PrefixTree(group[0]["input_ids"][:shared], group[0]["labels"][:shared])
        tree.tails = [{"input_ids": r["input_ids"][shared:], "labels": r["labels"][shared:]}
                      for r in group]
        trees.append(tree)
        i += len(group)
    return trees


def prefix_batch(trees: Sequence[PrefixTree], pad_id: int) -> dict[str, Any]:
    """Rows of prefix + tails with a 4-D boolean mask (True: may attend) and position ids
    that continue from the prefix in every tail."""
    import torch

    width = max(len(t) for t in trees)
    ids = torch.full((len(trees), width), pad_id, dtype=torch.long)
    labels = torch.full((len(trees), width), IGNORE_INDEX, dtype=torch.long)
    pos = torch.zeros((len(trees), width), dtype=torch.long)
    mask = torch.zeros((len(trees), 1, width, width), dtype=torch.bool)
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    for i, tree in enumerate(trees):
        p = len(tree.prefix_ids)
        ids[i, :p] = torch.tensor(tree.prefix_ids, dtype=torch.long)
        labels[i, :p] = torch.tensor(tree.prefix_labels, dtype=torch.long)
        pos[i, :p] = torch.arange(p)
        mask[i, 0, :p, :p] = causal[:p, :p]
        at = p
        for tail in tree.tails:
            n = len(tail["input_ids"])
            ids[i, at:at + n] = torch.tensor(tail["input_ids"], dtype=torch.long)
            labels[i, at:at + n] = torch.tensor(tail["labels"], dtype=torch.long)
            pos[i, at:at + n] = torch.arange(p, p + n)
            mask[i, 0, at:at + n, :p] = True
            mask[i, 0, at:at + n, at:at + n] = causal[:n, :n]
            at += n
        # padding attends to itself only (a row with nothing to attend to would be NaN)
        mask[i, 0, at:, at:] = torch.eye(width - at, dtype=torch.bool)
    alone = sum(len(t.prefix_ids) + len(tail["input_ids"]) for t in trees for tail in t.tails)
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "attention_mask": mask,
            **_counts(sum(len(t) for t in trees), sum(len(t.tails) for t in trees), alone,
                      labels)}


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
    if mode == "prefix":
        trees = prefix_trees(buf, max_len)
        rng.shuffle(trees)
        for i in range(0, len(trees), batch_size):
            yield prefix_batch(trees[i:i + batch_size], pad_id)
        return
    bins = pack_rows(buf, max_len)
    rng.shuffle(bins)
    for i in range(0, len(bins), batch_size):
        yield packed_batch(bins[i:i + batch_size], pad_id)


def useful_tokens(batch: dict[str, Any]) -> int:
    """Non-padding tokens in a micro-batch (what tokens/s counts)."""
    return int(batch["num_tokens"])


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """The tensors the model's forward takes (drops the BOOKKEEPING counts)."""
    return {k: v for k, v in batch.items() if k not in BOOKKEEPING}
