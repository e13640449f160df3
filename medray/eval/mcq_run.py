"""Multiple choice end to end (RoBiology, EuropeMedQA): prompts -> engine -> extraction ->
accuracy per kind with CIs, written to OUT/predictions.jsonl (appended as answers arrive,
resumable) and OUT/metrics.json.

- Prompts: `medray.prompts.mcq_prompt` per kind, 0/1/3/5 shots (taken from the train split,
  seeded, the same shots for every item of a kind). Group items can be asked as multiple
  choice over their statements and mapped back to a letter (`group_as_multiple`).
- API engines (they have `chat`) get the system/user pair and, for EuropeMedQA items with
  images, the images in the protocol's order; text-only engines skip image items (counted).
- Extraction and scoring are the metrics module's (`medray.eval.metrics`): non-conforming
  outputs are excluded from accuracy and counted; multi-answer items need the exact set.
- Local engines (`score_options`) also score single-answer items by option log-likelihood
  (lm-evaluation-harness ARC style: "Question: ...\\nAnswer:" + " option text"; acc = best
  sum log-prob, acc_norm = best log-prob per character).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medray.eval import runio
from medray.eval.metrics.bootstrap import bootstrap_means
from medray.eval.metrics.mcq import extract_answer, extract_statements, statements_to_group
from medray.prompts import ChatPrompt, mcq_prompt

log = logging.getLogger(__name__)

# Minimal max tokens for the expected format (the protocol: no room for explanations).
# EuropeMedQA answers carry the question id ("IT0001: A"); multi-answer ones list letters.
MAX_TOKENS = {("europemedqa", "single"): 12, ("europemedqa", "multiple"): 20,
              ("robiology", "single"): 5, ("robiology", "group"): 5,
              ("robiology", "multiple"): 10, ("robiology", "group_as_multiple"): 10}
BATCH = 16
_ID_PREFIX = re.compile(r"^\s*(?:question\s*id\s*[:=]?\s*)?\**([A-Z]{2}\d{1,6})\**\s*[:\-–]\s*",
                        re.IGNORECASE)


# ------------------------------------------------------------------------- items / prompts
def example_dict(row: pd.Series | dict) -> dict:
    """A prepared row with plain-Python options/answer/images (parquet gives numpy arrays)."""
    ex = dict(row)
    ex["options"] = [{"label": str(o["label"]), "text": str(o["text"])} for o in ex["options"]]
    ex["answer"] = [str(a) for a in ex["answer"]]
    ex["images"] = [str(p) for p in (ex.get("images") if ex.get("images") is not None else [])]
    return ex


def sample_rows(df: pd.DataFrame, n: int | None, seed: int) -> pd.DataFrame:
    """The papers' seeded random subset: n items drawn without replacement, kept in order."""
    if n is None or n >= len(df):
        return df.reset_index(drop=True)
    idx = np.sort(np.random.default_rng(seed).choice(len(df), size=n, replace=False))
    return df.iloc[idx].reset_index(drop=True)


def pick_shots(examples: pd.DataFrame, kind: str, k: int, seed: int) -> list[dict]:
    if k == 0:
        return []
    pool = examples[(examples["split"] == "train") & (examples["kind"] == kind)]
    if len(pool) < k:
        raise ValueError(f"{k}-shot prompts need {k} train items of kind {kind!r}; "
                         f"the prepared data has {len(pool)}")
    idx = np.sort(np.random.default_rng(seed).choice(len(pool), size=k, replace=False))
    return [example_dict(pool.iloc[i]) for i in idx]


def _as_statement_shot(shot: dict) -> dict:
    from medray.data.schema import GROUP_CODES

    return {**shot, "kind": "multiple",
            "answer": [str(n) for n in sorted(GROUP_CODES[shot["answer"][0]])]}


def render(ex: dict, shots: dict[str, list[dict]], group_as_multiple: bool) -> ChatPrompt:
    kind = ex["kind"]
    if kind == "group" and group_as_multiple:
        asked = {**ex, "kind": "multiple"}
        return mcq_prompt(asked, [_as_statement_shot(s) for s in shots.get("group", [])])
    return mcq_prompt(ex, shots.get(kind, []))


