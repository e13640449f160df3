"""RoBiologyDataChoiceQA loader: the dataset card's JSON files -> unified multiple choice.

Kinds: single-choice (one letter), group-choice (statements 1-4; the answer letter names
a set of true statements, see schema.GROUP_CODES), multiple-choice (sorted letter set).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa

from medray.data.readers import is_null_string, json_records
from medray.data.schema import GROUP_CODES, LETTERS, MCQ_SCHEMA, DataError
from medray.text import normalize

DATASET = "robiology"
KINDS = {"single-choice": "single", "group-choice": "group", "multiple-choice": "multiple"}
SPLIT_NAMES = {"train": "train", "validation": "val", "valid": "val", "val": "val",
               "dev": "val", "test": "test"}
REQUIRED = ("question", "type", "options", "right_answer")
# Training needs train; evaluation needs test (validation is optional).
REQUIRED_SPLITS = ("train", "test")
META_FIELDS = ("question_number", "grade", "stage", "year", "source", "id_in_source", "dupe_id")
# The card's recommended unique key for an item.
KEY_FIELDS = ("year", "source", "id_in_source", "grade", "stage", "question_number")


def _split_of(path: Path) -> str:
    stem = path.name.split(".")[0].lower()
    for token in (stem, *stem.replace("-", "_").split("_")):
        if token in SPLIT_NAMES:
            return SPLIT_NAMES[token]
    raise DataError(str(path), None, None, "cannot tell the split from the file name "
                    f"(expected one of {', '.join(sorted(SPLIT_NAMES))})")


def _parse_item(path: Path, row: int, item: dict, split: str) -> dict:
    if not isinstance(item, dict):
        raise DataError(str(path), row, None, f"expected a JSON object, got {type(item).__name__}")
    for field in REQUIRED:
        value = item.get(field)
        if value is None or (isinstance(value, str | list) and len(value) == 0):
            raise DataError(str(path), row, field, "missing or empty")
        if is_null_string(value):
            raise DataError(str(path), row, field, f"{value.strip()!r} is a missing-value "
                            "marker, not text")
    kind = KINDS.get(str(item["type"]).strip())
    if kind is None:
        raise DataError(str(path), row, "type", f"{item['type']!r} is not one of "
                        f"{', '.join(KINDS)}")
    raw_options = item["options"]
    if not isinstance(raw_options, list) or not all(isinstance(o, str) and o.strip()
                                                     and not is_null_string(o)
                                                     for o in raw_options):
        raise DataError(str(path), row, "options", "expected a list of non-empty strings")
    if kind == "group":
        if len(raw_options) != 4:
            raise DataError(str(path), row, "options",
                            f"group choice needs 4 numbered statements, got {len(raw_options)}")
        labels = ["1", "2", "3", "4"]
        valid_keys = set(GROUP_CODES)
    else:
        if len(raw_options) > len(LETTERS):
            raise DataError(str(path), row, "options", f"{len(raw_options)} options; at most 5")
        labels = list(LETTERS[: len(raw_options)])
        valid_keys = set(labels)
    key = str(item["right_answer"]).strip().upper()
    letters = list(key)
    if kind != "multiple" and len(letters) != 1:
        raise DataError(str(path), row, "right_answer",
                        f"{key!r}: a {kind}-choice item takes exactly one letter")
    bad = [c for c in letters if c not in valid_keys]
    if bad or len(set(letters)) != len(letters):
        raise DataError(str(path), row, "right_answer", f"answer key {key!r} is not among the "
                        f"options ({', '.join(sorted(valid_keys))})")
    meta = {f: (None if item.get(f) is None else str(item.get(f))) for f in META_FIELDS}
    unique = "|".join(str(item.get(f, "")) for f in KEY_FIELDS)
    return {
        "id": f"{split}:rb-{hashlib.sha1(unique.encode()).hexdigest()[:12]}",
        "dataset": DATASET,
        "split": split,
        "language": "ro",
        "source": str(item.get("source") or "unknown"),
        "question": normalize(item["question"]),
        "options": [{"label": lab, "text": normalize(t)} for lab, t in zip(labels, raw_options,
                                                                              strict=True)],
        "answer": sorted(letters),
        "kind": kind,
        "images": [],
        "meta": json.dumps(meta, ensure_ascii=False),
    }


def load(input_dir: str | Path, encoding: str | None = None) -> tuple[pa.Table, dict]:
    root = Path(input_dir)
    if root.is_dir():
        entries = sorted(p for p in root.iterdir() if not p.name.startswith("."))
        files = [p for p in entries if p.is_file() and p.suffix.lower() in (".json", ".jsonl")]
        ignored = [p for p in entries if p not in files]
    else:
        files, ignored = [root], []
    if not files:
        raise DataError(str(root), None, None, "no RoBiology .json/.jsonl files found")
    rows: list[dict] = []
    first_seen: dict[str, tuple[str, int]] = {}
    dupe_home: dict[str, tuple[str, str, int]] = {}
    for path in files:
        split = _split_of(path)
        for row, item in json_records(path, encoding):
            parsed = _parse_item(path, row, item, split)
            if parsed["id"] in first_seen:
                other_file, other_row = first_seen[parsed["id"]]
                raise DataError(str(path), row, "id_in_source", "duplicate item id (same year, "
                                "source, id_in_source, grade, stage, question_number as "
                                f"{other_file}, row {other_row})")
            first_seen[parsed["id"]] = (str(path), row)
            dupe_id = item.get("dupe_id")
            if dupe_id:
                home = dupe_home.setdefault(dupe_id, (split, str(path), row))
                if home[0] != split:
                    raise DataError(str(path), row, "dupe_id", f"duplicate group {dupe_id} also "
                                    f"in split {home[0]!r} ({home[1]}, row {home[2]}); "
                                    "duplicates must not cross splits")
            rows.append(parsed)
    if not rows:
        raise DataError(str(root), None, None, "no items found")
    splits = {p: _split_of(p) for p in files}
    missing = [s for s in REQUIRED_SPLITS if s not in splits.values()]
    if missing and root.is_dir():
        raise DataError(str(root), None, None, f"required split {missing[0]!r} is missing "
                        f"(accepted file names: {', '.join(sorted(SPLIT_NAMES))} + .json/.jsonl)")
    manifest = {"dataset": DATASET, "kind": "mcq", "compat": None,
                "files": {str(p): s for p, s in splits.items()},
                "ignored": [str(p) for p in ignored]}
    return pa.Table.from_pylist(rows, schema=MCQ_SCHEMA), manifest
