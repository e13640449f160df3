"""EuropeMedQA loader: the protocol's table (CSV/XLSX), the public JSON form, or the
published Parquet form (either form's columns, images embedded as Hugging Face `Image`s).

Pre-processing per the protocol: items without a validated key are removed (counted and
reported); each item's options are permuted with seed 42 and the key updated, so that
the key positions are about uniform; ids are unified and the original id is kept.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import pyarrow as pa

from medray.data.images import ImageError, check_image_bytes, confined_image, image_name
from medray.data.readers import csv_header_and_rows, json_records, parquet_records, xlsx_records
from medray.data.schema import LETTERS, MCQ_SCHEMA, DataError
from medray.text import normalize

DATASET = "europemedqa"
SHUFFLE_SEED = 42
COUNTRIES = {"IT": ("it", "SSM"), "FR": ("fr", "ECN"), "ES": ("es", "MIR"), "PT": ("pt", "PNA")}
TABLE_REQUIRED = ("questionID", "question_text", "option_a", "option_b", "correct_option")
JSON_REQUIRED = ("id", "question", "options")
OPTION_COLUMNS = tuple(f"option_{c}" for c in "abcde")
# Parquet columns holding images (Hugging Face `Image`: {bytes, path}, one or a list).
IMAGE_COLUMNS = ("image", "images", "picture")
IMAGES_DIR = "images"  # where a prepared folder keeps the images a Parquet input embeds
NO_VALUE = {"", "n/a", "na", "none", "nan", "null", "-"}
# Letters (any, so that 'F' on five options is the same error as 'E' on four), separated
# or run together ("A,C", "AC").
_LETTER_KEY = re.compile(r"^[A-Z](\s*[,;/ ]?\s*[A-Z])*$")
# Countries whose exam admits several correct options (France's ECN).
MULTI_ANSWER_COUNTRIES = frozenset({"FR"})


def _blank(value: object) -> bool:
    return value is None or str(value).strip().lower() in NO_VALUE


def permutation(item_id: str, n_options: int, seed: int = SHUFFLE_SEED) -> list[int]:
    """The item's option order after shuffling: keyed by (seed, id), so the same id gets
    the same permutation on every run, machine and subset, whatever the row order."""
    digest = hashlib.sha256(f"{seed}:{item_id}".encode()).digest()
    order = list(range(n_options))
    random.Random(int.from_bytes(digest[:8], "big")).shuffle(order)
    return order


def _country(item_id: str) -> str:
    return item_id[:2].upper()


class _Item:
    """One parsed item before shuffling; `key` is None when the item has no validated key."""

    def __init__(self, file: str, row: int, original_id: str, question: str,
                 options: list[str], key: list[str] | None, images: list[str],
                 language: str | None, meta: dict) -> None:
        self.file, self.row, self.original_id = file, row, original_id
        self.question, self.options, self.key, self.images = question, options, key, images
        self.language, self.meta = language, meta
        self.image_root: str | None = None  # None: the input folder


def _parse_key(file: str, row: int, original_id: str, raw: object, fulltext: object,
               options: list[str]) -> list[str] | None:
    if _blank(raw):
        return None
    text = str(raw).strip()
    if re.fullmatch(r"[a-zA-Z]([\s,;/]+[a-zA-Z])*", text):  # "a", "a, c": single letters
        text = text.upper()
    labels = LETTERS[: len(options)]
    if _LETTER_KEY.match(text):  # a letter key wins over an option that reads like one
        letters = sorted(set(re.findall(r"[A-Z]", text)))
        bad = [c for c in letters if c not in labels]
        if bad:
            raise DataError(file, row, "correct_option", f"item {original_id}: answer key "
                            f"{text!r} is not among the options ({', '.join(labels)})")
        if len(letters) > 1 and _country(original_id) not in MULTI_ANSWER_COUNTRIES:
            raise DataError(file, row, "correct_option", f"item {original_id}: {text!r} has "
                            f"several letters; only {', '.join(sorted(MULTI_ANSWER_COUNTRIES))}"
                            " items may have more than one correct option")
        return letters
    # The protocol's table may carry the correct option's full text instead of a letter.
    for candidate in (text, fulltext):
        if not _blank(candidate):
            norm = normalize(str(candidate)).casefold()
            hits = [labels[i] for i, o in enumerate(options) if normalize(o).casefold() == norm]
            if len(hits) > 1 and _country(original_id) not in MULTI_ANSWER_COUNTRIES:
                raise DataError(file, row, "correct_fulltext", f"item {original_id}: the key "
                                "text matches several options (duplicate option texts?)")
            if hits:
                return hits
    return None


def _resolve_images(file: str, row: int, original_id: str, links: list[str], base: Path,
                    root: Path, field: str = "picture_link") -> list[str]:
    paths = []
    for link in links:
        if not isinstance(link, str) or not link.strip():
            raise DataError(file, row, field, f"item {original_id}: image path {link!r} is "
                            "not a non-empty string")
        try:
            paths.append(str(confined_image(link, root, base)))
        except ImageError as err:
            raise DataError(file, row, field, f"item {original_id}: {err}") from None
    return paths


def _read_table(path: Path, root: Path, encoding: str | None) -> list[_Item]:
    if path.suffix.lower() in (".xlsx", ".xls"):
        records = xlsx_records(path)
        columns = None
    else:
        header, rows = csv_header_and_rows(path, encoding)
        columns = header
        records = ((row, dict(zip(header, values, strict=True))) for row, values in rows)
    items = []
    for row, record in records:
        if columns is None:
            columns = list(record)
        items.append(_table_item(path, row, record, columns, root))
    if columns is not None and not items:
        _require(path, columns, TABLE_REQUIRED)
    return items


def _require(path: Path, columns: list[str], required: tuple[str, ...]) -> None:
    missing = [c for c in required if c not in columns]
    if missing:
        raise DataError(str(path), None, missing[0], "required column is missing")


def _table_item(path: Path, row: int, record: dict, columns: list[str], root: Path,
                n_embedded: int = 0) -> _Item:
    """One row of the protocol's table (`n_embedded`: images a Parquet row embeds)."""
    _require(path, columns, TABLE_REQUIRED)
    original_id = str(record["questionID"]).strip()
    for field in ("questionID", "question_text"):
        if _blank(record[field]):
            raise DataError(str(path), row, field, "missing or empty")
    options = [str(record[c]) for c in OPTION_COLUMNS if c in record and not _blank(record[c])]
    if len(options) < 2:
        raise DataError(str(path), row, "option_b", f"item {original_id}: fewer than 2 options")
    key = _parse_key(str(path), row, original_id, record["correct_option"],
                     record.get("correct_fulltext"), options)
    links = [] if _blank(record.get("picture_link")) else [
        p.strip() for p in str(record["picture_link"]).split(";") if p.strip()]
    if str(record.get("picture_provided", "")).strip().lower() in ("yes", "si", "sì", "oui",
                                                                   "sim", "true", "1"):
        if not links and not n_embedded:
            raise DataError(str(path), row, "picture_link",
                            f"item {original_id}: picture_provided is yes but no link")
    images = _resolve_images(str(path), row, original_id, links, path.parent, root)
    meta = {"test_year": record.get("testyear") or None,
            "number_in_test": record.get("numberintest") or None}
    return _Item(str(path), row, original_id, record["question_text"], options, key,
                 images, record.get("language") or None, meta)


