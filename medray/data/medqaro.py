"""MedQARo loader: the released CSVs -> contexts table (one row per epicrisis) + examples.

Released format (reference code): one CSV per split read with
`pd.read_csv(path, index_col=0)`, columns Epicriza (context), Intrebare (question),
Raspuns (answer). There is no patient id: the same epicrisis text means the same patient,
so the patient id is a stable hash of the normalised epicrisis unless an id column exists.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa

from medray.data.schema import CONTEXT_SCHEMA, GENERATIVE_SCHEMA, QUESTION_TYPES, DataError
from medray.text import normalize

DATASET = "medqaro"
REQUIRED = ("Epicriza", "Intrebare", "Raspuns")
# File names accepted per split, first match wins.
SPLIT_FILES: dict[str, tuple[str, ...]] = {
    "train": ("train.csv",),
    "val": ("val.csv", "validation.csv", "dev.csv"),
    "test": ("test.csv",),
    "test_cross": ("test_cross.csv", "cross_test.csv", "test_cross_domain.csv"),
}
PATIENT_ID_COLUMNS = ("patient_id", "pacient_id", "id_pacient")
BINARY_ANSWERS = {"da", "nu"}
READ_CHUNK_ROWS = 20_000


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def derive_question_type(answer: str, context: str) -> str:
    """binary for Da/Nu, extractive when the answer occurs in the epicrisis, else reasoning."""
    a = answer.strip().lower().rstrip(".")
    if a in BINARY_ANSWERS:
        return "binary"
    if a and a in context.lower():
        return "extractive"
    return "reasoning"


def find_split_files(input_dir: Path) -> dict[str, Path]:
    if input_dir.is_file():
        raise DataError(str(input_dir), None, None, "expected a directory holding train.csv, "
                        "val.csv, test.csv (and optionally test_cross.csv)")
    found = {}
    for split, names in SPLIT_FILES.items():
        for name in names:
            if (input_dir / name).is_file():
                found[split] = input_dir / name
                break
    if not found:
        wanted = ", ".join(n for names in SPLIT_FILES.values() for n in names)
        raise DataError(str(input_dir), None, None, f"no MedQARo split file found ({wanted})")
    return found


class _Builder:
    """Accumulates examples and the deduplicated contexts across split files."""

    def __init__(self, compat: str | None) -> None:
        self.compat = compat
        self.examples: dict[str, list] = {name: [] for name in GENERATIVE_SCHEMA.names}
        self.contexts: dict[str, dict] = {}  # context_id -> row
        self.patient_home: dict[str, tuple[str, str, int]] = {}  # pid -> (split, file, row)
        self._norm_cache: dict[str, tuple[str, str]] = {}  # raw digest -> (text, context_id)
        self.seen_ids: dict[str, tuple[str, int]] = {}

    def _context(self, raw: str) -> tuple[str, str]:
        # Each epicrisis repeats ~96 times in the release: normalise and hash it once.
        key = hashlib.sha1(raw.encode("utf-8")).hexdigest()
        if key not in self._norm_cache:
            text = normalize(raw, self.compat)
            self._norm_cache[key] = (text, "c_" + _digest(normalize(raw)))
        return self._norm_cache[key]

    def add_file(self, split: str, path: Path) -> None:
        row_base = 0
        reader = pd.read_csv(path, index_col=0, dtype=str, keep_default_na=False,
                             chunksize=READ_CHUNK_ROWS)
        for chunk in reader:
            missing = [c for c in REQUIRED if c not in chunk.columns]
            if missing:
                raise DataError(str(path), None, missing[0], "required column is missing "
                                f"(expected {', '.join(REQUIRED)})")
            extra = [c for c in chunk.columns if c not in REQUIRED]
            for offset, (index, record) in enumerate(chunk.iterrows()):
                self._add_row(split, path, row_base + offset + 1, str(index), record, extra)
            row_base += len(chunk)
        if row_base == 0:
            raise DataError(str(path), None, None, "the file has no data rows")

    def _add_row(self, split: str, path: Path, row: int, index: str, record: pd.Series,
                 extra: list[str]) -> None:
        for field in REQUIRED:
            if not str(record[field]).strip():
                raise DataError(str(path), row, field, "empty value")
        example_id = f"{split}:{index}"
        if example_id in self.seen_ids:
            first_file, first_row = self.seen_ids[example_id]
            raise DataError(str(path), row, "index", f"duplicate id {example_id!r} "
                            f"(first at {first_file}, row {first_row})")
        self.seen_ids[example_id] = (str(path), row)

        context_text, context_id = self._context(record["Epicriza"])
        pid_column = next((c for c in PATIENT_ID_COLUMNS if c in extra), None)
        patient_id = str(record[pid_column]).strip() if pid_column else "p_" + context_id[2:]
        if patient_id in self.patient_home and self.patient_home[patient_id][0] != split:
            other_split, other_file, other_row = self.patient_home[patient_id]
            raise DataError(str(path), row, pid_column or "Epicriza",
                            f"patient {patient_id} also appears in split {other_split!r} "
                            f"({other_file}, row {other_row}); splits must be by patient")
        self.patient_home.setdefault(patient_id, (split, str(path), row))

        question = normalize(record["Intrebare"], self.compat)
        answer = normalize(record["Raspuns"], self.compat)
        given_type = str(record["question_type"]).strip() if "question_type" in extra else ""
        if given_type and given_type not in QUESTION_TYPES:
            raise DataError(str(path), row, "question_type",
                            f"{given_type!r} is not one of {', '.join(QUESTION_TYPES)}")
        question_type = given_type or derive_question_type(answer, context_text)
        cancer_type = (str(record["cancer_type"]).strip() if "cancer_type" in extra else "")
        domain = "cross" if split == "test_cross" else "in"
        meta = {c: record[c] for c in extra if c not in ("question_type", "cancer_type")}

        if context_id not in self.contexts:
            self.contexts[context_id] = {
                "context_id": context_id, "patient_id": patient_id, "text": context_text,
                "cancer_type": cancer_type or "unknown", "domain": domain,
            }
        values = {
            "id": example_id, "dataset": DATASET, "split": split, "domain": domain,
            "patient_id": patient_id, "context_id": context_id, "question": question,
            "answer": answer, "question_type": question_type,
            "cancer_type": cancer_type or "unknown",
            "meta": json.dumps(meta, ensure_ascii=False),
        }
        for name, value in values.items():
            self.examples[name].append(value)


def load(input_dir: str | Path, compat: str | None = None) -> tuple[pa.Table, pa.Table, dict]:
    """Validate and normalise a MedQARo release; returns (examples, contexts, manifest)."""
    files = find_split_files(Path(input_dir))
    builder = _Builder(compat)
    for split, path in files.items():
        builder.add_file(split, path)
    examples = pa.table(builder.examples, schema=GENERATIVE_SCHEMA)
    contexts = pa.Table.from_pylist(list(builder.contexts.values()), schema=CONTEXT_SCHEMA)
    manifest = {
        "dataset": DATASET,
        "kind": "generative",
        "compat": compat,
        "files": {split: str(path) for split, path in files.items()},
    }
    return examples, contexts, manifest
