"""Unweighted majority vote over several multiple-choice runs, reported as its own row.

Each run votes with the answer it extracted for an item (the exact set of letters; group
items: the group letter); a non-conforming output abstains. The answer with the most votes
wins. TIE RULE: among the tied answers, the one given by the earliest run in the order the
runs were listed wins (list the strongest run first). An item where every run abstained is
non-conforming in the ensemble too. Only items answered (conforming or not) by every run
are voted on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from medray.data.prepared import load_prepared
from medray.eval import runio
from medray.eval.config import ScoreSpec
from medray.eval.finish import score_items
from medray.eval.mcq import extract
from medray.prompts.text import example_dict

TIE_RULE = "earliest listed run among the tied answers"


def _labels(row: dict, ex: dict) -> tuple[str, ...] | None:
    if not row.get("conforming", True):
        return None
    if "labels" in row:
        return tuple(sorted(row["labels"])) or None
    labels, ok = extract(str(row.get("prediction", "")), ex, group_as_multiple=False)
    return labels if ok and labels else None


def vote(answers: Sequence[tuple[str, ...] | None]) -> tuple[tuple[str, ...] | None, bool]:
    """(winner, tied) for one item; answers in run order, None = abstain."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None, False
    top = max(counts.values())
    tied = [a for a, c in counts.items() if c == top]
    winner = next(a for a in answers if a in tied)  # earliest run among the tied
    return winner, len(tied) > 1


def majority_vote(run_dirs: Sequence[str | Path], data_dir: str | Path, out: str | Path,
                  split: str = "test", seed: int = 0) -> dict:
    if len(run_dirs) < 2:
        raise ValueError("an ensemble needs at least 2 runs")
    runs = [runio.read_predictions(Path(d) / runio.PREDICTIONS) for d in run_dirs]
    for d, preds in zip(run_dirs, runs, strict=True):
        if not preds:
            raise ValueError(f"{d}: no predictions.jsonl rows")
    data = load_prepared(data_dir)
    items = data.split(split)
    common = set.intersection(*(set(p) for p in runs))
    items = items[items["id"].isin(common)].reset_index(drop=True)
    if items.empty:
        raise ValueError("the runs share no item ids in split " + split)
    out = Path(out)
    rows, n_ties = [], 0
    members = [str(next(iter(p.values())).get("model", d)) for d, p in zip(run_dirs, runs,
                                                                           strict=True)]
    for _, item in items.iterrows():
        ex = example_dict(item)
        answers = [_labels(p[ex["id"]], ex) for p in runs]
        winner, tied = vote(answers)
        n_ties += tied
        rows.append(runio.prediction_row(
            ex["id"], "".join(winner or ()), labels=list(winner or ()),
            conforming=winner is not None, engine="ensemble", model="+".join(members),
            prompt_format="majority-vote", n_tokens=0, raw_output=None, tied=tied,
            votes=["".join(a) if a else None for a in answers]))
        rows[-1]["raw_output"] = None  # nothing was generated
    out.mkdir(parents=True, exist_ok=True)
    runio.write_jsonl_atomic(out / runio.PREDICTIONS, rows)  # recomputed whole
    metrics = score_items(data, data_dir, items, out, ScoreSpec(seed=seed), split=split)
    row = f"ensemble: majority vote of {len(runs)} runs"
    summary = {
        "run": {"dataset": data.dataset, "kind": data.kind, "split": split,
                "engine": "ensemble", "engine_spec": row, "model": "+".join(members),
                "adapter": None, "fine_tuned": None, "prompt_format": "majority-vote",
                "context_tokens": None, "strategy": None, "sample": None, "n": len(items),
                "prompt": None},
        "requests": None, "metrics": metrics, "row": row,
        "members": [str(d) for d in run_dirs], "member_models": members,
        "tie_rule": TIE_RULE, "n_ties": n_ties}
    runio.write_json_atomic(out / runio.METRICS, summary)
    return summary