def question_id(ex: dict) -> str:
    meta = runio.meta_dict(ex.get("meta"))
    return str(meta.get("original_id") or ex["id"])


# ------------------------------------------------------------------------- extraction
def answer_text(raw: str, ex: dict) -> tuple[str, bool]:
    """Strip the protocol's "<QuestionID>: " prefix; a different id is non-conforming."""
    text = raw or ""
    if ex["dataset"] == "europemedqa":
        m = _ID_PREFIX.match(text)
        if m:
            if m.group(1).upper() != question_id(ex).upper():
                return text, False
            text = text[m.end():]
    return text.strip(), True


def extract(text: str, ex: dict, group_as_multiple: bool) -> tuple[tuple[str, ...], bool]:
    """Letters chosen (group items: the group letter) via the metrics module's extractors."""
    kind = ex["kind"]
    if kind == "group" and group_as_multiple:
        stmts, ok = extract_statements(text, len(ex["options"]) or 4)
        letter = statements_to_group(stmts, "heuristic") if ok else None
        return ((letter,), True) if letter else ((), False)
    valid = "ABCDE" if kind == "group" else [o["label"] for o in ex["options"]]
    ext = extract_answer(text, valid, multi=kind == "multiple")
    return ext.labels, ext.conforming


def loglik_choice(engine: Any, ex: dict) -> dict:
    prompt = f"Question: {ex['question']}\nAnswer:"
    scores = engine.score_options(prompt, [" " + o["text"] for o in ex["options"]])
    labels = [o["label"] for o in ex["options"]]
    acc = labels[int(np.argmax([s.logprob for s in scores]))]
    norm = labels[int(np.argmax([s.normalized for s in scores]))]
    return {"loglik_prediction": acc, "loglik_norm_prediction": norm,
            "option_logprobs": [round(float(s.logprob), 4) for s in scores]}


