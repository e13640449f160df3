"""The unified Arrow schemas, the integrity error type and the group-choice code table."""

from __future__ import annotations

import pyarrow as pa

GENERATIVE_SPLITS = ("train", "val", "test", "test_cross")
MCQ_SPLITS = ("train", "val", "test")
QUESTION_TYPES = ("binary", "extractive", "reasoning")
MCQ_KINDS = ("single", "group", "multiple")
LETTERS = "ABCDE"

# RoBiology group choice: the answer letter names a set of true numbered statements.
GROUP_CODES: dict[str, frozenset[int]] = {
    "A": frozenset({1, 2, 3}),
    "B": frozenset({1, 3}),
    "C": frozenset({2, 4}),
    "D": frozenset({4}),
    "E": frozenset({1, 2, 3, 4}),
}

GENERATIVE_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("dataset", pa.string()),
        ("split", pa.string()),
        ("domain", pa.string()),
        ("patient_id", pa.string()),
        ("context_id", pa.string()),
        ("question", pa.string()),
        ("answer", pa.string()),
        ("question_type", pa.string()),
        ("cancer_type", pa.string()),
        ("meta", pa.string()),
    ]
)

CONTEXT_SCHEMA = pa.schema(
    [
        ("context_id", pa.string()),
        ("patient_id", pa.string()),
        ("text", pa.string()),
        ("cancer_type", pa.string()),
        ("domain", pa.string()),
    ]
)

OPTION_TYPE = pa.struct([("label", pa.string()), ("text", pa.string())])

MCQ_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("dataset", pa.string()),
        ("split", pa.string()),
        ("language", pa.string()),
        ("source", pa.string()),
        ("question", pa.string()),
        ("options", pa.list_(OPTION_TYPE)),
        ("answer", pa.list_(pa.string())),
        ("kind", pa.string()),
        ("images", pa.list_(pa.string())),
        ("meta", pa.string()),
    ]
)


class DataError(ValueError):
    """Bad input data: names the file, the data row (1-based, header excluded) and the field."""

    def __init__(self, file: str, row: int | None, field: str | None, message: str) -> None:
        self.file, self.row, self.field, self.message = str(file), row, field, message
        where = [self.file]
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(f"{', '.join(where)}: {message}")
