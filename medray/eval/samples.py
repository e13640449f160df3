"""The per-item data of `medray report`'s samples.html: every item of the given runs with its
question (options, epicrisis), reference, and each run's answer and score side by side.

Scores are re-computed from what each run saved (predictions.jsonl and its references), per
item: multiple choice 1 for the exact set of letters (all-correct rule) among conforming
outputs, else 0 (a non-conforming output is wrong); generative runs the token F1 of the
report's metric mode, "right" where the answer is an exact match, "partial" where some
answer token overlaps the reference. Items are matched across runs by dataset and id.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

# Filter fields of the page, in this order, where the items have them.
FIELDS = ("dataset", "split", "question_type", "kind", "country", "language", "modality",
          "specialty")
MCQ_RULE = "1 = exact set of letters (all-correct rule), 0 = wrong or non-conforming"


def _gen_scores(predictions: Sequence[str], answers: Sequence[Sequence[str]], mode: str
                ) -> tuple[list[float], list[float]]:
    """Per-item (F1, EM) of a metric mode: the best over the references."""
    from medray.eval.metrics.generative import em_medqaro, em_robust, f1_medqaro, f1_robust

    f1s, ems = [], []
    for pred, refs in zip(predictions, answers, strict=True):
        refs = [str(r) for r in refs]
        if mode == "medqaro":
            f1s.append(max(f1_medqaro(pred, r) for r in refs))
            ems.append(max(em_medqaro(pred, r) for r in refs))
        else:
            f1s.append(f1_robust(pred, refs))
            ems.append(em_robust(pred, refs))
    return f1s, ems


def _contexts(config: dict, table: pd.DataFrame) -> dict[str, str]:
    """context_id -> text (MedQARo's epicrises) from the prepared data the run read."""
    if "context_id" not in table or not config.get("data"):
        return {}
    from medray.data.prepared import load_prepared

    try:
        data = load_prepared(config["data"])
    except (OSError, KeyError, ValueError):
        return {}
    if data.contexts is None:
        return {}
    wanted = set(table["context_id"].dropna().astype(str))
    ctx = data.contexts
    keep = ctx["context_id"].astype(str).isin(wanted)
    return dict(zip(ctx.loc[keep, "context_id"].astype(str), ctx.loc[keep, "text"].astype(str),
                    strict=True))


def _fields(table: pd.DataFrame, source: str) -> pd.DataFrame:
    from medray.eval.score import add_meta_fields

    metas = [json.loads(m) if isinstance(m, str) and m else (m if isinstance(m, dict) else {})
             for m in table.get("meta", pd.Series([{}] * len(table)))]
    # EuropeMedQA's country comes from the id (IT0001); elsewhere only a stored one counts
    emq = "dataset" in table and (table["dataset"] == "europemedqa").any()
    wanted = [f for f in FIELDS if f in table or (f == "country" and emq)
              or any(f in m for m in metas)]
    return add_meta_fields(table.copy(), wanted, source)


def _reference(row: dict, mcq: bool) -> str:
    if mcq:
        return "".join(sorted(map(str, row["answer"])))
    return " | ".join(str(a) for a in row["answers"])


def _options(row: dict) -> list[str]:
    opts = row.get("options")
    if opts is None or not len(opts):
        return []
    return [f"{o.get('label')}. {o.get('text')}" if isinstance(o, dict) else str(o)
            for o in opts]


def run_items(run_dir: Path, mode: str = "medqaro") -> tuple[dict, list[dict], dict[str, str]]:
    """(the run's header, one record per item with its answer and score, its contexts)."""
    from medray.eval.breakdown import _group_mapping, _run_inputs
    from medray.eval.metrics.aggregate import mcq_item_scores
    from medray.eval.score import scoring_table

    config, where = _run_inputs(Path(run_dir))
    table, manifest, source = scoring_table(**where)
    mcq = manifest.get("kind") == "mcq" or "option_labels" in table
    table = _fields(table, source)
    preds = table["prediction"].astype(str).tolist()
    if mcq:
        s = mcq_item_scores(table, _group_mapping(config))
        scores = [float(c and x == 1.0) for c, x in zip(s.conforming, s.correct, strict=True)]
        outcomes = ["right" if x == 1.0 else "wrong" for x in scores]
        nonconforming = [not bool(c) for c in s.conforming]
        metric = MCQ_RULE
    else:
        mode = mode if mode in ("medqaro", "robust") else "medqaro"
        scores, ems = _gen_scores(preds, [list(a) for a in table["answers"]], mode)
        outcomes = ["right" if e == 1.0 else "partial" if f > 0 else "wrong"
                    for f, e in zip(scores, ems, strict=True)]
        nonconforming = [False] * len(preds)
        metric = f"token F1 ({mode} metric mode; right = exact match)"
    fields = [f for f in FIELDS if f in table]
    items = []
    for i, r in enumerate(table.to_dict("records")):
        item: dict[str, Any] = {
            "key": f"{r.get('dataset', '')}\x00{r['id']}", "id": str(r["id"]),
            "q": str(r.get("question") or ""), "ref": _reference(r, mcq),
            "f": {f: str(r[f]) for f in fields if isinstance(r.get(f), str | int | bool)},
            "answer": [preds[i], round(scores[i], 4), outcomes[i], nonconforming[i]]}
        opts = _options(r) if mcq else []
        if opts:
            item["opts"] = opts
        if isinstance(r.get("context_id"), str):
            item["ctx"] = str(r["context_id"])
        items.append(item)
    engine = config.get("engine") or {}
    model = engine.get("model") or engine.get("baseline") or ""
    metrics = Path(run_dir) / "metrics.json"
    if metrics.is_file():  # the label the report's tables show
        model = (json.loads(metrics.read_text()).get("run") or {}).get("model") or model
    head = {"name": Path(run_dir).name, "kind": "mcq" if mcq else "generative",
            "metric": metric, "model": str(model)}
    return head, items, _contexts(config, table)


def samples_data(runs: Sequence[Path], mode: str = "medqaro") -> dict[str, Any]:
    """The page's data: runs, filter fields, contexts and items (answers per run). A run
    whose items cannot be read (its predictions or references moved) is listed under
    "unread" with the reason, and the page shows the others."""
    from medray.eval.breakdown import BreakdownError
    from medray.eval.score import ScoreInputError

    heads, contexts, unread = [], {}, []
    merged: dict[str, dict] = {}
    readable = []
    for run_dir in runs:
        try:
            readable.append(run_items(Path(run_dir), mode))
        except (BreakdownError, ScoreInputError, OSError, KeyError, ValueError) as err:
            unread.append({"run": Path(run_dir).name, "why": str(err)})
    for j, (head, items, ctx) in enumerate(readable):
        heads.append(head)
        contexts.update(ctx)
        for item in items:
            answer = item.pop("answer")
            key = item.pop("key")
            entry = merged.setdefault(key, {**item, "r": [None] * len(readable)})
            entry["r"][j] = answer
    items = list(merged.values())
    present = [f for f in FIELDS if any(f in it["f"] for it in items)]
    if len({it["f"].get("dataset") for it in items}) < 2 and "dataset" in present:
        present.remove("dataset")
    return {"runs": heads, "fields": present, "contexts": contexts, "items": items,
            "unread": unread}
