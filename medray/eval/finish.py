"""The end of every evaluation: score the run folder's predictions with `medray score`'s
function and write metrics.json, one schema for generative and multiple-choice runs:

    {"run":      how it was computed (dataset, kind, split, engine, model, adapter,
                 fine_tuned, prompt_format, context_tokens, strategy, shots, sample, n, ...),
     "requests": {"selected", "resumed", "requested", "written"},
     "metrics":  {metric mode: `medray score` result}   (multiple choice: the mode "mcq"),
     "governance", "usage", "engine_settings", and for multiple choice the key letters}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medray.data.prepared import PreparedData
from medray.eval import runio
from medray.eval.config import ScoreSpec
from medray.eval.metrics.bootstrap import bootstrap_means
from medray.eval.plan import EvalPlan, plain_row

REFERENCES = "references.jsonl"


def letter_counts(lists: Sequence[Sequence[str]]) -> dict[str, int]:
    c = Counter(str(x) for labels in lists for x in labels)
    return dict(sorted(c.items()))


def _score_one(pred_path: str, refs: str | None, data: str, split: str, mode: str,
               spec: dict[str, Any], group_mapping: str | None) -> dict:
    from medray.eval.score import run_score

    return run_score(pred_path, refs, None if refs else data, mode=mode, by=spec["by"],
                     splits=None if refs else [split], group_mapping=group_mapping,
                     n_resamples=spec["resamples"], seed=spec["seed"],
                     use_wordnet=spec["wordnet"])


def score_run(plan: EvalPlan, out: Path) -> dict[str, dict]:
    cfg = plan.cfg
    return score_items(plan.data, cfg.data, plan.asked, out, cfg.score, split=cfg.split,
                       group_as_multiple=cfg.group_as_multiple, n_selected=len(plan.items),
                       n_skipped_images=len(plan.skipped_images))


def score_items(data: PreparedData, data_dir: str | Path, items: pd.DataFrame, out: Path,
                score: ScoreSpec, *,
                split: str, group_as_multiple: bool = False, n_selected: int | None = None,
                n_skipped_images: int = 0) -> dict[str, dict]:
    """metric mode -> result for OUT/predictions.jsonl over `items` (those predicted);
    one Ray task per mode when Ray is up."""
    pred_path = out / runio.PREDICTIONS
    preds = runio.read_predictions(pred_path)
    scored = items[items["id"].astype(str).isin(preds)]
    if scored.empty:
        raise ValueError(f"{out}: no predictions for the selected items")
    refs = None
    if data.kind == "mcq" or len(scored) != len(data.split(split)):
        # A subset (or MCQ, whose breakdowns need the item's modality): references are the
        # predicted items, written beside the predictions.
        rows = [plain_row(r) for r in scored.to_dict("records")]
        if data.kind == "mcq":
            for r in rows:
                r["modality"] = "with_images" if r.get("images") else "text_only"
        runio.write_jsonl_atomic(out / REFERENCES, rows)
        refs = str(out / REFERENCES)
    modes = score.modes if data.kind == "generative" else ["mcq"]
    mapping = "heuristic" if group_as_multiple else None
    args = [(str(pred_path), refs, str(data_dir), split, m if m != "mcq" else "medqaro",
             score.model_dump(), mapping) for m in modes]
    import ray

    if ray.is_initialized() and len(modes) > 1:
        task = ray.remote(num_cpus=0.5)(_score_one)
        results = ray.get([task.remote(*a) for a in args])
    else:
        results = [_score_one(*a) for a in args]
    metrics = dict(zip(modes, results, strict=True))
    if data.kind == "mcq":
        _mcq_extras(metrics["mcq"], score, preds, scored,
                    len(items) if n_selected is None else n_selected, n_skipped_images)
    return metrics


def _mcq_extras(result: dict, score: ScoreSpec, preds: dict[str, dict], scored: pd.DataFrame,
                n_selected: int, n_skipped_images: int) -> None:
    """Conforming and letter counts, and option log-likelihood accuracy with CIs."""
    ids = [str(i) for i in scored["id"]]
    result["n_selected"] = int(n_selected)
    result["n_skipped_images"] = int(n_skipped_images)
    result["key_distribution"] = letter_counts(list(scored["answer"]))
    result["prediction_distribution"] = letter_counts(
        [preds[i].get("labels") or [] for i in ids if preds[i].get("conforming")])
    gold = {str(i): sorted(str(x) for x in a) for i, a in zip(scored["id"], scored["answer"],
                                                             strict=True)}
    ll = [preds[i] for i in ids if "loglik_prediction" in preds[i]]
    if ll:
        acc = np.array([[p["loglik_prediction"]] == gold[p["id"]] for p in ll], dtype=float)
        norm = np.array([[p["loglik_norm_prediction"]] == gold[p["id"]] for p in ll],
                        dtype=float)
        result["loglik"] = {"n": len(ll), **bootstrap_means(
            {"acc": acc, "acc_norm": norm}, n_resamples=score.resamples, seed=score.seed),
            "how": "single-answer items; argmax of summed option log-prob (acc) and of "
                   "log-prob per character (acc_norm), lm-evaluation-harness style"}
    result["how"]["skipped_images"] = ("items with images are not asked to text-only engines; "
                                       "counted in n_skipped_images (API engines and local "
                                       "vision-language models get them, n_images_sent)")


def _prompt_record(plan: EvalPlan) -> tuple[str | None, int | None, str]:
    """(prompt_format, context_tokens, description) of what the model read."""
    cfg, spec, data, p = plan.cfg, plan.cfg.engine, plan.data, plan.prompt
    if spec.kind == "baseline":
        tokens = spec.tokens if spec.baseline == "random-token" else None
        return None, tokens, f"none (baseline {spec.baseline})"
    if data.kind == "mcq":
        desc = (f"mcq prompt per kind ({data.dataset}), {p.shots}-shot"
                + (f" (train-split shots, seed {cfg.seed})" if p.shots else "")
                + ("; group items asked as multiple choice over the statements"
                   if cfg.group_as_multiple else ""))
        return f"mcq:{data.dataset}:{p.shots}shot", None, desc + _template_words(plan)
    if spec.external:
        return ("qea:full", None, "qea (question, whole epicrisis, answer), 0-shot, at most "
                f"{plan.budget()} new tokens")
    return (p.format, p.context_tokens,
            f"{p.format}, epicrisis fitted to {p.context_tokens} tokens ({p.strategy}), at "
            f"most {plan.budget()} new tokens" + _template_words(plan))


def _template_words(plan: EvalPlan) -> str:
    """How a text-completion engine's prompt met the chat template; chat APIs take roles."""
    if plan.cfg.engine.kind not in ("vllm", "hf", "serve"):
        return ""
    used = plan.prompt.chat_template
    return {True: "; the model's chat template", False: "; no chat template"}.get(
        used, "; the model's chat template where it has one")