def _json_options(path: Path, row: int, original_id: str, raw: object) -> list[str]:
    if not isinstance(raw, list) or len(raw) > len(LETTERS):
        raise DataError(str(path), row, "options", f"item {original_id}: expected a list of "
                        f"at most {len(LETTERS)} options")
    options = []
    for i, option in enumerate(raw, start=1):
        text = option.get("text") if isinstance(option, dict) else None
        if isinstance(text, int | float) and not isinstance(text, bool):
            text = str(text)  # numeric answers ("6", "12") are written as JSON numbers
        if not isinstance(text, str) or _blank(text):
            raise DataError(str(path), row, "options", f"item {original_id}: option {i} has "
                            "no 'text'")
        options.append(text)
    return options


def _read_json(path: Path, root: Path, encoding: str | None) -> list[_Item]:
    return [_json_item(path, row, record, root) for row, record in json_records(path, encoding)]


def _json_item(path: Path, row: int, record: object, root: Path, n_embedded: int = 0) -> _Item:
    """One object of the public JSON form (`n_embedded`: images a Parquet row embeds)."""
    if not isinstance(record, dict):
        raise DataError(str(path), row, None, "expected a JSON object, got "
                        f"{type(record).__name__}")
    for field in ("id", "question", "options"):
        value = record.get(field)
        if not value or (isinstance(value, str) and _blank(value)):
            raise DataError(str(path), row, field, "missing or empty")
    original_id = str(record["id"]).strip()
    options = _json_options(path, row, original_id, record["options"])
    letters = [str(o.get("letter", LETTERS[i])).upper() for i, o in
               enumerate(record["options"])]
    if letters != list(LETTERS[: len(options)]):
        raise DataError(str(path), row, "options", f"item {original_id}: option letters "
                        f"{letters} are not A, B, C, ... in order")
    metadata = record.get("metadata") or {}
    answer = record.get("correct_answer") or {}
    for field, value in (("metadata", metadata), ("correct_answer", answer)):
        if not isinstance(value, dict):
            raise DataError(str(path), row, field, f"item {original_id}: expected an object")
    key = None if metadata.get("nullified") else _parse_key(
        str(path), row, original_id, answer.get("letter"), None, options)
    links = record.get("images") or record.get("image_paths") or []
    if record.get("has_image") and not links and not n_embedded:
        raise DataError(str(path), row, "has_image",
                        f"item {original_id}: has_image is true but no image path is given")
    if not isinstance(links, list):
        raise DataError(str(path), row, "images", f"item {original_id}: expected a list "
                        "of image paths")
    images = _resolve_images(str(path), row, original_id, links, path.parent, root, "images")
    meta = {"test_year": metadata.get("test_year"),
            "number_in_test": metadata.get("number_in_test"),
            "specialty": record.get("specialty")}
    return _Item(str(path), row, original_id, record["question"], options, key,
                 images, record.get("language"), meta)


