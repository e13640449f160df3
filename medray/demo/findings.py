"""What the demo report shows beyond the main table, read from what the run wrote:
F1 by question type (the evaluation runs' breakdowns), the training curve (TensorBoard
scalars and the training metrics.json), and example questions with every system's answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QUESTION_TYPES = ("binary", "extractive", "reasoning")
EXAMPLES_PER_TYPE = 4


def _eval_summary(run_dir: Path) -> dict:
    from medray.eval.report import load_run

    return load_run(run_dir)


def f1_by_type(runs: dict[str, dict[str, Path]], split: str = "test") -> dict[str, dict]:
    """{system: {question_type: {"mean", "ci95", "n"}}} from each run's `by` breakdown."""
    out: dict[str, dict] = {}
    for system, by_split in runs.items():
        if split not in by_split:
            continue
        res = _eval_summary(by_split[split])["metrics"]["medqaro"]
        groups = (res.get("by") or {}).get("question_type") or {}
        out[system] = {t: {**(g["metrics"].get("f1") or {}), "n": g.get("n")}
                       for t, g in groups.items()}
    return out


def training_curve(train_dir: Path, trained: dict) -> dict[str, list[tuple[int, float]]]:
    """Per-step training loss from TensorBoard (rank 0), validation loss and F1 at step 0
    (before training) and at each epoch end, as the trainer recorded them."""
    curve: dict[str, list[tuple[int, float]]] = {"train_loss": [], "val_loss": [], "val_f1": []}
    events = sorted(Path(train_dir, "tensorboard").rglob("events.out.tfevents.*"))
    if events:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(events[-1].parent), size_guidance={"scalars": 0})
        acc.Reload()
        if "train/loss" in acc.Tags().get("scalars", []):
            curve["train_loss"] = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    records = [(0, trained.get("initial") or {})] + [
        (e.get("step", 0), e) for e in trained.get("epochs") or []]
    for step, rec in records:
        for key in ("val_loss", "val_f1"):
            if rec.get(key) is not None:
                curve[key].append((int(step), float(rec[key])))
    return curve


def _predictions(run_dir: Path) -> dict[str, str]:
    with open(Path(run_dir) / "predictions.jsonl", encoding="utf-8") as fh:
        return {row["id"]: row.get("prediction") or "" for row in map(json.loads, fh)}


def examples(output: Path, runs: dict[str, dict[str, Path]], split: str = "test",
             per_type: int = EXAMPLES_PER_TYPE) -> list[dict[str, Any]]:
    """A fixed selection (no cherry-picking): for each question type, the first questions
    by id of different patients, with the reference and each system's answer and F1."""
    from medray.data.prepared import load_prepared
    from medray.eval.metrics.generative import f1_medqaro

    preds = {system: _predictions(by_split[split]) for system, by_split in runs.items()
             if split in by_split}
    if not preds:
        return []
    answered = set.intersection(*(set(p) for p in preds.values()))
    table = load_prepared(output / "data").split(split)
    table = table[table["id"].isin(answered)].copy()
    table["order"] = table["id"].str.rsplit(":", n=1).str[-1].astype(int)
    chosen = []
    for qtype in QUESTION_TYPES:
        rows = table[table["question_type"] == qtype].sort_values("order")
        rows = rows.drop_duplicates("patient_id").head(per_type)
        for row in rows.itertuples(index=False):
            chosen.append({
                "id": row.id, "question_type": qtype, "question": row.question,
                "reference": row.answer,
                "answers": {s: {"text": p[row.id], "f1": f1_medqaro(p[row.id], row.answer)}
                            for s, p in preds.items()}})
    return chosen


def question_prior(output: Path, splits: tuple[str, ...] = ("test", "test_cross")
                   ) -> dict[str, dict[str, Any]]:
    """A reference point, not a system: answer each question with the train split's most
    frequent answer to the same question text (the global majority answer for a text never
    seen in training). What a model scores from question priors alone, without reading the
    record. {split: {"f1": mean, "by_type": {question_type: mean}, "n": rows}}."""
    from medray.data.prepared import load_prepared
    from medray.eval.metrics.generative import f1_medqaro

    data = load_prepared(output / "data")
    train = data.split("train")
    majority = train["answer"].value_counts().idxmax()
    prior = train.groupby("question")["answer"].agg(lambda s: s.value_counts().idxmax())
    out: dict[str, dict[str, Any]] = {}
    for split in splits:
        table = data.split(split).copy()
        if not len(table):
            continue
        table["f1"] = [f1_medqaro(prior.get(q, majority), a)
                       for q, a in zip(table["question"], table["answer"], strict=True)]
        out[split] = {"f1": float(table["f1"].mean()), "n": len(table),
                      "by_type": {t: float(v) for t, v in
                                  table.groupby("question_type")["f1"].mean().items()}}
    return out
