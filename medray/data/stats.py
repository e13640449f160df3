"""Summary statistics of a prepared dataset (what `medray data stats` prints)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np

from medray.data.prepared import PreparedData


def _length_summary(lengths: list[int]) -> dict[str, float]:
    if not lengths:
        return {}
    arr = np.asarray(lengths)
    return {"min": int(arr.min()), "mean": round(float(arr.mean()), 1),
            "p50": int(np.percentile(arr, 50)), "p95": int(np.percentile(arr, 95)),
            "max": int(arr.max())}


def compute_stats(data: PreparedData, tokenizer: Any | None = None) -> dict[str, Any]:
    ex = data.examples
    stats: dict[str, Any] = {
        "dataset": data.dataset,
        "kind": data.kind,
        "examples": int(len(ex)),
        "splits": {k: int(v) for k, v in sorted(Counter(ex["split"]).items())},
    }
    if data.kind == "generative":
        assert data.contexts is not None
        stats["contexts"] = int(len(data.contexts))
        stats["patients"] = {
            split: int(group["patient_id"].nunique()) for split, group in ex.groupby("split")
        }
        stats["question_types"] = dict(Counter(ex["question_type"]))
        stats["cancer_types"] = dict(Counter(ex["cancer_type"]))
        stats["answer_majority"] = Counter(ex[ex["split"] == "train"]["answer"]).most_common(1)
        texts = data.contexts["text"].tolist()
        unit = "words"
        if tokenizer is not None:
            lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
            unit = "tokens"
        else:
            lengths = [len(t.split()) for t in texts]
        stats["context_length"] = {"unit": unit, **_length_summary(lengths)}
        stats["answer_length_words"] = _length_summary([len(a.split()) for a in ex["answer"]])
    else:
        single = ex[ex["answer"].map(len) == 1]
        stats["answer_letters"] = dict(sorted(Counter(a[0] for a in single["answer"]).items()))
        stats["kinds"] = dict(Counter(ex["kind"]))
        stats["languages"] = dict(Counter(ex["language"]))
        stats["with_images"] = int((ex["images"].map(len) > 0).sum())
        if "removed" in data.manifest:
            stats["removed_no_validated_key"] = data.manifest["removed"]["no_validated_key"]
        if "shuffle" in data.manifest:
            stats["shuffle"] = {k: v for k, v in data.manifest["shuffle"].items()}
    return stats


def letter_shares(counts: dict[str, int]) -> dict[str, float]:
    total = sum(counts.values()) or 1
    return {k: round(v / total, 4) for k, v in counts.items()}


def to_json(stats: dict[str, Any]) -> str:
    return json.dumps(stats, ensure_ascii=False, default=str)