def _read_parquet(path: Path, root: Path, image_dir: Path | None,
                  blobs: dict[str, bytes]) -> list[_Item]:
    """Either form's columns; every image (embedded bytes, or a link inside the input
    folder) is checked by its bytes and goes to `image_dir`/images (the prepared folder)."""
    columns, records = parquet_records(path)
    table_form = "questionID" in columns
    if not table_form and not any(c in columns for c in JSON_REQUIRED):
        raise DataError(str(path), None, "questionID", "required column is missing (a "
                        "Parquet table has the protocol table's columns: questionID, "
                        "question_text, option_a, ...; or the JSON form's: id, question, "
                        "options, ...)")
    _require(path, columns, TABLE_REQUIRED if table_form else JSON_REQUIRED)
    if image_dir is None:
        raise ValueError("a Parquet input needs image_dir (the prepared folder)")
    items = []
    for row, record in records:
        embedded = {c: record.pop(c) for c in IMAGE_COLUMNS if c in record}
        original_id = str(record.get("questionID" if table_form else "id")).strip()
        data = [(field, blob) for field, value in embedded.items()
                for blob in _image_values(path, row, field, original_id, value, root)]
        item = (_table_item(path, row, record, columns, root, len(data)) if table_form
                else _json_item(path, row, record, root, len(data)))
        data += [("picture_link" if table_form else "image_paths", Path(p).read_bytes())
                 for p in item.images]
        images = []
        for field, blob in data:
            try:
                name = image_name(blob, check_image_bytes(blob))
            except ImageError as err:
                raise DataError(str(path), row, field, f"item {original_id}: {err}") from None
            blobs[name] = blob
            images.append(str(image_dir / IMAGES_DIR / name))
        item.images, item.image_root = images, str(image_dir)
        items.append(item)
    return items


def _image_values(path: Path, row: int, field: str, original_id: str, value: object,
                  root: Path) -> list[bytes]:
    """The bytes of one cell of an image column: a Hugging Face `Image` ({bytes, path}) or
    a list of them; a path without bytes (or a plain string) is a link, as in the JSON form."""
    values = value if isinstance(value, list) else [] if value is None else [value]
    out = []
    for i, one in enumerate(values, start=1):
        if isinstance(one, dict) and isinstance(one.get("bytes"), bytes):
            out.append(one["bytes"])
            continue
        link = one.get("path") if isinstance(one, dict) else one
        if not isinstance(link, str) or not link.strip():
            raise DataError(str(path), row, field, f"item {original_id}: image {i} has no "
                            "bytes and no path (expected a Hugging Face Image: {bytes, path})")
        real = _resolve_images(str(path), row, original_id, [link], path.parent, root, field)
        out.append(Path(real[0]).read_bytes())
    return out


