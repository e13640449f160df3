"""Bootstrap CIs (seeded, cluster resampling) and sacrebleu corpus metrics. Budget: ~2 s."""

from __future__ import annotations

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF

from medray.eval.metrics.bootstrap import (
    Clusters,
    bootstrap_means,
    bootstrap_statistic,
    resample_weights,
)
from medray.eval.metrics.corpus import corpus_scores


def test_weights_are_seeded_multinomial_draws():
    w = resample_weights(50, 300, seed=3)
    assert w.shape == (300, 50) and (w.sum(axis=1) == 50).all()
    assert np.array_equal(w, resample_weights(50, 300, seed=3))
    assert not np.array_equal(w, resample_weights(50, 300, seed=4))
    # each cluster is drawn once per resample on average
    assert abs(w.mean() - 1.0) < 0.05


def test_ci_contains_mean_and_narrows_as_n_grows():
    rng = np.random.default_rng(0)
    widths = []
    for n in (50, 500, 5000):
        x = (rng.random(n) < 0.3).astype(float)
        res = bootstrap_means({"em": x}, n_resamples=500, seed=0)["em"]
        lo, hi = res["ci95"]
        assert lo <= res["mean"] <= hi
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]
    # ~1/sqrt(n): 100x more items -> about 10x narrower
    assert 5 < widths[0] / widths[2] < 20


def test_cluster_bootstrap_is_wider_for_correlated_items():
    rng = np.random.default_rng(1)
    patients = np.repeat(np.arange(40), 25)  # 40 patients x 25 questions
    skill = rng.random(40)[patients]  # answers depend on the patient
    x = (rng.random(len(patients)) < skill).astype(float)
    item = bootstrap_means({"f1": x}, n_resamples=500, seed=0)["f1"]
    clus = bootstrap_means({"f1": x}, Clusters.from_labels(patients), 500, 0)["f1"]
    assert item["mean"] == clus["mean"]
    assert (clus["ci95"][1] - clus["ci95"][0]) > 2 * (item["ci95"][1] - item["ci95"][0])


def test_bootstrap_statistic_point_estimate_is_statistic_of_sums():
    stats = np.array([[1, 2], [3, 4], [5, 6]], dtype=float)
    res = bootstrap_statistic(stats, lambda r: r[0] / r[1], n_resamples=100, seed=0)
    assert res["mean"] == pytest.approx(9 / 12)
    assert res["ci95"][0] <= res["mean"] <= res["ci95"][1]


def test_corpus_scores_equal_sacrebleu():
    hyps = ["Nu", "carcinom ductal invaziv", "3 luni", "Da", "pT2N1M0 stadiul IIB"]
    refs = [["Nu"], ["carcinom ductal invaziv grad 2"], ["3"], ["Nu"], ["pT2N1M0"]]
    res = corpus_scores(hyps, refs, n_resamples=200, seed=0)
    streams = [[r[0] for r in refs]]
    assert res["sacrebleu_bleu"]["mean"] == pytest.approx(
        BLEU().corpus_score(hyps, streams).score / 100)
    assert res["chrf"]["mean"] == pytest.approx(CHRF().corpus_score(hyps, streams).score / 100)
    # several references per item: padding with a duplicate changes nothing
    multi = corpus_scores(hyps, [r + (["3 luni"] if i == 2 else []) for i, r in enumerate(refs)],
                          n_resamples=50)
    two = [[r[0] for r in refs], [r[0] if i != 2 else "3 luni" for i, r in enumerate(refs)]]
    assert multi["chrf"]["mean"] == pytest.approx(CHRF().corpus_score(hyps, two).score / 100)
