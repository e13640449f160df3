"""sacrebleu corpus BLEU and chrF (standard, comparable numbers), with cluster-bootstrap CIs.

Scores are reported as fractions in [0, 1] (sacrebleu's 0-100 divided by 100) so every
number in a medray table shares one scale. Default sacrebleu settings: BLEU 13a
tokenisation, exp smoothing, case-sensitive; chrF char order 6, beta 2 (chrF, not chrF++).
Items with fewer references than others repeat their first reference (a duplicate
reference changes neither BLEU's clipped counts / closest length nor chrF's best match).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from medray.eval.metrics.bootstrap import Clusters, bootstrap_statistic

CORPUS_METRICS = ("sacrebleu_bleu", "chrf")


def _streams(references: Sequence[Sequence[str]]) -> list[list[str]]:
    width = max(len(r) for r in references)
    return [[r[i] if i < len(r) else r[0] for r in references] for i in range(width)]


def corpus_stats(
    predictions: Sequence[str], references: Sequence[Sequence[str]]
) -> dict[str, tuple[object, np.ndarray]]:
    """Per-item sufficient statistics for each corpus metric: {name: (metric, stats)}."""
    from sacrebleu.metrics import BLEU, CHRF

    streams = _streams(references)
    out = {}
    for name, metric in (("sacrebleu_bleu", BLEU()), ("chrf", CHRF())):
        # sacrebleu's own per-segment statistics (the same ones corpus_score sums).
        stats = metric._extract_corpus_statistics(list(predictions), streams)
        out[name] = (metric, np.asarray(stats, dtype=np.float64))
    return out


def corpus_scores(
    predictions: Sequence[str],
    references: Sequence[Sequence[str]],
    clusters: Clusters | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    weights: np.ndarray | None = None,
    index: np.ndarray | None = None,
    precomputed: dict | None = None,
) -> dict[str, dict]:
    """{"sacrebleu_bleu": {"mean": x, "ci95": [lo, hi]}, "chrf": {...}} as fractions.

    ``precomputed``/``index`` let breakdowns reuse the per-item statistics of the full set.
    """
    if len(predictions) == 0:
        return {k: {"mean": None, "ci95": [None, None]} for k in CORPUS_METRICS}
    stats_by_metric = precomputed or corpus_stats(predictions, references)
    out = {}
    for name, (metric, stats) in stats_by_metric.items():
        sel = stats if index is None else stats[index]

        def fn(row: np.ndarray, metric=metric) -> float:
            return float(metric._compute_score_from_stats(row).score) / 100.0

        out[name] = bootstrap_statistic(sel, fn, clusters, n_resamples, seed, weights)
    return out


def corpus_signature(stats: dict[str, tuple[object, np.ndarray]]) -> dict[str, str]:
    """sacrebleu signatures of the metrics that produced ``stats`` (from ``corpus_stats``)."""
    out = {name: str(metric.get_signature()) for name, (metric, _) in stats.items()}
    out["scale"] = "fraction (sacrebleu score / 100)"
    return out
