"""Per-example generative QA metrics (F1, EM, BLEU, METEOR) in two modes.

``medqaro``: bit-compatible with the MedQARo reference evaluation (see textnorm.py for
``normalize_text``)::

    def compute_f1(prediction, ground_truth):
        pred_tokens = normalize_text(prediction).split()
        truth_tokens = normalize_text(ground_truth).split()
        common = set(pred_tokens) & set(truth_tokens)      # a SET: repeats under-count
        num_same = len(common)
        if num_same == 0:
            return 0.0                                       # two empty strings -> 0
        precision = num_same / len(pred_tokens)
        recall = num_same / len(truth_tokens)
        return 2 * (precision * recall) / (precision + recall)

    em = int(normalize_text(prediction) == normalize_text(ground_truth))
    bleu = sentence_bleu([word_tokenize(ref)], word_tokenize(pred),
                         smoothing_function=SmoothingFunction().method4)     # raw case
    meteor = evaluate.load("meteor").compute(predictions=[pred], references=[ref])
           = single_meteor_score(word_tokenize(ref), word_tokenize(pred),
                                 alpha=0.9, beta=3, gamma=0.5)  # str.lower, Porter, WordNet

``robust``: SQuAD multiset F1 (two empties -> 1), Unicode punctuation removed, ş/ș ţ/ț
unified, optional diacritic folding, BLEU/METEOR on those normalised tokens, METEOR with the
Romanian Snowball stemmer and RoWordNet synonyms; several references -> best score.

All functions are pure; ``GenerativeScorer`` only holds the machinery built once (stemmer,
synonym source, smoothing) so scoring 20k pairs costs seconds.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from medray.eval.metrics.textnorm import (
    nltk_tokens,
    normalize_medqaro,
    normalize_robust,
    robust_tokens,
)

MODES = ("medqaro", "robust")
METRICS = ("f1", "em", "bleu", "meteor")
METEOR_PARAMS = {"alpha": 0.9, "beta": 3.0, "gamma": 0.5}


# --- mode medqaro: the reference formulas -----------------------------------------------------


def f1_medqaro(prediction: str, reference: str) -> float:
    pred_tokens = normalize_medqaro(prediction).split()
    truth_tokens = normalize_medqaro(reference).split()
    num_same = len(set(pred_tokens) & set(truth_tokens))
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(truth_tokens)
    return 2 * (precision * recall) / (precision + recall)


def em_medqaro(prediction: str, reference: str) -> float:
    return float(normalize_medqaro(prediction) == normalize_medqaro(reference))


# --- mode robust ------------------------------------------------------------------------------


def f1_squad(pred_tokens: Sequence[str], ref_tokens: Sequence[str]) -> float:
    """SQuAD v1.1 token F1 on multisets; two empty answers agree (1.0)."""
    if not pred_tokens or not ref_tokens:
        return float(len(pred_tokens) == len(ref_tokens))
    num_same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_robust(prediction: str, references: Sequence[str], fold: bool = False) -> float:
    pred = robust_tokens(prediction, fold)
    return max(f1_squad(pred, robust_tokens(r, fold)) for r in references)


def em_robust(prediction: str, references: Sequence[str], fold: bool = False) -> float:
    pred = normalize_robust(prediction, fold)
    return float(any(pred == normalize_robust(r, fold) for r in references))


# --- the scorer -------------------------------------------------------------------------------


@dataclass
class GenerativeScorer:
    """Builds the METEOR/BLEU machinery once; ``score`` is then a pure per-pair function.

    ``wordnet=False`` disables synonyms (useful in tests); ``None`` loads the mode's source
    lazily (English WordNet for medqaro, RoWordNet for robust).
    """

    mode: str = "medqaro"
    fold_diacritics: bool = False
    use_wordnet: bool = True
    _wordnet: object | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown metric mode {self.mode!r}; expected one of {MODES}")
        from nltk.stem.porter import PorterStemmer
        from nltk.stem.snowball import SnowballStemmer
        from nltk.translate.bleu_score import SmoothingFunction

        self._smooth = SmoothingFunction().method4
        base = PorterStemmer() if self.mode == "medqaro" else SnowballStemmer("romanian")
        self._stemmer = CachedStemmer(base)
        self._memo: dict[tuple, dict[str, float]] = {}  # answers repeat ("Nu", "Da", ...)

    @property
    def wordnet(self):
        if self._wordnet is None:
            from medray.eval.metrics import wordnet as wnmod

            if not self.use_wordnet:
                self._wordnet = wnmod.empty_source("disabled")
            elif self.mode == "medqaro":
                self._wordnet = wnmod.english_wordnet()
            else:
                self._wordnet = wnmod.romanian_wordnet(self.fold_diacritics)
        return self._wordnet

    def describe(self) -> dict:
        wn = self.wordnet
        if self.mode == "medqaro":
            tok = "nltk word_tokenize(preserve_line=True), raw case (BLEU); lowercased (METEOR)"
            norm = "lowercase, delete string.punctuation, collapse whitespace; set F1"
            stem = "porter"
        else:
            tok = "whitespace after robust normalisation"
            norm = ("NFC, ş/ţ->ș/ț, lowercase, delete Unicode punctuation"
                    + (", fold diacritics" if self.fold_diacritics else "") + "; multiset F1")
            stem = "snowball-romanian"
        return {"tokenizer": tok, "normalisation": norm, "meteor_stemmer": stem,
                "meteor_wordnet": bool(wn.available), "meteor_wordnet_source": wn.name,
                "meteor_params": METEOR_PARAMS, "bleu": "nltk sentence_bleu, smoothing method4"}

    def _tokens(self, text: str) -> tuple[str, ...]:
        if self.mode == "medqaro":
            return nltk_tokens(text)
        return robust_tokens(text, self.fold_diacritics)

    def score(self, prediction: str, references: str | Sequence[str]) -> dict[str, float]:
        from nltk.translate.bleu_score import sentence_bleu
        from nltk.translate.meteor_score import meteor_score

        refs = [references] if isinstance(references, str) else list(references)
        if not refs:
            raise ValueError("at least one reference is required")
        key = (prediction, *refs)
        hit = self._memo.get(key)
        if hit is not None:
            return dict(hit)
        hyp = self._tokens(prediction)
        ref_toks = [self._tokens(r) for r in refs]
        if self.mode == "medqaro":
            # The reference scores one reference; with several we keep the best, per metric.
            f1 = max(f1_medqaro(prediction, r) for r in refs)
            em = max(em_medqaro(prediction, r) for r in refs)
        else:
            f1 = f1_robust(prediction, refs, self.fold_diacritics)
            em = em_robust(prediction, refs, self.fold_diacritics)
        bleu = sentence_bleu([list(r) for r in ref_toks], list(hyp),
                             smoothing_function=self._smooth)
        meteor = meteor_score(ref_toks, hyp, stemmer=self._stemmer, wordnet=self.wordnet,
                              **METEOR_PARAMS)
        out = {"f1": float(f1), "em": float(em), "bleu": float(bleu), "meteor": float(meteor)}
        if len(self._memo) < 500_000:
            self._memo[key] = out
        return dict(out)

    def _prewarm(self, predictions: Sequence[str]) -> None:
        """Look up every hypothesis stem once (METEOR queries synonyms of stemmed words)."""
        words = {w.lower() for p in set(predictions) for w in self._tokens(p)}
        for w in sorted(words):
            self.wordnet.synsets(self._stemmer.stem(w))

    def score_many(
        self,
        predictions: Sequence[str],
        references: Sequence[Sequence[str]],
        workers: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, np.ndarray]:
        """Per-example arrays for every metric; ``workers>1`` forks a process pool."""
        if len(predictions) != len(references):
            raise ValueError("predictions and references differ in length")
        n = len(predictions)
        workers = default_workers(n) if workers is None else max(1, workers)
        pairs = list(zip(predictions, references, strict=True))
        if workers == 1 or n < 2000:
            rows = [self.score(p, r) for p, r in pairs]
        else:
            self._prewarm(predictions)  # forked workers inherit the synonym cache
            rows = _score_in_pool(self, pairs, workers)
        self.wordnet.save()
        if progress:
            progress(n)
        return {m: np.fromiter((r[m] for r in rows), dtype=np.float64, count=n) for m in METRICS}


class CachedStemmer:
    """Memoising wrapper: same stems as the wrapped NLTK stemmer, computed once per word."""

    def __init__(self, stemmer) -> None:
        self._stemmer = stemmer
        self._cache: dict[str, str] = {}

    def stem(self, word: str) -> str:
        hit = self._cache.get(word)
        if hit is None:
            hit = self._cache[word] = self._stemmer.stem(word)
        return hit


def default_workers(n: int) -> int:
    """One process unless there is a lot to score: the memo caches make one process fast and
    a fork pool only pays off for large, varied sets on otherwise idle cores."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 1 if n < 50_000 else max(1, min(4, cpus or 1))


_POOL_SCORER: GenerativeScorer | None = None


def _score_chunk(chunk: list[tuple[str, Sequence[str]]]) -> list[dict[str, float]]:
    assert _POOL_SCORER is not None
    return [_POOL_SCORER.score(p, r) for p, r in chunk]


def _score_in_pool(scorer: GenerativeScorer, pairs: list, workers: int) -> list[dict]:
    import multiprocessing as mp

    global _POOL_SCORER
    _POOL_SCORER = scorer  # inherited by fork: WordNet and caches are not rebuilt
    size = max(200, len(pairs) // (workers * 4))
    chunks = [pairs[i:i + size] for i in range(0, len(pairs), size)]
    try:
        with mp.get_context("fork").Pool(workers) as pool:
            out = pool.map(_score_chunk, chunks)
    finally:
        _POOL_SCORER = None
    return [row for chunk in out for row in chunk]
