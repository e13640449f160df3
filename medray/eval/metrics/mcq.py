"""Multiple-choice metrics: answer extraction, accuracy per kind, group-as-multiple mapping.

Extraction follows the EuropeMedQA protocol (strict "answer only" prompts): an output is
CONFORMING when, after an optional answer marker ("Răspuns:", "Answer:", "The letter of the
right answer is:", ...), it consists only of option letters (optionally with ")" "." or the
option text after a single letter). Everything else (no letter, letters outside the item's
options, several letters for a one-letter kind, prose) is non-conforming: excluded from
accuracy and counted.

Group choice (RoBiology): statements 1-4; the key is a letter naming a set of true statements
(``GROUP_CODES``). When the model answers the statements as multiple choice, the set is
mapped back to a letter. Valid sets map directly. For invalid sets the paper (Sec. 4.5)
only gives examples: (1,2) -> (1,2,3); (1) or (3) -> (1,3); (2,3,4) -> (1,2,3,4), "and so
on". Our deterministic rule reproduces all of them: take the code at the smallest symmetric
difference (fewest statement flips); break ties by preferring codes that keep every statement
the model affirmed (supersets), then the smaller code, then the earlier letter. The empty
set is non-conforming. ``strategy="first"`` is the paper's "random" variant: the first
chosen statement's position read as a letter (1 -> A, ...).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from medray.data.schema import GROUP_CODES, LETTERS

_MARKER = re.compile(
    r"(?:r[ăa]spuns(?:ul)?(?:\s+(?:corect|final))?(?:\s+(?:este|e))?"
    r"|(?:final\s+|correct\s+|right\s+)?answers?(?:\s+(?:is|are))?"
    r"|the\s+letters?\s+of\s+(?:all\s+)?the\s+(?:right|correct)\s+answers?"
    r"(?:,\s*as\s+compact\s+as\s+possible,)?\s+(?:is|are)"
    r"|the\s+(?:right|correct)\s+answers?\s+(?:is|are)"
    r"|variant[ae]?(?:\s+corect[ăae]?)?|option(?:s)?)\s*[:=\-]?\s*",
    re.IGNORECASE,
)
_WRAP = str.maketrans({c: " " for c in "*_`\"'„”“«»[]{}"})
_SEP = r"(?:\s*(?:,|;|/|&|\+|\band\b|\bși\b|\bsi\b|\bor\b)\s*|\s+)"


@dataclass(frozen=True)
class Extraction:
    labels: tuple[str, ...]
    conforming: bool


NONCONFORMING = Extraction((), False)


def _answer_segment(raw: str) -> str:
    text = raw.translate(_WRAP).strip()
    last = None
    for m in _MARKER.finditer(text):
        last = m
    if last is not None and last.end() < len(text):
        text = text[last.end():]
    return text.strip().rstrip(".!;:").strip()


def extract_answer(raw: str | None, valid: Sequence[str] = tuple(LETTERS),
                   multi: bool = False) -> Extraction:
    """Letters the model chose, sorted, and whether the output conforms.

    ``valid``: the item's option labels; ``multi``: several letters allowed (multiple
    choice). Accepted: "B", "b)", "(B)", "B. text", "Răspuns: B", "Answer: A, C", "ACD",
    "A și C", "The letter of the right answer is: C".
    """
    if raw is None:
        return NONCONFORMING
    seg = _answer_segment(str(raw))
    if not seg:
        return NONCONFORMING
    valid_up = {v.upper() for v in valid}
    letters: list[str] | None = None
    # "ACD": compact upper-case letters only (so words like "bad" never read as letters).
    if re.fullmatch(r"[A-Z]{2,}", seg) and multi:
        letters = list(seg)
    # "A, C", "A si C", "(A) (C)", "a)" ...
    elif re.fullmatch(rf"\(?[A-Za-z]\)?(?:{_SEP}\(?[A-Za-z]\)?)*[.)]?", seg):
        letters = re.findall(r"\b[A-Za-z]\b", seg)  # skips the "i" of "și"
        if len(letters) > 1 and any(c.islower() for c in letters):
            letters = None  # "a b" is far more likely prose than two options
    # "B. text of option B" / "B) text": one letter followed by the option text.
    else:
        m = re.match(r"\(?([A-Z])[.)]\s+\S", seg) or re.match(r"\(?([a-z])\)\s+\S", seg)
        if m:
            letters = [m.group(1)]
    if not letters:
        return NONCONFORMING
    chosen = sorted({c.upper() for c in letters})
    if any(c not in valid_up for c in chosen) or (len(chosen) > 1 and not multi):
        return NONCONFORMING
    return Extraction(tuple(chosen), True)


def extract_statements(raw: str | None, n_statements: int = 4) -> tuple[frozenset[int], bool]:
    """Statements chosen when a group item was asked as multiple choice: digits "1, 3" or
    letters "A, C" (A = statement 1, ...)."""
    if raw is None:
        return frozenset(), False
    seg = _answer_segment(str(raw))
    if re.fullmatch(rf"\(?\d\)?(?:{_SEP}\(?\d\)?)*\.?", seg or "x"):
        nums = {int(d) for d in re.findall(r"\d", seg)}
        ok = bool(nums) and all(1 <= d <= n_statements for d in nums)
        return (frozenset(nums), True) if ok else (frozenset(), False)
    ext = extract_answer(raw, LETTERS[:n_statements], multi=True)
    if not ext.conforming:
        return frozenset(), False
    return frozenset(LETTERS.index(c) + 1 for c in ext.labels), True


def statements_to_group(statements: Iterable[int], strategy: str = "heuristic") -> str | None:
    """Map a set of statements to a group letter (see module docstring); None if empty."""
    chosen = frozenset(statements)
    if not chosen:
        return None
    for letter, code in GROUP_CODES.items():
        if code == chosen:
            return letter
    if strategy == "first":
        return LETTERS[min(chosen) - 1]
    if strategy != "heuristic":
        raise ValueError(f"unknown group mapping strategy {strategy!r}")

    def cost(item: tuple[str, frozenset[int]]) -> tuple:
        letter, code = item
        return (len(code ^ chosen), not chosen <= code, len(code), letter)

    return min(GROUP_CODES.items(), key=cost)[0]


# --- scoring ----------------------------------------------------------------------------------


def partial_credit(pred: Sequence[str], gold: Sequence[str]) -> float:
    """Jaccard overlap of chosen and correct letters: 1 only for the exact set, 0 if disjoint."""
    p, g = set(pred), set(gold)
    if not p and not g:
        return 1.0
    return len(p & g) / len(p | g)


@dataclass
class MCQItemScores:
    correct: np.ndarray  # all-correct rule (exact set), 0/1, over conforming items only
    partial: np.ndarray
    conforming: np.ndarray  # bool, over all items


def score_items(preds: Sequence[Sequence[str]], golds: Sequence[Sequence[str]],
                conforming: Sequence[bool]) -> MCQItemScores:
    conf = np.asarray(conforming, dtype=bool)
    correct = np.array([float(set(p) == set(g)) for p, g in zip(preds, golds, strict=True)])
    partial = np.array([partial_credit(p, g) for p, g in zip(preds, golds, strict=True)])
    return MCQItemScores(correct=correct, partial=partial, conforming=conf)


def random_expected_accuracy(kind: str, n_options: int) -> float:
    """Accuracy of a uniform random guess over the answers the kind allows."""
    if kind == "single":
        return 1.0 / n_options
    if kind == "group":
        return 1.0 / len(GROUP_CODES)
    if kind == "multiple":
        return 1.0 / (2**n_options - 1)  # any non-empty subset
    raise ValueError(f"unknown kind {kind!r}")
