"""Deterministic synthetic MedQARo-like corpus in the released raw format.

Writes ``train.csv``, ``val.csv``, ``test.csv`` (breast + lung, split by patient) and
``test_cross.csv`` (five other cancers), each written by pandas with the index as the first
column and the columns ``Epicriza, Intrebare, Raspuns, cancer_type, question_type``. As in
the real release, the epicrisis is repeated on every row of its patient. Facts sit on
labelled lines at the head of the epicrisis (learnable by a tiny model with a trimmed
context); cross-domain patients use another centre's labels ("Examen histopatologic:").
About 15% of patients carry legacy cedilla letters (ş ţ) and CRLF line breaks.

Scales:
- ``small`` (default): 24/6/6 in-domain patients + 6 cross-domain, a dozen question
  families per site, epicrises of 300-900 words. For tests and the CPU demo.
- ``paper``: the paper's sizes. Patients 557+150 / 119+32 / 120+33 (breast+lung) and 231
  cross; questions 48 (breast) / 61 (lung) / 7 (other) families x 2 paraphrases, so
  train 71,772, val 15,328, test 15,546, test_cross 3,234 = 105,880 QA pairs: the paper's
  totals hold exactly, no rounding. Epicrisis lengths (whitespace words) are log-normal
  with mean ~7,800, clipped to the paper's [207, 34,247]. Rows are streamed per patient.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping
from pathlib import Path

import pandas as pd

from medray.data.synth.medqaro_families import NO, YES, families_for
from medray.data.synth.medqaro_patient import Patient, make_patient, render_epicrisis
from medray.data.synth.medqaro_text import CROSS_DOMAIN
from medray.io import atomic_directory

SCALES = ("small", "paper")
SPLIT_FILES = {"train": "train.csv", "val": "val.csv", "test": "test.csv",
               "test_cross": "test_cross.csv"}
COLUMNS = ["Epicriza", "Intrebare", "Raspuns", "cancer_type", "question_type"]

# Patients per split and cancer type.
_COUNTS = {
    "small": {"train": {"breast": 16, "lung": 8}, "val": {"breast": 4, "lung": 2},
              "test": {"breast": 4, "lung": 2}, "test_cross": 6},
    "paper": {"train": {"breast": 557, "lung": 150}, "val": {"breast": 119, "lung": 32},
              "test": {"breast": 120, "lung": 33}, "test_cross": 231},
}
_BREAST_SHARE = {"small": 2 / 3, "paper": 796 / 1011}

# Paper-scale length model: log-normal in words; mean = exp(mu + sigma^2 / 2) = 7,829.
PAPER_MIN_WORDS, PAPER_MAX_WORDS, PAPER_MEAN_WORDS = 207, 34_247, 7_829
_SIGMA = 0.6
_MU = math.log(PAPER_MEAN_WORDS) - _SIGMA**2 / 2
SMALL_WORDS = (300, 900)


def check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; allowed values: {', '.join(SCALES)}")


def draw_target_words(rng: random.Random, scale: str,
                      words: tuple[int, int] | None = None) -> int:
    """Target epicrisis length in whitespace-separated words."""
    if words is not None:
        return rng.randint(*words)
    if scale == "paper":
        return int(min(max(rng.lognormvariate(_MU, _SIGMA), PAPER_MIN_WORDS), PAPER_MAX_WORDS))
    return rng.randint(*SMALL_WORDS)


def split_plan(scale: str, n_patients: Mapping[str, int] | None = None
               ) -> dict[str, list[str]]:
    """Cancer type of every patient, per split (in-domain: breast then lung)."""
    check_scale(scale)
    counts = dict(_COUNTS[scale])
    if n_patients:
        unknown = set(n_patients) - set(SPLIT_FILES)
        if unknown:
            raise ValueError(f"n_patients: unknown split(s) {sorted(unknown)}; "
                             f"allowed: {', '.join(SPLIT_FILES)}")
        for split, n in n_patients.items():
            if n < 0:
                raise ValueError(f"n_patients[{split!r}] must be >= 0, got {n}")
            if split == "test_cross":
                counts[split] = n
            else:
                b = round(n * _BREAST_SHARE[scale])
                counts[split] = {"breast": b, "lung": n - b}
    plan: dict[str, list[str]] = {}
    for split, c in counts.items():
        if split == "test_cross":
            plan[split] = [CROSS_DOMAIN[i % len(CROSS_DOMAIN)] for i in range(c)]
        else:
            plan[split] = ["breast"] * c["breast"] + ["lung"] * c["lung"]
    return plan


def patient_rng(seed: int, pid: int) -> random.Random:
    # One stream per patient: a patient's record does not depend on the others.
    return random.Random(seed * 1_000_003 + pid)


def patient_rows(p: Patient, rng: random.Random, scale: str,
                 words: tuple[int, int] | None = None) -> list[tuple[str, str, str, str, str]]:
    """All QA rows of one patient: every family, two distinct paraphrases each."""
    text = render_epicrisis(p, rng, draw_target_words(rng, scale, words))
    rows = []
    for fam in families_for(p.cancer, scale):
        answer = fam.answer(p)
        qtype = "binary" if answer in (YES, NO) else fam.qtype
        for question in rng.sample(fam.paraphrases, 2):
            rows.append((text, question, answer, p.cancer, qtype))
    return rows


def iter_split_patients(seed: int, scale: str, n_patients: Mapping[str, int] | None = None
                        ) -> Iterator[tuple[str, Patient, random.Random]]:
    """(split, patient, its rng) in file order; patient ids are unique across splits."""
    plan = split_plan(scale, n_patients)
    pid = 0
    for split in SPLIT_FILES:
        cancers = list(plan[split])
        random.Random(f"order:{seed}:{split}").shuffle(cancers)  # mix sites inside a split
        for cancer in cancers:
            rng = patient_rng(seed, pid)
            yield split, make_patient(rng, pid, cancer), rng
            pid += 1


def _write_csv_stream(path: Path, chunks: Iterator[list[tuple]]) -> int:
    """pandas ``to_csv`` per chunk (the folder around it is swapped in atomically)."""
    n = 0
    with open(path, "w", encoding="utf-8", newline="") as fh:
        first = True
        for rows in chunks:
            df = pd.DataFrame(rows, columns=COLUMNS, index=range(n, n + len(rows)))
            df.to_csv(fh, header=first, lineterminator="\n")
            first, n = False, n + len(rows)
        if first:  # empty split: header only
            pd.DataFrame(columns=COLUMNS).to_csv(fh, lineterminator="\n")
    return n


def write_medqaro(out_dir: Path | str, seed: int = 0, scale: str = "small",
                  n_patients: Mapping[str, int] | None = None,
                  words: tuple[int, int] | None = None, force: bool = False) -> Path:
    """Write the four MedQARo-like CSV files into ``out_dir`` and return it.

    ``n_patients`` overrides the patients per split ({"train": 200, "test_cross": 20});
    ``words`` overrides the epicrisis length range (uniform, in words). Same arguments ->
    byte-identical files.
    """
    check_scale(scale)
    out = Path(out_dir)
    by_split: dict[str, list[tuple[Patient, random.Random]]] = {s: [] for s in SPLIT_FILES}
    for split, p, rng in iter_split_patients(seed, scale, n_patients):
        by_split[split].append((p, rng))  # patients are small; the text is made lazily below
    with atomic_directory(out, force=force, command="data synth medqaro") as tmp:
        for split, fname in SPLIT_FILES.items():
            chunks = (patient_rows(p, rng, scale, words) for p, rng in by_split[split])
            _write_csv_stream(tmp / fname, chunks)
    return out
