"""Short causal-LM pre-training of the tiny random-init base (a data-prep step for the demo).

A random-init tiny Llama cannot learn MedQARo-style extraction with LoRA alone in a CPU
minute budget: LoRA only adds low-rank updates to frozen random projections and embeddings.
A few hundred full-parameter steps of next-token prediction on the *unlabelled epicrisis
text of the train split* give the base token statistics and the "Label: value" structure of
the records; LoRA then only has to learn the question -> answer mapping. Feed this function
train-split epicrises only (never QA pairs, never val/test text), so the zero-shot score of
the pre-trained base stays an honest baseline.

Plain torch in one process: it runs before Ray Train and is not the distributed fine-tuning.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from medray.io import atomic_directory

HELD_OUT_FRACTION = 0.05  # documents kept aside to measure held-out LM loss


def _token_streams(tokenizer: Any, texts: Sequence[str]) -> tuple[list[int], list[int]]:
    """(train stream, held-out stream): documents concatenated, each BOS ... EOS."""
    docs = [t for t in texts if t and t.strip()]
    if len(docs) < 2:
        raise ValueError(f"pretrain: need at least 2 non-empty texts, got {len(docs)}")
    n_held = max(1, round(len(docs) * HELD_OUT_FRACTION))
    enc = tokenizer(docs, add_special_tokens=True)["input_ids"]
    eos = tokenizer.eos_token_id

    def join(rows: list[list[int]]) -> list[int]:
        out: list[int] = []
        for ids in rows:
            out += list(ids) + [eos]
        return out

    return join(enc[:-n_held]), join(enc[-n_held:])


def _windows(stream: list[int], seq_len: int) -> list[list[int]]:
    """Non-overlapping windows covering the stream (the last one shorter is dropped)."""
    return [stream[i:i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]


def lm_loss(model: Any, windows: list[list[int]], batch_size: int = 8) -> float:
    """Mean next-token loss of `model` over fixed windows (no grad)."""
    import torch

    if not windows:
        raise ValueError("lm_loss: no window of the requested length in the held-out text")
    was_training = model.training
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(windows), batch_size):
            x = torch.tensor(windows[i:i + batch_size])
            total += model(input_ids=x, labels=x).loss.item() * len(x)
            n += len(x)
    model.train(was_training)
    return total / n


def pretrain_tiny_base(
    model_dir: str | os.PathLike,
    texts: Sequence[str],
    *,
    steps: int,
    lr: float,
    seq_len: int,
    batch_size: int,
    seed: int,
    out_dir: str | os.PathLike | None = None,
    warmup_fraction: float = 0.1,
    num_threads: int | None = None,
    progress: bool = True,
) -> dict:
    """Full-parameter causal-LM training of the base in `model_dir` on `texts`.

    Writes the pre-trained model and its tokenizer with `save_pretrained` to `out_dir`
    (default: `<model_dir>-pretrained`), via a temporary sibling renamed at the end, and
    returns {"out_dir", "steps", "tokens_seen", "train_tokens", "held_out_loss_before",
    "held_out_loss_after", "final_train_loss", "seconds"}.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if steps < 1 or seq_len < 2 or batch_size < 1 or lr <= 0:
        raise ValueError(f"pretrain: steps={steps}, seq_len={seq_len}, batch_size={batch_size}, "
                         f"lr={lr}: all must be positive (seq_len >= 2)")
    if num_threads:
        torch.set_num_threads(num_threads)
    src = Path(model_dir)
    out = Path(out_dir) if out_dir is not None else src.with_name(src.name + "-pretrained")
    started = time.time()
    torch.manual_seed(seed)
    rng = random.Random(seed)

    tokenizer = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    train_stream, held_stream = _token_streams(tokenizer, texts)
    if len(train_stream) <= seq_len:
        raise ValueError(f"pretrain: {len(train_stream)} training tokens, fewer than "
                         f"seq_len={seq_len}; give more text or a shorter seq_len")
    held = _windows(held_stream, seq_len) or [held_stream]
    loss_before = lm_loss(model, held)

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, int(steps * warmup_fraction))

    def schedule(step: int) -> float:  # linear warm-up, cosine decay to 0
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    last = float("nan")
    bar = tqdm(range(steps), desc="pretrain tiny base", disable=not progress, unit="step")
    for step in bar:
        # Random windows: with a corpus of ~10^5 tokens this is many passes' worth of variety.
        starts = [rng.randrange(0, len(train_stream) - seq_len) for _ in range(batch_size)]
        x = torch.tensor([train_stream[s:s + seq_len] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        last = loss.item()
        if step % 10 == 0 or step == steps - 1:
            bar.set_postfix(loss=f"{last:.3f}", lr=f"{sched.get_last_lr()[0]:.1e}")
    bar.close()
    loss_after = lm_loss(model, held)

    stats = {
        "out_dir": str(out),
        "steps": steps,
        "tokens_seen": steps * batch_size * seq_len,
        "train_tokens": len(train_stream),
        "held_out_tokens": len(held_stream),
        "held_out_loss_before": round(loss_before, 4),
        "held_out_loss_after": round(loss_after, 4),
        "final_train_loss": round(last, 4),
        "lr": lr, "seq_len": seq_len, "batch_size": batch_size, "seed": seed,
    }
    with atomic_directory(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        meta_path = src / "medray_tiny.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        meta["pretrain"] = {**stats, "base": str(src)}
        (tmp / "medray_tiny.json").write_text(json.dumps(meta, indent=2))
    stats["seconds"] = round(time.time() - started, 2)
    return stats
