"""Multiple-choice fine-tuning examples: the benchmark's own prompt, the key as the target.

An item's prompt is exactly what evaluation sends a text-completion engine
(`medray.prompts.text.render` + `prompt_text` under the run's PromptSpec, no shots), so the
fine-tuned model is asked at test time as it was taught. The target is the reply the
protocol asks for: the key letters in canonical order ("B", "ACD"; EuropeMedQA prefixes the
question id, "IT0001: A") plus EOS; the loss is on the target only. Validation reads the
greedy replies with the evaluation's own reader (`read_answer`) and scores them by the
all-correct rule, per kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from medray.data.registry import dataset_spec
from medray.eval.mcq import read_answer
from medray.prompts.spec import PromptSpec
from medray.prompts.text import example_dict, protocol_budget, question_id
from medray.prompts.text import render as render_item
from medray.prompts.tokens import IGNORE_INDEX, BudgetError, chat_prompt_ids


def target_text(ex: dict) -> str:
    letters = "".join(sorted(ex["answer"]))
    if dataset_spec(str(ex["dataset"])).id_prefix:
        return f"{question_id(ex)}: {letters}"
    return letters


def prompt_ids(tokenizer: Any, ex: dict, spec: PromptSpec) -> list[int]:
    """What vLLM and the transformers engine feed the model for this item's prompt."""
    return chat_prompt_ids(tokenizer, render_item(ex), spec)


def target_ids(tokenizer: Any, ex: dict) -> list[int]:
    return tokenizer.encode(target_text(ex), add_special_tokens=False) + [tokenizer.eos_token_id]


def check_items(items: pd.DataFrame, split: str, where: str) -> None:
    """Training is text-only: an item with images cannot be shown to the model."""
    with_images = [str(i) for i, im in zip(items["id"], items["images"], strict=True)
                   if im is not None and len(im)]
    if with_images:
        raise ValueError(f"{where}: {len(with_images)} {split} items have images (first "
                         f"{with_images[0]!r}); multiple-choice fine-tuning is text-only")


def examples_frame(tokenizer: Any, items: pd.DataFrame, spec: PromptSpec) -> pd.DataFrame:
    """(id, input_ids, labels, n_tokens) per item; an item longer than the budget fails by
    id (a multiple-choice prompt is never cut: its options would be lost)."""
    rows: dict[str, list] = {"id": [], "input_ids": [], "labels": [], "n_tokens": []}
    for record in items.to_dict("records"):
        ex = example_dict(record)
        prompt, target = prompt_ids(tokenizer, ex, spec), target_ids(tokenizer, ex)
        if len(prompt) + len(target) > spec.context_tokens:
            raise BudgetError(f"prompt.context_tokens={spec.context_tokens} cannot hold item "
                              f"{ex['id']!r}: {len(prompt)} prompt + {len(target)} target "
                              "tokens")
        rows["id"].append(ex["id"])
        rows["input_ids"].append(np.asarray(prompt + target, dtype=np.int32))
        rows["labels"].append(np.asarray([IGNORE_INDEX] * len(prompt) + target, dtype=np.int32))
        rows["n_tokens"].append(len(prompt) + len(target))
    return pd.DataFrame(rows)


def val_generate_items(tokenizer: Any, items: pd.DataFrame, spec: PromptSpec) -> list[dict]:
    """The fixed validation subset the loop generates for: prompt ids + what reading needs."""
    out = []
    for record in items.to_dict("records"):
        ex = example_dict(record)
        keep = {k: ex[k] for k in ("id", "dataset", "kind", "options", "answer")}
        keep["meta"] = record.get("meta")
        out.append({"id": ex["id"], "mcq": keep, "prompt_ids": prompt_ids(tokenizer, ex, spec),
                    "max_new_tokens": spec.new_tokens(None, protocol_budget(ex))})
    return out


def accuracy(pairs: Sequence[tuple[dict, str]]) -> dict[str, float]:
    """val_accuracy (all-correct rule, non-conforming wrong), per kind, conforming share."""
    by_kind: dict[str, list[float]] = {}
    correct, conforming = [], []
    for ex, reply in pairs:
        _, labels, ok = read_answer(reply, ex)
        hit = float(ok and set(labels) == set(ex["answer"]))
        correct.append(hit)
        conforming.append(float(ok))
        by_kind.setdefault(str(ex["kind"]), []).append(hit)
    metrics = {"val_accuracy": float(np.mean(correct)),
               "val_conforming": float(np.mean(conforming))}
    metrics.update({f"val_accuracy_{k}": float(np.mean(v)) for k, v in sorted(by_kind.items())})
    return metrics
