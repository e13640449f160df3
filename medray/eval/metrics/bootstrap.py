"""Seeded percentile-bootstrap 95% CIs, resampling clusters (patients) or items, vectorised.

MedQARo has ~100 questions per patient, so items are not independent: resampling whole
patients (cluster bootstrap) gives honest intervals. A resample draws C clusters with
replacement; every statistic is then a function of the per-cluster SUMS weighted by how
often each cluster was drawn, so one (B x C) @ (C x k) product does all resamples at once.
A mean is the ratio sum(values)/sum(counts) over the drawn clusters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 1000
DEFAULT_SEED = 0
_CHUNK = 250  # resamples per block: keeps the (B x n) index array small for 20k items


@dataclass(frozen=True)
class Clusters:
    """Item -> cluster index; ``n`` clusters. ``items(n)`` makes every item its own cluster."""

    index: np.ndarray
    n: int

    @classmethod
    def items(cls, n_items: int) -> Clusters:
        return cls(np.arange(n_items), n_items)

    @classmethod
    def from_labels(cls, labels: Sequence) -> Clusters:
        uniq, inv = np.unique(np.asarray(labels, dtype=object).astype(str), return_inverse=True)
        return cls(inv.astype(np.int64), len(uniq))

    def sums(self, values: np.ndarray) -> np.ndarray:
        """Per-cluster column sums of ``values`` (n_items x k) -> (n_clusters x k)."""
        values = np.asarray(values)
        if values.ndim == 1:
            values = values[:, None]
        out = np.zeros((self.n, values.shape[1]), dtype=np.result_type(values, np.float64))
        np.add.at(out, self.index, values)
        return out


def resample_weights(n_clusters: int, n_resamples: int, seed: int) -> np.ndarray:
    """(B x C) counts: how often each cluster is drawn in each bootstrap resample."""
    rng = np.random.default_rng(seed)
    out = np.empty((n_resamples, n_clusters), dtype=np.int32)
    for start in range(0, n_resamples, _CHUNK):
        b = min(_CHUNK, n_resamples - start)
        draws = rng.integers(0, n_clusters, size=(b, n_clusters))
        flat = draws + (np.arange(b) * n_clusters)[:, None]
        out[start:start + b] = np.bincount(flat.ravel(), minlength=b * n_clusters).reshape(
            b, n_clusters)
    return out


def _interval(samples: np.ndarray) -> tuple[float, float]:
    samples = samples[np.isfinite(samples)]
    if samples.size == 0:
        return (float("nan"), float("nan"))
    lo, hi = np.percentile(samples, [2.5, 97.5])
    return (float(lo), float(hi))


def bootstrap_means(
    values: dict[str, np.ndarray],
    clusters: Clusters | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    weights: np.ndarray | None = None,
) -> dict[str, dict]:
    """{metric: {"mean": x, "ci95": [lo, hi]}} for per-item arrays of equal length.

    All metrics share the same resamples (pass ``weights`` to share them across calls).
    """
    names = list(values)
    if not names:
        return {}
    mat = np.column_stack([np.asarray(values[k], dtype=np.float64) for k in names])
    n = mat.shape[0]
    if n == 0:
        return {k: {"mean": None, "ci95": [None, None]} for k in names}
    clusters = clusters or Clusters.items(n)
    sums = clusters.sums(np.column_stack([mat, np.ones(n)]))  # last column: item counts
    w = weights if weights is not None else resample_weights(clusters.n, n_resamples, seed)
    boot = w @ sums
    with np.errstate(invalid="ignore", divide="ignore"):
        boot_means = boot[:, :-1] / boot[:, -1:]
    means = mat.mean(axis=0)
    out = {}
    for j, k in enumerate(names):
        lo, hi = _interval(boot_means[:, j])
        out[k] = {"mean": float(means[j]), "ci95": [lo, hi]}
    return out


def bootstrap_statistic(
    stats: np.ndarray,
    fn: Callable[[np.ndarray], float],
    clusters: Clusters | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    weights: np.ndarray | None = None,
) -> dict:
    """CI of a corpus statistic computed by ``fn`` from SUMMED per-item sufficient statistics
    (e.g. sacrebleu's n-gram counts): ``fn(stats.sum(0))`` is the point estimate."""
    stats = np.asarray(stats)
    if stats.shape[0] == 0:
        return {"mean": None, "ci95": [None, None]}
    clusters = clusters or Clusters.items(stats.shape[0])
    sums = clusters.sums(stats)
    w = weights if weights is not None else resample_weights(clusters.n, n_resamples, seed)
    boot = w @ sums
    samples = np.fromiter((fn(row) for row in boot), dtype=np.float64, count=boot.shape[0])
    lo, hi = _interval(samples)
    return {"mean": float(fn(stats.sum(axis=0))), "ci95": [lo, hi]}