def _files(root: Path) -> tuple[list[Path], list[Path]]:
    """(files read, entries ignored): every item is a test item, whatever the file name."""
    if root.is_file():
        return [root], []
    entries = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    files = [p for p in entries if p.is_file()
             and p.suffix.lower() in (".csv", ".xlsx", ".xls", ".json", ".jsonl", ".parquet")]
    if not files:
        raise DataError(str(root), None, None,
                        "no EuropeMedQA .csv/.xlsx/.json/.parquet file found")
    return files, [p for p in entries if p not in files]


def load(input_path: str | Path, shuffle: bool = True, seed: int = SHUFFLE_SEED,
         encoding: str | None = None, image_dir: str | Path | None = None
         ) -> tuple[pa.Table, dict, dict[str, bytes]]:
    """(examples, manifest, embedded images): the last maps a file name under
    `image_dir`/images to its bytes, for the images a Parquet input embeds (the caller
    writes them; the examples already point there)."""
    rows, removed, seen = [], [], {}
    blobs: dict[str, bytes] = {}
    root = Path(input_path).resolve()
    root = root if root.is_dir() else root.parent
    files, ignored = _files(Path(input_path))
    image_out = None if image_dir is None else Path(image_dir).resolve()
    for path in files:
        suffix = path.suffix.lower()
        parsed = (_read_json(path, root, encoding) if suffix in (".json", ".jsonl")
                  else _read_parquet(path, root, image_out, blobs) if suffix == ".parquet"
                  else _read_table(path, root, encoding))
        for item in parsed:
            unified = normalize(item.original_id).upper().replace(" ", "")
            if unified in seen:
                raise DataError(item.file, item.row, "questionID", f"duplicate id {unified!r} "
                                f"(first at {seen[unified][0]}, row {seen[unified][1]})")
            seen[unified] = (item.file, item.row)
            if item.key is None:
                removed.append(unified)
                continue
            rows.append(_to_row(item, unified, shuffle, seed, root))
    if not rows:
        raise DataError(str(input_path), None, "correct_option", "no item has a validated key")
    manifest = {
        "dataset": DATASET, "kind": "mcq", "compat": None,
        "shuffle": {"enabled": shuffle, "seed": seed,
                    "method": "per-item permutation seeded by sha256(f'{seed}:{id}')"},
        "removed": {"no_validated_key": len(removed), "ids": removed},
        "files": {str(p): "test" for p in files}, "ignored": [str(p) for p in ignored],
        "image_root": str(root),
    }
    if blobs:
        manifest["embedded_images"] = {"folder": IMAGES_DIR, "n": len(blobs)}
    return pa.Table.from_pylist(rows, schema=MCQ_SCHEMA), manifest, blobs


def _to_row(item: _Item, unified: str, shuffle: bool, seed: int, root: Path) -> dict:
    n = len(item.options)
    order = permutation(unified, n, seed) if shuffle else list(range(n))
    labels = LETTERS[:n]
    new_label = {labels[old]: labels[new] for new, old in enumerate(order)}
    country = _country(unified)
    language, source = COUNTRIES.get(country, ("und", "unknown"))
    # France's ECN admits several correct options: its items are all-correct "multiple".
    kind = "multiple" if country == "FR" or len(item.key) > 1 else "single"
    meta = {**item.meta, "original_id": item.original_id, "original_answer": item.key,
            "permutation": [labels[old] for old in order], "has_image": bool(item.images),
            "country": country, "image_root": item.image_root or str(root)}
    return {
        "id": unified, "dataset": DATASET, "split": "test",
        "language": item.language or language, "source": source,
        "question": normalize(item.question),
        "options": [{"label": labels[new], "text": normalize(item.options[old])}
                    for new, old in enumerate(order)],
        "answer": sorted(new_label[k] for k in item.key),
        "kind": kind, "images": item.images, "meta": json.dumps(meta, ensure_ascii=False),
    }
