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

import pyarrow as pa

from medray.data.readers import csv_header_and_rows, is_null_string
from medray.data.schema import CONTEXT_SCHEMA, GENERATIVE_SCHEMA, QUESTION_TYPES, DataError
from medray.text import normalize

DATASET = "medqaro"
REQUIRED = ("Epicriza", "Intrebare", "Raspuns")
# File names accepted per split (compared case-insensitively); one file per split.
SPLIT_FILES: dict[str, tuple[str, ...]] = {
    "train": ("train.csv",),
    "val": ("val.csv", "validation.csv", "dev.csv"),
    "test": ("test.csv",),
    "test_cross": ("test_cross.csv", "cross_test.csv", "test_cross_domain.csv"),
}
# Training needs train; evaluation needs test. val is optional (reported when absent).
REQUIRED_SPLITS = ("train", "test")
_SPLIT_WORDS = {"train", "training", "val", "valid", "validation", "dev", "test", "testing",
                "cross"}
PATIENT_ID_COLUMNS = ("patient_id", "pacient_id", "id_pacient")
BINARY_ANSWERS = {"da", "nu"}


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


def _accepted() -> str:
    return "; ".join(f"{split}: {', '.join(names)}" for split, names in SPLIT_FILES.items())


def find_split_files(input_dir: Path) -> tuple[dict[str, Path], list[Path]]:
    """(split -> file, ignored files). A CSV whose name looks like a split but is not an
    accepted name, or two files for one split, is an error naming the accepted names."""
    if input_dir.is_file():
        raise DataError(str(input_dir), None, None, "expected a directory holding train.csv, "
                        "val.csv, test.csv (and optionally test_cross.csv)")
    by_name = {n: split for split, names in SPLIT_FILES.items() for n in names}
    found: dict[str, Path] = {}
    ignored: list[Path] = []
    for path in sorted(p for p in input_dir.iterdir() if not p.name.startswith(".")):
        split = by_name.get(path.name.lower()) if path.is_file() else None
        if split is None:
            words = set(path.stem.lower().replace("-", "_").replace(".", "_").split("_"))
            if path.suffix.lower() == ".csv" and words & _SPLIT_WORDS:
                raise DataError(str(path), None, None, "looks like a split file but its name "
                                f"is not one medray accepts ({_accepted()}); rename it")
            ignored.append(path)
            continue
        if split in found:
            raise DataError(str(path), None, None, f"a second file for split {split!r} "
                            f"(also {found[split].name}); keep one")
        found[split] = path
    if not found:
        raise DataError(str(input_dir), None, None, f"no MedQARo split file found ({_accepted()})")
    return {s: found[s] for s in SPLIT_FILES if s in found}, ignored  # the release's order


def check_required_splits(input_dir: Path, found: dict[str, Path]) -> None:
    missing = [s for s in REQUIRED_SPLITS if s not in found]
    if missing:
        raise DataError(str(input_dir), None, None, f"required split {missing[0]!r} is missing "
                        f"(expected {', '.join(SPLIT_FILES[missing[0]])}; accepted: "
                        f"{_accepted()})")


class _Builder:
    """Accumulates examples and the deduplicated contexts across split files."""

    def __init__(self, compat: str | None, encoding: str | None = None) -> None:
        self.compat, self.encoding = compat, encoding
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
        """Stream the file record by record (the release's epicrises make it gigabytes):
        only the questions, answers and one copy of each epicrisis are kept."""
        header, rows = csv_header_and_rows(path, self.encoding)
        columns = header[1:]  # the first column is the index, as pd.read_csv(index_col=0)
        missing = [c for c in REQUIRED if c not in columns]
        if missing:
            raise DataError(str(path), None, missing[0], "required column is missing "
                            f"(expected {', '.join(REQUIRED)})")
        extra = [c for c in columns if c not in REQUIRED]
        n = 0
        for row, values in rows:
            self._add_row(split, path, row, values[0], dict(zip(columns, values[1:],
                                                                strict=True)), extra)
            n += 1
        if n == 0:
            raise DataError(str(path), None, None, "the file has no data rows")

    def _add_row(self, split: str, path: Path, row: int, index: str, record: dict[str, str],
                 extra: list[str]) -> None:
        for field in REQUIRED:
            if not record[field].strip():
                raise DataError(str(path), row, field, "empty value")
            if is_null_string(record[field]):
                raise DataError(str(path), row, field, f"{record[field].strip()!r} is a "
                                "missing-value marker, not text")
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


def load(input_dir: str | Path, compat: str | None = None, encoding: str | None = None
         ) -> tuple[pa.Table, pa.Table, dict]:
    """Validate and normalise a MedQARo release; returns (examples, contexts, manifest)."""
    files, ignored = find_split_files(Path(input_dir))
    builder = _Builder(compat, encoding)
    for split, path in files.items():
        builder.add_file(split, path)
    check_required_splits(Path(input_dir), files)
    examples = pa.table(builder.examples, schema=GENERATIVE_SCHEMA)
    contexts = pa.Table.from_pylist(list(builder.contexts.values()), schema=CONTEXT_SCHEMA)
    manifest = {
        "dataset": DATASET,
        "kind": "generative",
        "compat": compat,
        "files": {split: str(path) for split, path in files.items()},
        "ignored": [str(p) for p in ignored],
    }
    return examples, contexts, manifest