# ------------------------------------------------------------------------- the run
def run_mcq(
    engine: Any,
    items: pd.DataFrame,
    examples: pd.DataFrame,
    out: str | Path,
    *,
    shots: int = 0,
    seed: int = 0,
    group_as_multiple: bool = False,
    loglik: bool | None = None,
    max_new_tokens: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Answer every item not yet in OUT/predictions.jsonl; returns counts of this call."""
    out = Path(out)
    is_api = hasattr(engine, "chat")
    images_ok = bool(getattr(engine, "supports_images", False))
    loglik = (not is_api and hasattr(engine, "score_options")) if loglik is None else loglik
    kinds = sorted(set(items["kind"]))
    shot_sets = {k: pick_shots(examples, k, shots, seed) for k in kinds}
    done = runio.done_ids(out / runio.PREDICTIONS)
    todo, skipped = [], []
    for _, row in items.iterrows():
        ex = example_dict(row)
        if ex["images"] and not images_ok:
            skipped.append(ex["id"])  # text-only engine: image items are not asked
        elif ex["id"] not in done:
            todo.append(ex)
    writer = runio.PredictionWriter(out / runio.PREDICTIONS)
    fmt_kind = {"group": "group_as_multiple"} if group_as_multiple else {}
    for start in range(0, len(todo), BATCH):
        batch = todo[start:start + BATCH]
        prompts = [render(ex, shot_sets, group_as_multiple) for ex in batch]
        # Items of one batch may differ in kind: group by max tokens so each call is minimal.
        gens: list[Any] = [None] * len(batch)
        by_budget: dict[int, list[int]] = {}
        for i, ex in enumerate(batch):
            k = fmt_kind.get(ex["kind"], ex["kind"])
            budget = max_new_tokens or MAX_TOKENS.get((ex["dataset"], k), 10)
            by_budget.setdefault(budget, []).append(i)
        for budget, idx in by_budget.items():
            if is_api:
                from medray.engines.api import ChatRequest

                reqs = [ChatRequest(prompts[i].system, prompts[i].user,
                                    tuple(batch[i]["images"]),
                                    runio.meta_dict(batch[i]["meta"]).get("image_root"))
                        for i in idx]
                res = engine.chat(reqs, max_new_tokens=budget)
            else:
                res = engine.generate([prompts[i].text for i in idx], max_new_tokens=budget)
            for i, g in zip(idx, res, strict=True):
                gens[i] = g
        rows = []
        for ex, gen in zip(batch, gens, strict=True):
            text, id_ok = answer_text(gen.text, ex)
            labels, conforming = extract(text, ex, group_as_multiple)
            asked = "multiple" if ex["kind"] == "group" and group_as_multiple else ex["kind"]
            row = runio.prediction_row(engine, ex, text, gen, conforming and id_ok,
                                       prompt_format=f"mcq:{ex['dataset']}:{ex['kind']}"
                                       f":asked-{asked}:{shots}shot")
            row.update(kind=ex["kind"], language=ex["language"], labels=list(labels),
                       n_images_sent=len(ex["images"]) if is_api else 0)
            if loglik and ex["kind"] == "single":
                row.update(loglik_choice(engine, ex))
            rows.append(row)
        writer.append(rows)
        log.info("answered %d/%d items", start + len(batch), len(todo))
        if progress:
            progress(start + len(batch), len(todo))
    return {"asked": len(todo), "already_done": len(done), "skipped_images": skipped}


# ------------------------------------------------------------------------- metrics
def mcq_metrics(items: pd.DataFrame, out: str | Path, *, skipped_images: Sequence[str] = (),
                group_as_multiple: bool = False, seed: int = 0,
                n_resamples: int = 1000) -> dict:
    """Accuracy with CIs (the metrics module's `score_mcq`), plus conforming counts, option
    log-likelihood accuracy, and the per-letter distribution of keys and predictions."""
    from medray.eval.metrics.aggregate import score_mcq

    preds = runio.read_predictions(Path(out) / runio.PREDICTIONS)
    table = items[items["id"].isin(preds)].reset_index(drop=True).copy()
    if table.empty:
        raise ValueError(f"{out}: no predictions for the selected items")
    table["answer"] = [sorted(str(x) for x in a) for a in table["answer"]]
    table["option_labels"] = [[str(o["label"]) for o in opts] for opts in table["options"]]
    table["modality"] = ["with_images" if len(i) else "text_only" for i in table["images"]]
    table["prediction"] = [preds[i]["prediction"] for i in table["id"]]
    table["conforming"] = [bool(preds[i]["conforming"]) for i in table["id"]]
    result = score_mcq(table, by=["language", "modality"],
                       group_mapping="heuristic" if group_as_multiple else None,
                       n_resamples=n_resamples, seed=seed)
    result["n_selected"] = int(len(items))
    result["n_skipped_images"] = len(skipped_images)
    result["key_distribution"] = letter_counts(table["answer"])
    result["prediction_distribution"] = letter_counts(
        [preds[i].get("labels") or [] for i in table["id"] if preds[i]["conforming"]])
    ll = [preds[i] for i in table["id"] if "loglik_prediction" in preds[i]]
    if ll:
        gold = dict(zip(table["id"], table["answer"], strict=True))
        acc = np.array([[p["loglik_prediction"]] == gold[p["id"]] for p in ll], dtype=float)
        norm = np.array([[p["loglik_norm_prediction"]] == gold[p["id"]] for p in ll], dtype=float)
        result["loglik"] = {"n": len(ll), **bootstrap_means(
            {"acc": acc, "acc_norm": norm}, n_resamples=n_resamples, seed=seed),
            "how": "single-answer items; argmax of summed option log-prob (acc) and of "
                   "log-prob per character (acc_norm), lm-evaluation-harness style"}
    result["how"]["skipped_images"] = ("items with images are not asked to text-only engines; "
                                       "counted in n_skipped_images")
    return result


def letter_counts(lists: Sequence[Sequence[str]]) -> dict[str, int]:
    c = Counter(x for labels in lists for x in labels)
    return dict(sorted(c.items()))
