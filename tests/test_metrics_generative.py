"""Generative metrics: mode medqaro pinned to the reference code, mode robust for Romanian.

Budget: ~2 s, plus a one-off WordNet load when its disk cache is cold (~10-20 s here) and
the RoWordNet test (~5 s warm, ~15 s cold).
"""

from __future__ import annotations

import re
import string

import pytest
from nltk.tokenize import word_tokenize
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from medray.eval.metrics import wordnet as wnmod
from medray.eval.metrics.generative import (
    GenerativeScorer,
    em_medqaro,
    em_robust,
    f1_medqaro,
    f1_robust,
)
from medray.eval.metrics.textnorm import fold_diacritics, normalize_robust


# Verbatim copy of the MedQARo reference evaluation (Evaluate/*.ipynb), kept here as the oracle.
def _ref_normalize_text(text):
    text = text.lower()
    text = re.sub(f"[{re.escape(string.punctuation)}]", "", text)
    text = " ".join(text.split())
    return text


def _ref_compute_f1(prediction, ground_truth):
    pred_tokens = _ref_normalize_text(prediction).split()
    truth_tokens = _ref_normalize_text(ground_truth).split()
    common = set(pred_tokens) & set(truth_tokens)
    num_same = len(common)
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(truth_tokens)
    return 2 * (precision * recall) / (precision + recall)


def _ref_compute_em(prediction, ground_truth):
    return int(_ref_normalize_text(prediction) == _ref_normalize_text(ground_truth))


EDGE_PAIRS = [
    ("ciclul 1 ciclul 2", "ciclul 1 ciclul 2"),
    ("", ""),
    ("„Da”", "Da"),
    ("«Nu»", "Nu"),
    ("ştefan", "ștefan"),
    ("ţesut", "țesut"),
    ("non-Hodgkin", "non-Hodgkin"),
    ("non-Hodgkin", "nonHodgkin"),
    ("non-Hodgkin", "non Hodgkin"),
    ("cancer mamar stâng", "cancer mamar"),
    ("Da.", "da"),
    ("pT2N1M0 (stadiul IIB)", "pT2 N1 M0"),
    ("3 luni", "3"),
    ("Nu", ""),
    ("", "Nu"),
    ("Da Da Da", "Da"),
    ("2.5 mg/m2", "2,5 mg/m²"),
    ("carcinom ductal invaziv – grad 2…", "Carcinom ductal invaziv grad 2"),
]


@pytest.mark.parametrize(("pred", "ref"), EDGE_PAIRS)
def test_medqaro_f1_em_equal_reference_code(pred, ref):
    assert f1_medqaro(pred, ref) == _ref_compute_f1(pred, ref)
    assert em_medqaro(pred, ref) == _ref_compute_em(pred, ref)


@pytest.mark.parametrize(
    ("pred", "ref", "f1", "em"),
    [
        ("ciclul 1 ciclul 2", "ciclul 1 ciclul 2", 0.75, 1.0),  # set F1 under-counts repeats
        ("", "", 0.0, 1.0),  # two empty strings: F1 0, EM 1
        ("„Da”", "Da", 0.0, 0.0),  # „ ” are not ASCII punctuation
        ("ştefan", "ștefan", 0.0, 0.0),  # cedilla vs comma-below differ
        ("non-Hodgkin", "nonHodgkin", 1.0, 1.0),  # hyphen deleted, not spaced
        ("non-Hodgkin", "non Hodgkin", 0.0, 0.0),
        ("cancer mamar stâng", "cancer mamar", 0.8, 0.0),  # multi-word partial
        ("Da Da Da", "Da", 0.5, 0.0),  # P = 1/3, R = 1
    ],
)
def test_medqaro_pinned_edge_cases(pred, ref, f1, em):
    assert f1_medqaro(pred, ref) == pytest.approx(f1, abs=1e-12)
    assert em_medqaro(pred, ref) == em


@pytest.mark.parametrize(
    ("pred", "ref"),
    [("ciclul 1 ciclul 2", "ciclul 1 ciclul 2"), ("„Da”", "Da"), ("ştefan", "ștefan"),
     ("«Nu»", "nu"), ("Ţesut tumoral…", "țesut tumoral")],
)
def test_robust_fixes_the_romanian_weaknesses(pred, ref):
    assert f1_robust(pred, [ref]) == 1.0
    assert em_robust(pred, [ref]) == 1.0


def test_robust_multiset_f1_and_multiple_references():
    # Counter F1 counts repeats: "ciclul 1 ciclul 2" vs "ciclul 1" -> P 2/4, R 1 -> 2/3
    assert f1_robust("ciclul 1 ciclul 2", ["ciclul 1"]) == pytest.approx(2 * 0.5 / 1.5)
    assert f1_robust("", [""]) == 1.0 and f1_robust("Nu", [""]) == 0.0
    assert f1_robust("cancer mamar", ["carcinom", "cancer mamar stâng"]) == pytest.approx(0.8)
    assert em_robust("Da", ["Nu", "da."]) == 1.0
    assert normalize_robust("Ştefan – „Da”…") == "ștefan da"
    assert fold_diacritics("ăâîșțş") == "aaists"
    assert f1_robust("stang", ["stâng"]) == 0.0
    assert f1_robust("stang", ["stâng"], fold=True) == 1.0


def _tok(text):
    return word_tokenize(text, preserve_line=True)


