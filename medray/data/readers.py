"""Reading raw files: every failure is a DataError (file, data row, field), never a traceback.

- Encoding: UTF-8 with or without a BOM by default; a byte that does not decode is reported
  with its byte offset and the `--encoding` option (exports from Romanian or Italian
  spreadsheets are often Windows-1250/1252 or Latin-2).
- CSV: streamed record by record (the standard `csv` module), so a parse error names the
  data row (1-based, header excluded; a quoted field may span lines) and memory stays flat.
- JSON: one document (a list of objects) or JSON lines, told apart, errors with real lines.
"""

from __future__ import annotations

import codecs
import csv
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

from medray.data.schema import DataError

DEFAULT_ENCODING = "utf-8"
# Strings that are a spreadsheet's way of writing "no value", never real text.
NULL_STRINGS = frozenset({"nan", "none", "null"})
_BLOCK = 16 * 1024 * 1024
_OTHER_DELIMITERS = (";", "\t", "|")
csv.field_size_limit(2**31 - 1)  # epicrises are long; the default limit is 128 KiB


def is_null_string(value: object) -> bool:
    return isinstance(value, str) and value.strip().lower() in NULL_STRINGS


def _codec(path: Path, encoding: str | None) -> str:
    name = encoding or DEFAULT_ENCODING
    try:
        info = codecs.lookup(name)
    except LookupError:
        raise DataError(str(path), None, None, f"unknown encoding {name!r} "
                        "(--encoding takes a Python codec name, e.g. cp1250)") from None
    if info.name == "utf-8":
        with path.open("rb") as f:
            if f.read(3) == codecs.BOM_UTF8:
                return "utf-8-sig"
    return info.name


def _decode_error(path: Path, codec: str, offset: int, reason: str) -> DataError:
    return DataError(str(path), None, None, f"cannot be read as {codec} (byte offset {offset}: "
                     f"{reason}); pass the file's encoding, e.g. --encoding cp1250 or "
                     "--encoding latin-1")


def check_encoding(path: Path, encoding: str | None = None) -> str:
    """The codec to read `path` with, after checking that the whole file decodes."""
    codec = _codec(path, encoding)
    decoder = codecs.getincrementaldecoder(codec)(errors="strict")
    offset = 0
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(block)
            except UnicodeDecodeError as err:
                raise _decode_error(path, codec, offset - pending + err.start,
                                    err.reason) from None
            offset += len(block)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as err:
            raise _decode_error(path, codec, offset - len(decoder.getstate()[0]) + err.start,
                                "truncated character at the end") from None
    return codec


def read_text(path: Path, encoding: str | None = None) -> str:
    codec = _codec(path, encoding)
    data = path.read_bytes()
    try:
        return data.decode(codec)
    except UnicodeDecodeError as err:
        raise _decode_error(path, codec, err.start, err.reason) from None


def _not_empty(path: Path) -> None:
    if path.stat().st_size == 0:
        raise DataError(str(path), None, None, "the file is empty (0 bytes)")


def csv_header_and_rows(path: Path, encoding: str | None = None
                        ) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    """The header and an iterator of (data row, values); ragged rows and bad quoting raise
    DataError naming the data row. Blank lines are skipped and not counted."""
    _not_empty(path)
    codec = check_encoding(path, encoding)
    f = path.open(encoding=codec, newline="")
    reader = csv.reader(f, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        f.close()
        raise DataError(str(path), None, None, "the file has no header line") from None
    except csv.Error as err:
        f.close()
        raise DataError(str(path), None, None, f"cannot parse the header: {err}") from None
    if len(header) == 1:
        hint = next((d for d in _OTHER_DELIMITERS if d in header[0]), None)
        if hint:
            f.close()
            raise DataError(str(path), None, None, f"the header is one column; the delimiter "
                            f"looks like {hint!r}, medray reads comma-separated files "
                            "(re-export as CSV with commas)")

    def rows() -> Iterator[tuple[int, list[str]]]:
        row = 0
        with f:
            while True:
                try:
                    values = next(reader)
                except StopIteration:
                    return
                except csv.Error as err:
                    raise DataError(str(path), row + 1, None, f"CSV parse error ({err}); an "
                                    "unterminated quote swallows the rest of the file") from None
                if not values:
                    continue
                row += 1
                if len(values) != len(header):
                    raise DataError(str(path), row, None, f"{len(values)} fields but the "
                                    f"header has {len(header)} (a ragged row; an unquoted "
                                    "comma?)")
                yield row, values

    return header, rows()


def csv_records(path: Path, encoding: str | None = None) -> Iterator[tuple[int, dict[str, str]]]:
    header, rows = csv_header_and_rows(path, encoding)
    for row, values in rows:
        yield row, dict(zip(header, values, strict=True))


def json_records(path: Path, encoding: str | None = None) -> list[tuple[int, object]]:
    """(row, entry) pairs of a JSON list, a {"data": [...]} export or JSON lines (row = line).

    A BOM is accepted; the form is told from the content, not the suffix."""
    _not_empty(path)
    text = read_text(path, encoding).lstrip("\ufeff")
    stripped = text.lstrip()
    if not stripped:
        raise DataError(str(path), None, None, "the file holds only whitespace")
    if stripped[0] == "[" or path.suffix.lower() != ".jsonl":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            if stripped[0] == "{" and err.msg == "Extra data":
                return _json_lines(path, text)  # one object per line in a .json file
            raise DataError(str(path), err.lineno, None, f"invalid JSON at line {err.lineno}, "
                            f"column {err.colno}: {err.msg}") from None
        if isinstance(data, dict):  # {"data": [...]} style exports
            data = next((v for v in data.values() if isinstance(v, list)), None)
        if not isinstance(data, list):
            raise DataError(str(path), None, None, "expected a JSON list of question objects "
                            "(or JSON lines)")
        return list(enumerate(data, start=1))
    return _json_lines(path, text)


def _json_lines(path: Path, text: str) -> list[tuple[int, object]]:
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((number, json.loads(line)))
        except json.JSONDecodeError as err:
            raise DataError(str(path), number, None, f"invalid JSON lines: line {number}, "
                            f"column {err.colno}: {err.msg}") from None
    return out


def xlsx_records(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    import pandas as pd

    _not_empty(path)
    if not zipfile.is_zipfile(path):
        raise DataError(str(path), None, None, "not an XLSX workbook (an .xlsx file is a zip "
                        "archive; is it a CSV or an old .xls renamed?)")
    try:
        frame = pd.read_excel(path, dtype=str, keep_default_na=False)
    except Exception as err:  # openpyxl raises many types for a damaged workbook
        raise DataError(str(path), None, None, f"cannot read the XLSX workbook: {err}") from None
    columns = [str(c) for c in frame.columns]
    for row, values in enumerate(frame.itertuples(index=False), start=1):
        yield row, dict(zip(columns, (str(v) for v in values), strict=True))


def parquet_records(path: Path) -> tuple[list[str], Iterator[tuple[int, dict]]]:
    """The column names and an iterator of (data row, record) of a Parquet file, read one
    record batch at a time (1-based rows across the file's row groups)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    _not_empty(path)
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise DataError(str(path), None, None, f"not a Parquet file ({err})") from None
    columns = list(parquet.schema_arrow.names)

    def records() -> Iterator[tuple[int, dict]]:
        row = 0
        try:
            for batch in parquet.iter_batches(batch_size=256):
                for record in batch.to_pylist():
                    row += 1
                    yield row, record
        except (pa.ArrowException, OSError) as err:
            raise DataError(str(path), row + 1, None, f"cannot read the Parquet data "
                            f"({err})") from None

    return columns, records()
