"""Study breakdowns over `medray eval` run folders, re-scored from what they saved.

- `breakdown_rows(runs, fields)`: each run's metrics per value of each field (country,
  modality, language, specialty, year, gold_letter, kind, question_type, grade, stage, ...)
  with 95% bootstrap CIs, computed by `medray score`'s own function from the run's
  predictions.jsonl and its references (references.jsonl beside them, or the prepared data
  named in config.json);
- `hard_items(runs, fields)`: the items every given run misses (multiple choice: not a
  conforming exact set; generative: token F1 of 0), with their share per field value.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from medray.eval import runio
from medray.eval.finish import REFERENCES

# What a study table shows per group, by kind of run.
SHOWN = {"mcq": ("accuracy", "conforming_rate"), "generative": ("f1", "em")}
MISS_RULE = {"mcq": "no conforming exact set of letters (all-correct rule)",
             "generative": "token F1 of 0 (no answer token in the reference)"}


class BreakdownError(ValueError):
    pass


def _run_inputs(run_dir: Path) -> tuple[dict, dict]:
    """(config.json, run_score's keyword arguments locating predictions and references)."""
    config_path = run_dir / runio.CONFIG
    if not config_path.is_file() or not (run_dir / runio.PREDICTIONS).is_file():
        raise BreakdownError(f"{run_dir}: no config.json and predictions.jsonl (not a "
                             "`medray eval` run folder)")
    config = json.loads(config_path.read_text())
    refs = run_dir / REFERENCES
    where = ({"references": str(refs)} if refs.is_file()
             else {"data": config["data"], "splits": [config.get("split", "test")]})
    return config, {"predictions": str(run_dir / runio.PREDICTIONS), **where}


def _group_mapping(config: dict) -> str | None:
    return "heuristic" if config.get("group_as_multiple") else None


def run_breakdown(run_dir: Path, fields: Sequence[str], mode: str = "medqaro",
                  n_resamples: int = 1000, seed: int = 0) -> dict:
    """`medray score`'s result for one run folder with `by=fields`."""
    from medray.eval.score import run_score

    config, where = _run_inputs(Path(run_dir))
    score = config.get("score") or {}
    return run_score(**where, mode=mode, by=list(fields), group_mapping=_group_mapping(config),
                     n_resamples=n_resamples, seed=seed,
                     use_wordnet=bool(score.get("wordnet", True)))


def breakdown_rows(runs: Sequence[Path], fields: Sequence[str], mode: str = "medqaro",
                   n_resamples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per run x field x value: n and the run kind's metrics with CI bounds."""
    rows = []
    for run_dir in runs:
        result = run_breakdown(Path(run_dir), fields, mode, n_resamples, seed)
        kind = "mcq" if result["kind"] == "mcq" else "generative"
        for field, groups in result["by"].items():
            for value, block in groups.items():
                row = {"run": Path(run_dir).name, "field": field, "value": value,
                       "n": block["n"]}
                if kind == "mcq":
                    row["n_conforming"] = block["n_conforming"]
                for name in SHOWN[kind]:
                    m = block["metrics"].get(name) or {}
                    lo, hi = m.get("ci95") or (None, None)
                    row.update({name: m.get("mean"), f"{name}_lo": lo, f"{name}_hi": hi})
                rows.append(row)
    return pd.DataFrame(rows)


def item_misses(run_dir: Path, fields: Sequence[str] = (), mode: str = "medqaro"
                ) -> tuple[pd.DataFrame, str]:
    """(id, missed, the fields) per item of one run, and the run's kind."""
    from medray.eval.metrics.aggregate import mcq_item_scores
    from medray.eval.metrics.generative import GenerativeScorer
    from medray.eval.score import add_meta_fields, scoring_table

    config, where = _run_inputs(Path(run_dir))
    table, manifest, source = scoring_table(**where)
    table = add_meta_fields(table, fields, source)
    if manifest.get("kind") == "mcq" or "option_labels" in table:
        items = mcq_item_scores(table, _group_mapping(config))
        missed, kind = ~(items.conforming & (items.correct == 1.0)), "mcq"
    else:
        scorer = GenerativeScorer(mode, use_wordnet=False)  # F1 only: no METEOR needed
        f1 = scorer.score_many(table["prediction"].astype(str).tolist(),
                               [list(a) for a in table["answers"]])["f1"]
        missed, kind = np.asarray(f1) == 0.0, "generative"
    out = table[["id", *fields]].copy()
    out["missed"] = missed
    return out, kind


def hard_items(runs: Sequence[Path], fields: Sequence[str], mode: str = "medqaro"
               ) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(the items every run misses, their count per field value, how it was decided)."""
    if not runs:
        raise BreakdownError("no runs given")
    tables, kinds = [], set()
    for run_dir in runs:
        table, kind = item_misses(Path(run_dir), fields, mode)
        tables.append(table.set_index("id"))
        kinds.add(kind)
    if len(kinds) > 1:
        raise BreakdownError("hard items need runs of one kind (all multiple choice or all "
                             f"generative); got {sorted(kinds)}")
    common = tables[0].index
    for t in tables[1:]:
        common = common.intersection(t.index)
    if common.empty:
        raise BreakdownError("the runs share no item id: were they run on the same data?")
    missed_all = np.logical_and.reduce([t.loc[common, "missed"].to_numpy() for t in tables])
    items = tables[0].loc[common, list(fields)].copy()
    items["missed_by_all"] = missed_all
    hard = items[items["missed_by_all"]].drop(columns="missed_by_all").reset_index()
    counts = []
    for field in fields:
        for value, group in items.groupby(field, sort=True):
            n_hard = int(group["missed_by_all"].sum())
            counts.append({"field": field, "value": value, "n": len(group),
                           "n_hard": n_hard, "hard_share": n_hard / len(group)})
    how = {"runs": [Path(r).name for r in runs], "kind": kinds.pop(),
           "n_common_items": int(len(common)), "n_hard": int(missed_all.sum())}
    how["miss_rule"] = MISS_RULE[how["kind"]]
    return hard, pd.DataFrame(counts), how
