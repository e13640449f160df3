"""Aggregate per-item scores into the `medray score` result: means + CIs + breakdowns."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from medray.eval.metrics.bootstrap import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Clusters,
    bootstrap_means,
    resample_weights,
)
from medray.eval.metrics.corpus import corpus_scores, corpus_signature, corpus_stats
from medray.eval.metrics.generative import GenerativeScorer
from medray.eval.metrics.mcq import (
    MCQItemScores,
    extract_answer,
    extract_statements,
    random_expected_accuracy,
    score_items,
    statements_to_group,
)


def _clusters(labels: Sequence | None, n: int) -> Clusters:
    return Clusters.items(n) if labels is None else Clusters.from_labels(labels)


def _groups(table: pd.DataFrame, by: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for field in by:
        col = table[field].astype(str)
        out[field] = {v: np.flatnonzero(col.to_numpy() == v) for v in sorted(col.unique())}
    return out


def score_generative(
    table: pd.DataFrame,
    mode: str = "medqaro",
    by: Sequence[str] = (),
    fold_diacritics: bool = False,
    use_wordnet: bool = True,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    workers: int | None = None,
    scorer: GenerativeScorer | None = None,
) -> dict:
    """``table``: prediction (str), answers (list[str]), optional patient_id + ``by`` columns."""
    scorer = scorer or GenerativeScorer(mode, fold_diacritics, use_wordnet)
    preds = table["prediction"].astype(str).tolist()
    refs = [list(a) for a in table["answers"]]
    per_item = scorer.score_many(preds, refs, workers=workers)
    stats = corpus_stats(preds, refs)
    cl_labels = table["patient_id"].tolist() if "patient_id" in table else None

    def block(idx: np.ndarray | None) -> dict:
        vals = per_item if idx is None else {k: v[idx] for k, v in per_item.items()}
        sub = None if idx is None else (None if cl_labels is None else
                                        [cl_labels[i] for i in idx])
        n = len(preds) if idx is None else len(idx)
        cl = _clusters(cl_labels if idx is None else sub, n)
        w = resample_weights(cl.n, n_resamples, seed)
        metrics = bootstrap_means(vals, cl, weights=w)
        metrics.update(corpus_scores(preds, refs, cl, weights=w, index=idx, precomputed=stats))
        return {"n": n, "n_clusters": cl.n, "metrics": metrics}

    result = {"mode": mode, "kind": "generative", **block(None)}
    desc = scorer.describe()
    result["tokenizer"] = desc["tokenizer"]
    result["meteor_wordnet"] = desc["meteor_wordnet"]
    result["how"] = {
        **desc,
        "aggregation": "per-example scores averaged (fractions in [0, 1])",
        "multi_reference": "best score over the references, per metric",
        "ci": {"method": "percentile bootstrap 95%", "resamples": n_resamples, "seed": seed,
               "unit": "patient" if cl_labels is not None else "item",
               "cluster": cl_labels is not None},
        "corpus": corpus_signature(stats),
    }
    if by:
        result["by"] = {f: {v: block(idx) for v, idx in groups.items()}
                        for f, groups in _groups(table, by).items()}
    return result


def _extract_row(row: pd.Series, group_mapping: str | None) -> tuple[tuple[str, ...], bool]:
    kind = row["kind"]
    raw = row["prediction"]
    if kind == "group":
        if group_mapping:
            stmts, ok = extract_statements(raw, len(row["option_labels"]) or 4)
            letter = statements_to_group(stmts, group_mapping) if ok else None
            return ((letter,), True) if letter else ((), False)
        ext = extract_answer(raw, "ABCDE", multi=False)
    else:
        ext = extract_answer(raw, row["option_labels"], multi=(kind == "multiple"))
    return ext.labels, ext.conforming


def mcq_item_scores(table: pd.DataFrame, group_mapping: str | None = None) -> MCQItemScores:
    """Per item: the letters extracted from the raw output, scored against the key."""
    extracted = [_extract_row(r, group_mapping) for _, r in table.iterrows()]
    labels = [e[0] for e in extracted]
    conf = np.array([e[1] for e in extracted], dtype=bool)
    if "conforming" in table:  # an engine may already have flagged the output
        conf &= table["conforming"].fillna(True).astype(bool).to_numpy()
    return score_items(labels, [list(a) for a in table["answer"]], conf)


def score_mcq(
    table: pd.DataFrame,
    by: Sequence[str] = (),
    group_mapping: str | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> dict:
    """``table``: prediction (raw text), answer (list), kind, option_labels (list) + ``by``."""
    items = mcq_item_scores(table, group_mapping)
    conf = items.conforming
    rand = np.array([random_expected_accuracy(k, max(1, len(o)))
                     for k, o in zip(table["kind"], table["option_labels"], strict=True)])

    def block(idx: np.ndarray) -> dict:
        c = conf[idx]
        ok = idx[c]
        metrics = bootstrap_means(
            {"accuracy": items.correct[ok], "partial_credit": items.partial[ok]},
            n_resamples=n_resamples, seed=seed)
        metrics.update(bootstrap_means(
            {"accuracy_nonconforming_wrong": items.correct[idx] * c,
             "conforming_rate": c.astype(float)}, n_resamples=n_resamples, seed=seed))
        return {"n": int(len(idx)), "n_conforming": int(c.sum()),
                "n_nonconforming": int((~c).sum()), "metrics": metrics,
                "random_expected_accuracy": float(rand[idx].mean()) if len(idx) else None}

    all_idx = np.arange(len(table))
    result = {"mode": "mcq", "kind": "mcq", **block(all_idx)}
    result["per_kind"] = {k: block(idx) for k, idx in _groups(table, ["kind"])["kind"].items()}
    result["how"] = {
        "accuracy": "exact set of letters (all-correct rule), conforming outputs only",
        "partial_credit": "Jaccard overlap of chosen and correct letters, conforming only",
        "accuracy_nonconforming_wrong": "all items, non-conforming counted as wrong",
        "extraction": "medray.eval.metrics.mcq.extract_answer (EuropeMedQA: answer only)",
        "group_mapping": group_mapping or "off (group items answered with a letter)",
        "random_expected_accuracy": "single 1/k, group 1/5, multiple 1/(2^k-1) per item",
        "ci": {"method": "percentile bootstrap 95%", "resamples": n_resamples, "seed": seed,
               "unit": "item"},
    }
    if by:
        result["by"] = {f: {v: block(idx) for v, idx in groups.items()}
                        for f, groups in _groups(table, by).items()}
    return result