def test_medqaro_bleu_and_meteor_equal_direct_nltk_calls():
    from nltk.corpus import wordnet
    from nltk.translate.meteor_score import single_meteor_score

    scorer = GenerativeScorer("medqaro")
    if not scorer.wordnet.available:
        pytest.skip("NLTK WordNet not provisioned (scripts/provision_wordnet.sh .venv)")
    pairs = EDGE_PAIRS + [("the hound runs", "the dog runs"), ("Da", "da"),
                          ("a dog ran", "the dogs running fast")]
    for pred, ref in pairs:
        got = scorer.score(pred, ref)
        bleu = sentence_bleu([_tok(ref)], _tok(pred),
                             smoothing_function=SmoothingFunction().method4)
        meteor = single_meteor_score(_tok(ref), _tok(pred), alpha=0.9, beta=3, gamma=0.5,
                                     wordnet=wordnet)
        assert got["bleu"] == bleu, (pred, ref)
        assert got["meteor"] == meteor, (pred, ref)
        assert got["f1"] == _ref_compute_f1(pred, ref)
    # BLEU is case-sensitive (raw case), METEOR lower-cases.
    assert scorer.score("Da", "da")["bleu"] < 1.0
    assert scorer.score("Da", "da")["meteor"] == scorer.score("da", "da")["meteor"]


def test_meteor_uses_wordnet_synonyms_and_matches_nltk_doctest():
    scorer = GenerativeScorer("medqaro")
    if not scorer.wordnet.available:
        pytest.skip("NLTK WordNet not provisioned (scripts/provision_wordnet.sh .venv)")
    no_wn = GenerativeScorer("medqaro", use_wordnet=False)
    # "hound" is a WordNet synonym of "dog": only the WordNet stage can match it.
    assert scorer.score("the hound", "the dog")["meteor"] > no_wn.score("the hound",
                                                                         "the dog")["meteor"]
    hyp = ("It is a guide to action which ensures that the military always obeys the "
           "commands of the party")
    ref = "It is a guide to action that ensures that the military will forever heed Party commands"
    assert round(scorer.score(hyp, ref)["meteor"], 4) == 0.6944  # NLTK's documented value
    assert scorer.describe()["meteor_wordnet"] is True


def test_missing_wordnet_degrades_and_says_so(monkeypatch):
    import nltk.data

    def not_found(*_a, **_k):
        raise LookupError("wordnet")

    wnmod.english_wordnet.cache_clear()
    monkeypatch.setattr(nltk.data, "find", not_found)
    try:
        scorer = GenerativeScorer("medqaro")
        out = scorer.score("the dogs", "the dog")  # stem match still works
        assert out["meteor"] > 0.9
        assert scorer.describe()["meteor_wordnet"] is False
        assert scorer.score("the hound", "the dog")["meteor"] < 0.5
    finally:
        wnmod.english_wordnet.cache_clear()


def test_stem_index_adapter_on_fake_rowordnet():
    from nltk.stem.snowball import SnowballStemmer

    stem = SnowballStemmer("romanian").stem
    literal_sets = [["tumoare", "neoplasm"], ["tumoare_malignă", "cancer"], ["medic", "doctor"]]
    source = wnmod.stem_index_source(wnmod.build_stem_index(literal_sets, stem), "fake")
    assert stem("neoplasm") in source.synonyms(stem("tumoare"))
    assert "cancer" not in source.synonyms("tumoar")  # multi-word literals are skipped
    assert source.synsets("inexistent") == []
    scorer = GenerativeScorer("robust", _wordnet=source)
    with_syn = scorer.score("doctorul", "medicul")["meteor"]
    without = GenerativeScorer("robust", use_wordnet=False).score("doctorul", "medicul")
    assert with_syn > 0.4 and without["meteor"] == 0.0


@pytest.mark.slow
def test_real_rowordnet_synonyms_feed_robust_meteor():
    source = wnmod.romanian_wordnet(False)
    if not source.available:
        pytest.skip("rowordnet not installed")
    scorer = GenerativeScorer("robust")
    assert scorer.describe()["meteor_wordnet_source"] == "rowordnet"
    # RoWordNet has {medic, doctor} in one synset; the Snowball stems must still meet.
    assert scorer.score("doctor", "medic")["meteor"] > 0.4
    assert scorer.score("ştefan", "ștefan")["f1"] == 1.0


def test_process_pool_gives_identical_scores():
    import random

    rng = random.Random(0)
    words = ["da", "nu", "ciclul", "1", "2", "cancer", "mamar", "stâng", "„Da”", "ştefan"]
    refs = [" ".join(rng.choices(words, k=rng.randint(1, 4))) for _ in range(2100)]
    preds = [r if rng.random() < 0.5 else " ".join(rng.choices(words, k=2)) for r in refs]
    one = GenerativeScorer("medqaro", use_wordnet=False).score_many(
        preds, [[r] for r in refs], workers=1)
    two = GenerativeScorer("medqaro", use_wordnet=False).score_many(
        preds, [[r] for r in refs], workers=2)
    for m in ("f1", "em", "bleu", "meteor"):
        assert (one[m] == two[m]).all()
    assert one["f1"].mean() == pytest.approx(
        sum(_ref_compute_f1(p, r) for p, r in zip(preds, refs, strict=True)) / len(refs))