def run_record(plan: EvalPlan, stats: dict) -> dict[str, Any]:
    cfg, spec, data = plan.cfg, plan.cfg.engine, plan.data
    prompt_format, context_tokens, prompt = _prompt_record(plan)
    of = int(len(data.split(cfg.split)))
    local = data.kind == "generative" and spec.kind != "baseline" and not spec.external
    return {
        "dataset": data.dataset, "kind": data.kind, "split": cfg.split,
        "engine": spec.kind, "engine_spec": str(spec), "model": spec.label,
        "adapter": spec.adapter,
        "fine_tuned": cfg.fine_tuned if cfg.fine_tuned is not None else spec.adapter is not None,
        "prompt_format": prompt_format, "context_tokens": context_tokens,
        "strategy": plan.prompt.strategy if local else None,
        "prompt_spec": cfg.prompt.model_dump(mode="json") if cfg.prompt else None,
        "max_new_tokens": plan.max_new_tokens, "shots": plan.prompt.shots,
        "group_as_multiple": cfg.group_as_multiple, "prompt": prompt,
        "sample": {"n": int(len(plan.items)), "seed": cfg.seed, "of": of} if cfg.sample
        else None,
        "limit": cfg.limit, "n": stats["selected"],
        "n_skipped_images": len(plan.skipped_images),
        "metric_modes": cfg.score.modes if data.kind == "generative" else ["mcq"],
    }


def finish_eval(plan: EvalPlan, out: Path, stats: dict, *, usage: dict | None = None,
                engine_settings: dict | None = None) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "run": run_record(plan, stats), "requests": stats, "metrics": score_run(plan, out),
        "governance": plan.governance, "usage": usage, "engine_settings": engine_settings,
    }
    if plan.data.kind == "mcq":
        whole = plan.data.split(plan.cfg.split)  # the keys as prepared (after any shuffling)
        summary["key_distribution_split"] = {"split": plan.cfg.split, "n": int(len(whole)),
                                             "counts": letter_counts(list(whole["answer"]))}
        summary["shuffle"] = plan.data.manifest.get("shuffle")
    runio.write_json_atomic(out / runio.METRICS, summary)
    return summary
