"""Multiple-choice extraction, accuracy per kind, group-as-multiple mapping. Budget: < 1 s."""

from __future__ import annotations

from itertools import combinations

import pandas as pd
import pytest

from medray.data.schema import GROUP_CODES
from medray.eval.metrics.aggregate import score_mcq
from medray.eval.metrics.mcq import (
    extract_answer,
    extract_statements,
    partial_credit,
    random_expected_accuracy,
    statements_to_group,
)


@pytest.mark.parametrize(
    ("raw", "multi", "labels"),
    [
        ("B", False, ("B",)),
        ("b)", False, ("B",)),
        ("(C)", False, ("C",)),
        ("Răspuns: B", False, ("B",)),
        ("Raspunsul corect este D.", False, ("D",)),
        ("The letter of the right answer is: C", False, ("C",)),
        ("**A**", False, ("A",)),
        ("B. mitocondria", False, ("B",)),
        ("Answer: A, C", True, ("A", "C")),
        ("ACD", True, ("A", "C", "D")),
        ("DCA", True, ("A", "C", "D")),
        ("A și C", True, ("A", "C")),
        ("The letters of the right answers, as compact as possible, are: BE", True, ("B", "E")),
        ("A", True, ("A",)),
    ],
)
def test_extraction_conforming(raw, multi, labels):
    ext = extract_answer(raw, "ABCDE", multi=multi)
    assert ext.conforming and ext.labels == labels


@pytest.mark.parametrize(
    ("raw", "valid", "multi"),
    [
        ("", "ABCD", False),
        (None, "ABCD", False),
        ("Nu știu", "ABCD", False),
        ("I think the answer is B because of mitosis", "ABCD", False),
        ("E", "ABCD", False),  # not one of the item's options
        ("A, C", "ABCD", False),  # several letters for a one-letter kind
        ("AB", "ABCD", False),
        ("bad", "ABCD", True),  # a word, not letters
    ],
)
def test_extraction_non_conforming(raw, valid, multi):
    ext = extract_answer(raw, valid, multi=multi)
    assert not ext.conforming and ext.labels == ()


def test_group_mapping_reproduces_the_paper_examples():
    assert statements_to_group({1, 2}) == "A"  # (1,2) -> (1,2,3)
    assert statements_to_group({1}) == "B" and statements_to_group({3}) == "B"  # -> (1,3)
    assert statements_to_group({2, 3, 4}) == "E"  # -> (1,2,3,4)
    for letter, code in GROUP_CODES.items():  # valid sets map to themselves
        assert statements_to_group(code) == letter
    assert statements_to_group(set()) is None
    assert statements_to_group({2, 3}, "first") == "B"  # paper's "random" variant


def test_group_mapping_is_total_and_deterministic():
    every = [set(c) for r in range(1, 5) for c in combinations(range(1, 5), r)]
    got = {tuple(sorted(s)): statements_to_group(s) for s in every}
    assert all(v in GROUP_CODES for v in got.values()) and len(got) == 15
    assert got == {tuple(sorted(s)): statements_to_group(s) for s in reversed(every)}
    # nearest code wins outright when unique: {1,4} is one flip from D={4}
    assert got[(1, 4)] == "D" and got[(2,)] == "C"


def test_statement_extraction_digits_or_letters():
    assert extract_statements("1, 3") == (frozenset({1, 3}), True)
    assert extract_statements("Răspuns: A, C") == (frozenset({1, 3}), True)
    assert extract_statements("5")[1] is False
    assert extract_statements("poate")[1] is False


def test_partial_credit_and_random_expectation():
    assert partial_credit(["A", "C"], ["A", "C"]) == 1.0
    assert partial_credit(["A"], ["A", "C"]) == 0.5
    assert partial_credit(["B"], ["A", "C"]) == 0.0
    assert random_expected_accuracy("single", 4) == 0.25
    assert random_expected_accuracy("group", 4) == 0.2
    assert random_expected_accuracy("multiple", 5) == pytest.approx(1 / 31)  # paper: 0.032


def test_score_mcq_per_kind_all_correct_and_nonconforming():
    table = pd.DataFrame({
        "id": [f"q{i}" for i in range(6)],
        "kind": ["single", "single", "group", "multiple", "multiple", "single"],
        "answer": [["B"], ["A"], ["C"], ["A", "C"], ["B", "D"], ["D"]],
        "option_labels": [list("ABCD"), list("ABCD"), list("1234"), list("ABCDE"),
                          list("ABCDE"), list("ABCD")],
        "prediction": ["B", "Răspuns: C", "C", "AC", "Answer: B", "blah"],
    })
    res = score_mcq(table, n_resamples=200)
    assert res["n"] == 6 and res["n_nonconforming"] == 1 and res["n_conforming"] == 5
    assert res["metrics"]["accuracy"]["mean"] == pytest.approx(3 / 5)  # blah excluded
    assert res["metrics"]["accuracy_nonconforming_wrong"]["mean"] == pytest.approx(3 / 6)
    multi = res["per_kind"]["multiple"]
    assert multi["metrics"]["accuracy"]["mean"] == 0.5  # "B" vs BD fails the all-correct rule
    assert multi["metrics"]["partial_credit"]["mean"] == pytest.approx((1 + 0.5) / 2)
    single = res["per_kind"]["single"]
    assert single["n"] == 3 and single["n_nonconforming"] == 1
    assert single["random_expected_accuracy"] == 0.25


def test_score_mcq_group_as_multiple_mapping():
    table = pd.DataFrame({
        "id": ["g1", "g2", "g3"], "kind": ["group"] * 3, "answer": [["A"], ["B"], ["E"]],
        "option_labels": [list("1234")] * 3,
        "prediction": ["1, 2", "Răspuns: A", "2 3 4"],  # (1,2)->A, statement A=1 -> B, ->E
    })
    res = score_mcq(table, group_mapping="heuristic", n_resamples=100)
    assert res["metrics"]["accuracy"]["mean"] == 1.0
    assert res["how"]["group_mapping"] == "heuristic"
