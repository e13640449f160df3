"""`medray report`'s results_lm_eval.json: the runs in lm-evaluation-harness's results schema
(`lm_eval.result_schema.EvalResults`, what `lm_eval --output_path` writes), so tools that
read lm-eval results (its `make_table`, leaderboards, notebooks) read medray's runs too.

One task per run, named `medray_<dataset>_<split>` (`_<run>` appended where two runs share
a dataset and split). Metric keys are lm-eval's `"<metric>,<filter>"`: multiple choice
`acc,none` (exact set of letters over conforming outputs), `conforming_rate,none`, ...;
option log-likelihood `acc,loglik` and `acc_norm,loglik`; generative runs name their metric
mode as the filter (`f1,medqaro`, `exact_match,medqaro`, `bleu,medqaro`, ...). Standard
errors are the 95% bootstrap CI's width / (2 x 1.96); medray's own CIs, metric mode, prompt
format, chat template, context length, model, adapter, split and n stay under "medray".
No timestamp: the same runs give the same file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FILENAME = "results_lm_eval.json"
Z95 = 1.959963984540054
# medray's metric names where lm-eval has its own.
RENAME = {"accuracy": "acc", "em": "exact_match"}
STDERR_RULE = ("95% percentile-bootstrap CI width / (2 x 1.96), the normal approximation of "
               "medray's bootstrap (the resampling unit is in 'ci')")


def _task_names(runs: Sequence[tuple[str, dict]]) -> list[str]:
    base = [f"medray_{s['run'].get('dataset')}_{s['run'].get('split')}" for _, s in runs]
    clash = {b for b in base if base.count(b) > 1}
    names: list[str] = []
    for b, (name, _) in zip(base, runs, strict=True):
        task = f"{b}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}" if b in clash else b
        while task in names:  # two folders of one name (a/x, b/x)
            task += "_"
        names.append(task)
    return names


def _metric_entries(block: dict, filt: str) -> tuple[dict[str, float], dict[str, list]]:
    """({"<metric>,<filter>": mean, "<metric>_stderr,<filter>": se}, {key: ci95})."""
    values: dict[str, float] = {}
    cis: dict[str, list] = {}
    for name, m in (block or {}).items():
        if not isinstance(m, dict) or not isinstance(m.get("mean"), int | float):
            continue  # undefined (nothing to average): lm-eval's schema wants numbers
        key = f"{RENAME.get(name, name)},{filt}"
        values[key] = float(m["mean"])
        lo, hi = m.get("ci95") or (None, None)
        if isinstance(lo, int | float) and isinstance(hi, int | float):
            values[f"{RENAME.get(name, name)}_stderr,{filt}"] = (hi - lo) / (2 * Z95)
            cis[key] = [lo, hi]
    return values, cis


def _task_block(name: str, run_name: str, summary: dict) -> tuple[dict, dict, dict]:
    """(results[task], configs[task], medray[task])."""
    run, scores = summary["run"], summary["metrics"]
    values: dict[str, float] = {}
    cis: dict[str, list] = {}
    how: dict[str, Any] = {}
    for mode, res in scores.items():
        filt = "none" if res.get("kind") == "mcq" else mode
        v, c = _metric_entries(res.get("metrics"), filt)
        values |= v
        cis |= c
        if "loglik" in res:
            ll = res["loglik"]
            v, c = _metric_entries({k: ll[k] for k in ("acc", "acc_norm") if k in ll}, "loglik")
            values |= v
            cis |= c
        how[mode] = {k: res.get(k) for k in ("n", "n_conforming", "n_nonconforming",
                                             "n_clusters", "random_expected_accuracy")
                     if res.get(k) is not None} | {"ci": (res.get("how") or {}).get("ci")}
    result = {"name": name, "alias": f"{run.get('dataset')} {run.get('split')} ({run_name})",
              "sample_len": int(run.get("n") or 0), **values}
    mcq = run.get("kind") == "mcq"
    metric_list = sorted({k.split(",")[0] for k in values if "_stderr," not in k})
    # lm-eval's schema: configs[task] holds strings, booleans and nulls only
    config = {"task": name, "dataset_path": "medray prepared data",
              "dataset_name": str(run.get("dataset")), "test_split": str(run.get("split")),
              "output_type": "generate_until", "description": str(run.get("prompt") or ""),
              "metrics": ", ".join(metric_list), "aggregation": "mean",
              "kind": "multiple choice" if mcq else "generative"}
    spec = run.get("prompt_spec") or {}
    extra = {"run": run_name, "dataset": run.get("dataset"), "split": run.get("split"),
             "kind": run.get("kind"), "n": run.get("n"), "model": run.get("model"),
             "adapter": run.get("adapter"), "engine": run.get("engine_spec") or run.get(
                 "engine"), "fine_tuned": run.get("fine_tuned"),
             "prompt_format": run.get("prompt_format"), "prompt": run.get("prompt"),
             "chat_template": spec.get("chat_template"),
             "context_tokens": run.get("context_tokens"), "strategy": run.get("strategy"),
             "shots": run.get("shots"), "sample": run.get("sample"), "limit": run.get("limit"),
             "n_skipped_images": run.get("n_skipped_images"),
             "metric_modes": list(scores), "ci95": cis, "stderr": STDERR_RULE,
             "scores": how}
    return result, config, extra


def _n_samples(summary: dict) -> dict[str, int]:
    run = summary["run"]
    n = int(run.get("n") or 0)
    sample = run.get("sample") or {}
    original = sample.get("of") if sample else (
        None if run.get("limit") else n + int(run.get("n_skipped_images") or 0))
    return {"original": int(original if original is not None else n), "effective": n}


def lm_eval_results(runs: Sequence[Path], summaries: Sequence[dict]) -> dict[str, Any]:
    """The lm-eval results dict of `medray eval` runs (their metrics.json, loaded)."""
    from medray import __version__

    named = [(Path(r).name, s) for r, s in zip(runs, summaries, strict=True)]
    names = _task_names(named)
    out: dict[str, Any] = {k: {} for k in ("results", "group_subtasks", "configs", "versions",
                                           "n-shot", "higher_is_better", "n-samples")}
    extra: dict[str, Any] = {}
    for task, (run_name, summary) in zip(names, named, strict=True):
        result, config, extra[task] = _task_block(task, run_name, summary)
        out["results"][task] = result
        out["configs"][task] = config
        out["versions"][task] = 1.0
        out["n-shot"][task] = int(summary["run"].get("shots") or 0)
        out["higher_is_better"][task] = {m: True for m in config["metrics"].split(", ") if m}
        out["n-samples"][task] = _n_samples(summary)
    models = sorted({str(s["run"].get("model")) for _, s in named})
    adapters = sorted({str(s["run"].get("adapter")) for _, s in named if s["run"].get("adapter")})
    model = models[0] if len(models) == 1 else "several: " + ", ".join(models)
    out["config"] = {"model": model, "model_args": {"adapters": adapters} if adapters else None,
                     "batch_size": None, "device": None, "limit": None,
                     "bootstrap_iters": _resamples(summaries), "gen_kwargs": None}
    out["model_name"] = model
    out["model_source"] = "medray"
    out["medray"] = {"version": __version__, "tasks": extra}
    return out


def _resamples(summaries: Sequence[dict]) -> int:
    found = {((res.get("how") or {}).get("ci") or {}).get("resamples")
             for s in summaries for res in s["metrics"].values()}
    found.discard(None)
    return int(found.pop()) if len(found) == 1 else 0
