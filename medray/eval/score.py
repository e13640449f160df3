"""`medray score`: load predictions + references, validate, aggregate with CIs and breakdowns.

Predictions: JSONL (or Parquet) with at least ``id`` and ``prediction``. References: JSONL
(or Parquet) with ``id`` and ``answer`` (a string, or a list for several references; an
``answers`` list also works), or a prepared dataset directory (``--data``), whose examples
table supplies answers, patients (for the cluster bootstrap) and breakdown fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

MCQ_DERIVED = ("has_image", "text_only")
DERIVED = ("gold_letter", "modality", "country", "year")


class ScoreInputError(ValueError):
    """Bad predictions/references: names the file and the line (1-based) or id."""

    def __init__(self, file: str | Path, message: str, line: int | None = None,
                 id: str | None = None) -> None:
        where = [str(file)]
        if line is not None:
            where.append(f"line {line}")
        if id is not None:
            where.append(f"id {id!r}")
        super().__init__(f"{', '.join(where)}: {message}")


def read_records(path: str | Path) -> list[tuple[int, dict]]:
    """(line, record) pairs from JSONL or Parquet (line = 1-based row for Parquet)."""
    path = Path(path)
    if not path.is_file():
        raise ScoreInputError(path, "file not found")
    if path.suffix == ".parquet":
        df = pd.read_parquet(path)
        return [(i + 1, rec) for i, rec in enumerate(df.to_dict("records"))]
    out = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise ScoreInputError(path, f"not valid JSON ({err.msg})", line=line_no) from None
            if not isinstance(rec, dict):
                raise ScoreInputError(path, "expected a JSON object", line=line_no)
            out.append((line_no, rec))
    return out


def load_predictions(path: str | Path) -> pd.DataFrame:
    """id + prediction (+ conforming when given); rejects empty files, missing fields, dupes."""
    records = read_records(path)
    if not records:
        raise ScoreInputError(path, "no predictions (empty file)")
    seen: dict[str, int] = {}
    rows = []
    for line, rec in records:
        if rec.get("id") is None:
            raise ScoreInputError(path, "missing field 'id'", line=line)
        rid = str(rec["id"])
        if "prediction" not in rec:
            raise ScoreInputError(path, "missing field 'prediction'", line=line, id=rid)
        if rid in seen:
            raise ScoreInputError(path, f"duplicate id (first on line {seen[rid]})",
                                  line=line, id=rid)
        seen[rid] = line
        pred = rec["prediction"]
        if isinstance(pred, list | tuple):
            pred = "".join(map(str, pred))
        row = {"id": rid, "prediction": "" if pred is None else str(pred), "line": line}
        if "conforming" in rec and rec["conforming"] is not None:
            row["conforming"] = bool(rec["conforming"])
        rows.append(row)
    return pd.DataFrame(rows)


def load_references(path: str | Path) -> pd.DataFrame:
    """id + answers (list[str]) + any other columns (patient_id, question_type, ...)."""
    records = read_records(path)
    if not records:
        raise ScoreInputError(path, "no references (empty file)")
    rows, seen = [], set()
    for line, rec in records:
        if rec.get("id") is None:
            raise ScoreInputError(path, "missing field 'id'", line=line)
        rid = str(rec["id"])
        if rid in seen:
            raise ScoreInputError(path, "duplicate id", line=line, id=rid)
        seen.add(rid)
        ans = rec.get("answers", rec.get("answer"))
        if ans is None:
            raise ScoreInputError(path, "missing field 'answer'", line=line, id=rid)
        if "kind" in rec and "options" in rec:  # multiple choice: letters, option labels
            row = dict(rec, id=rid, answer=sorted("".join(map(str, ans)) if isinstance(
                ans, list | tuple) else str(ans)))
            row["option_labels"] = [str(o["label"]) if isinstance(o, dict) else "ABCDE"[j]
                                    for j, o in enumerate(rec["options"])]
            rows.append(row)
            continue
        answers = [str(a) for a in ans] if isinstance(ans, list | tuple) else [str(ans)]
        if not answers:
            raise ScoreInputError(path, "empty answer list", line=line, id=rid)
        row = {k: v for k, v in rec.items() if k not in ("answer", "answers")}
        row.update(id=rid, answers=answers)
        rows.append(row)
    return pd.DataFrame(rows)


def references_from_prepared(data_dir: str | Path) -> tuple[pd.DataFrame, dict]:
    from medray.data.prepared import load_prepared

    data = load_prepared(data_dir)
    ex = data.examples.copy()
    if data.kind == "generative":
        ex["answers"] = [[a] for a in ex["answer"]]
    else:
        ex["answer"] = [sorted(str(x) for x in a) for a in ex["answer"]]
        ex["option_labels"] = [[str(o["label"]) for o in opts] for opts in ex["options"]]
        ex["has_image"] = [len(i) > 0 if i is not None else False for i in ex["images"]]
        ex["text_only"] = ~ex["has_image"]
    return ex, data.manifest


def _meta(table: pd.DataFrame) -> list[dict]:
    return [json.loads(m) if isinstance(m, str) and m else (m if isinstance(m, dict) else {})
            for m in table.get("meta", pd.Series([{}] * len(table)))]


def _derived(table: pd.DataFrame, field: str, metas: list[dict]) -> list[str] | None:
    """Breakdown fields computed from an item rather than stored with it."""
    if field == "gold_letter" and "option_labels" in table:  # the positional check
        return ["".join(sorted(map(str, a))) for a in table["answer"]]
    if field == "modality" and "images" in table:
        return ["with_images" if imgs is not None and len(imgs) else "text_only"
                for imgs in table["images"]]
    if field == "country":  # EuropeMedQA: the id's country prefix (IT0001 -> IT)
        return [str(m.get("country") or re.match(r"[A-Za-z]*", str(i)).group(0).upper()
                    or "unknown") for m, i in zip(metas, table["id"], strict=True)]
    if field == "year" and any("test_year" in m for m in metas):
        return [str(m.get("test_year", "unknown")) for m in metas]
    return None


def add_meta_fields(table: pd.DataFrame, fields: Sequence[str], source: str) -> pd.DataFrame:
    """Resolve each ``--by`` field from a column, the ``meta`` JSON or the item itself
    (``gold_letter``, ``modality``, ``country``, ``year``: see `_derived`)."""
    missing = [f for f in fields if f not in table.columns]
    if not missing:
        return table
    metas = _meta(table)
    for f in missing:
        derived = _derived(table, f, metas)
        if derived is not None:
            table[f] = derived
            continue
        if not any(f in m for m in metas):
            cols = sorted(c for c in table.columns if c not in ("answers", "meta"))
            keys = sorted({k for m in metas for k in m})
            raise ScoreInputError(source, f"unknown --by field {f!r}; columns: {cols}, "
                                          f"meta keys: {keys}, derived: {list(DERIVED)}")
        table[f] = [str(m.get(f, "unknown")) for m in metas]
    return table


def align(preds: pd.DataFrame, refs: pd.DataFrame, pred_path: str | Path,
          restrict_splits: Sequence[str] | None = None) -> pd.DataFrame:
    """Inner join that fails loudly: every reference needs a prediction and vice versa.

    With a prepared directory the references cover all splits; they are restricted to
    ``restrict_splits`` (default: the splits the predicted ids belong to).
    """
    ref_ids = set(refs["id"])
    pred_ids = preds["id"].tolist()
    for i, pid in enumerate(pred_ids):
        if pid not in ref_ids:
            raise ScoreInputError(pred_path, "id not in the references", id=pid,
                                  line=None if "line" not in preds else int(preds["line"][i]))
    if "split" in refs.columns:
        splits = restrict_splits or sorted(set(refs.set_index("id").loc[pred_ids, "split"]))
        refs = refs[refs["split"].isin(splits)]
    missing = sorted(set(refs["id"]) - set(pred_ids))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ScoreInputError(pred_path, f"no prediction for reference id {missing[0]!r}{more}")
    pred_cols = [c for c in ("id", "prediction", "conforming") if c in preds]
    merged = refs.merge(preds[pred_cols], on="id", how="inner", validate="one_to_one")
    if restrict_splits and len(merged) != len(preds):
        extra = sorted(set(pred_ids) - set(merged["id"]))
        raise ScoreInputError(pred_path, "id outside the selected split(s)", id=extra[0])
    return merged.reset_index(drop=True)


def scoring_table(predictions: str | Path, references: str | Path | None = None,
                  data: str | Path | None = None, splits: Sequence[str] | None = None,
                  ) -> tuple[pd.DataFrame, dict, str]:
    """(predictions aligned with their references, the prepared manifest, the source)."""
    if (references is None) == (data is None):
        raise ValueError("give exactly one of --references or --data")
    preds = load_predictions(predictions)
    manifest: dict = {}
    if data is not None:
        refs, manifest = references_from_prepared(data)
        source = str(data)
    else:
        refs, source = load_references(references), str(references)
    return align(preds, refs, predictions, splits), manifest, source


def run_score(
    predictions: str | Path,
    references: str | Path | None = None,
    data: str | Path | None = None,
    mode: str = "medqaro",
    by: Sequence[str] = (),
    splits: Sequence[str] | None = None,
    fold_diacritics: bool = False,
    group_mapping: str | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    workers: int | None = None,
    use_wordnet: bool = True,
) -> dict:
    from medray.eval.metrics.aggregate import score_generative, score_mcq

    table, manifest, source = scoring_table(predictions, references, data, splits)
    table = add_meta_fields(table, by, source)
    is_mcq = manifest.get("kind") == "mcq" or "option_labels" in table.columns
    if is_mcq:
        result = score_mcq(table, by, group_mapping, n_resamples, seed)
    else:
        result = score_generative(table, mode, by, fold_diacritics, use_wordnet,
                                  n_resamples, seed, workers)
    result["splits"] = sorted(table["split"].astype(str).unique()) if "split" in table else None
    result["dataset"] = manifest.get("dataset") or (
        str(table["dataset"].iloc[0]) if "dataset" in table else None)
    result["compat"] = manifest.get("compat")
    result["predictions"] = str(predictions)
    result["references"] = source
    return result
