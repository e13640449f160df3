"""`medray eval --engine`: one engine (API or local) on one prepared dataset, end to end.

Order matters: the governance check runs right after the manifest is read and before any
engine exists, so a refused run cannot have sent anything. `dry_run` renders the prompts
and prints an estimate; it never builds an engine.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medray.data.prepared import PreparedData, load_prepared
from medray.engines.accounting import PRICES_AS_OF, cost_usd, estimate_tokens
from medray.engines.registry import parse_spec
from medray.eval import runio
from medray.eval.governance import FLAG, GovernanceError, check_external_use
from medray.eval.mcq_run import (
    MAX_TOKENS,
    letter_counts,
    mcq_metrics,
    render,
    run_mcq,
    sample_rows,
)
from medray.prompts import PromptSpec, medqaro_prompt

log = logging.getLogger(__name__)

# Zero-shot MedQARo through an API: the whole epicrisis, the prompt contract's defaults
# (the reference's 10 new tokens).
GENERATIVE_PROMPT = PromptSpec()
IMAGE_TOKENS_ESTIMATE = 1600  # per image, dry-run estimate only (providers differ)


def default_cache_path() -> Path:
    root = os.environ.get("MEDRAY_CACHE_DIR") or Path.home() / ".cache" / "medray"
    return Path(root) / "api_responses.sqlite"


def _items(data: PreparedData, split: str, sample: int | None, seed: int) -> pd.DataFrame:
    return sample_rows(data.split(split), sample, seed)


def _generative_prompts(data: PreparedData, items: pd.DataFrame) -> list[str]:
    # API models read the whole epicrisis (no trimming): the papers' API baselines did.
    return [medqaro_prompt(q, data.context(c)) for q, c in zip(items["question"],
                                                              items["context_id"], strict=True)]


def dry_run_report(spec: str, data: PreparedData, items: pd.DataFrame, *, shots: int,
                   seed: int, show: int = 2) -> dict:
    """Rendered prompts (MedQARo epicrises elided: clinical text), count, token/cost estimate."""
    from medray.eval.mcq_run import example_dict, pick_shots

    parsed = parse_spec(spec)
    shown, in_tok, out_tok, n_images = [], 0, 0, 0
    if data.kind == "mcq":
        shot_sets = {k: pick_shots(data.examples, k, shots, seed) for k in set(items["kind"])}
        for i, (_, row) in enumerate(items.iterrows()):
            ex = example_dict(row)
            p = render(ex, shot_sets, False)
            in_tok += estimate_tokens(p.text) + IMAGE_TOKENS_ESTIMATE * len(ex["images"])
            out_tok += MAX_TOKENS.get((ex["dataset"], ex["kind"]), 10)
            n_images += len(ex["images"])
            if i < show:
                shown.append(p.messages())
    else:
        for i, prompt in enumerate(_generative_prompts(data, items)):
            in_tok += estimate_tokens(prompt)
            out_tok += GENERATIVE_PROMPT.max_new_tokens
            if i < show:
                q = items["question"].iloc[i]
                shown.append([{"role": "user", "content": medqaro_prompt(
                    q, f"[epicrisis elided: {len(prompt)} chars of clinical text]")}])
    cost = cost_usd(parsed.target, in_tok, out_tok) if parsed.external else 0.0
    return {"dry_run": True, "engine": str(parsed), "dataset": data.dataset,
            "n_items": int(len(items)), "n_images": n_images, "prompts": shown,
            "estimate": {"input_tokens": in_tok, "output_tokens_max": out_tok,
                         "cost_usd_max": None if cost is None else round(cost, 4),
                         "how": f"~{4} characters per token, {IMAGE_TOKENS_ESTIMATE} tokens "
                                "per image, every item at its max output tokens; list "
                                f"prices as of {PRICES_AS_OF}; a cached answer costs 0"}}


def run_generative(engine: Any, data: PreparedData, items: pd.DataFrame, out: Path,
                   max_new_tokens: int = GENERATIVE_PROMPT.max_new_tokens,
                   mode: str = "medqaro") -> dict:
    from medray.eval.metrics.aggregate import score_generative

    done = runio.done_ids(out / runio.PREDICTIONS)
    todo = items[~items["id"].isin(done)].reset_index(drop=True)
    writer = runio.PredictionWriter(out / runio.PREDICTIONS)
    is_api = hasattr(engine, "chat")
    for start in range(0, len(todo), 16):
        batch = todo.iloc[start:start + 16]
        prompts = _generative_prompts(data, batch)
        gens = engine.generate(prompts, max_new_tokens=max_new_tokens) if not is_api else \
            engine.chat([_req(p) for p in prompts], max_new_tokens=max_new_tokens)
        rows = []
        for (_, item), gen in zip(batch.iterrows(), gens, strict=True):
            ex = {"id": item["id"]}
            rows.append(runio.prediction_row(engine, ex, gen.text.strip(), gen, True,
                                             prompt_format="qea:full"))
        writer.append(rows)
        log.info("answered %d/%d items", start + len(batch), len(todo))
    preds = runio.read_predictions(out / runio.PREDICTIONS)
    table = items[items["id"].isin(preds)].reset_index(drop=True).copy()
    table["prediction"] = [preds[i]["prediction"] for i in table["id"]]
    table["answers"] = [[a] for a in table["answer"]]
    return score_generative(table, mode=mode, by=["question_type"])


def _req(prompt: str) -> Any:
    from medray.engines.api import ChatRequest

    return ChatRequest(None, prompt)


def run_external_eval(
    engine_spec: str,
    data_dir: str | Path,
    output: str | Path,
    *,
    base_url: str | None = None,
    sample: int | None = None,
    seed: int = 0,
    dry_run: bool = False,
    allow_external_api: bool = False,
    shots: int = 0,
    split: str = "test",
    cache: str | Path | None = None,
    group_as_multiple: bool = False,
    engine: Any = None,
    engine_kwargs: dict | None = None,
    progress: Any = None,
) -> dict:
    """Evaluate `engine_spec` on the prepared dataset; returns (and writes) the metrics.

    Raises GovernanceError (CLI: exit 2) before anything is sent when clinical data would go
    to an external provider without `allow_external_api`. `engine` injects a built engine.
    """
    spec = parse_spec(engine_spec)
    data = load_prepared(data_dir)
    try:
        governance = check_external_use(data.dataset, spec, allow_external_api, base_url)
    except GovernanceError as err:
        if not dry_run:  # a dry run sends nothing: it says the flag would be needed
            raise
        governance = {"flag_required": True, "would_refuse": str(err)}
    if data.kind == "generative" and not spec.external and engine is None:
        raise ValueError(
            f"engine {spec}: `medray eval --engine {spec.provider}:...` is for multiple-choice "
            f"data (RoBiology, EuropeMedQA) and API baselines; {data.dataset} is generative. "
            "Evaluate a local model on it with `medray eval --config EVAL.yaml` "
            "(engine.kind: vllm or serve; see configs/eval-vllm.yaml), which trims each "
            "epicrisis to the context budget as training did")
    items = _items(data, split, sample, seed)
    if dry_run:
        report = dry_run_report(str(spec), data, items, shots=shots, seed=seed)
        report["governance"] = governance
        return report
    out = Path(output)
    settings = {"task": data.kind, "engine": str(spec), "base_url": base_url,
                "dataset": data.dataset, "data": str(Path(data_dir).resolve()), "split": split,
                "shots": shots, "sample": sample, "seed": seed,
                "group_as_multiple": group_as_multiple, "governance": governance}
    runio.check_run(out, settings)
    built = engine is None
    if engine is None:
        from medray.engines.registry import build_engine

        kwargs = dict(engine_kwargs or {})
        if spec.external:
            kwargs.update(base_url=base_url, cache=cache or default_cache_path())
        engine = build_engine(spec, **kwargs)
    if data.kind == "mcq":
        counts = run_mcq(engine, items, data.examples, out, shots=shots, seed=seed,
                         group_as_multiple=group_as_multiple, progress=progress)
        metrics = mcq_metrics(items, out, skipped_images=counts["skipped_images"],
                              group_as_multiple=group_as_multiple, seed=seed)
        whole = data.split(split)  # the keys as prepared (after any option shuffling)
        metrics["key_distribution_split"] = {"split": split, "n": int(len(whole)),
                                             "counts": letter_counts(whole["answer"])}
        metrics["shuffle"] = data.manifest.get("shuffle")
        metrics["prompt"] = (f"mcq prompt per kind ({data.dataset}), {shots}-shot"
                             + (f" (train-split shots, seed {seed})" if shots else "")
                             + ("; group items asked as multiple choice over the statements"
                                if group_as_multiple else ""))
    else:
        counts = {}
        metrics = run_generative(engine, data, items, out)
        metrics["prompt"] = (f"qea (question, whole epicrisis, answer), 0-shot, at most "
                             f"{GENERATIVE_PROMPT.max_new_tokens} new tokens")
    usage = engine.usage.summary() if hasattr(engine, "usage") else None
    metrics.update(
        dataset=data.dataset, split=split, engine=str(spec),
        model=str(getattr(engine, "model", spec.target)), shots=shots,
        sample={"n": int(len(items)), "seed": seed, "of": int(len(data.split(split)))}
        if sample else None,
        engine_settings=engine.describe() if hasattr(engine, "describe") else None,
        governance=governance, usage=usage,
        calls={"asked_this_run": counts.get("asked"), "already_done": counts.get("already_done")},
    )
    runio.write_json_atomic(out / runio.METRICS, metrics)
    if built and hasattr(engine, "close"):
        # A local vLLM engine left to interpreter exit can abort in its messaging layer
        # (exit 134 after the results were written): stop it while the process is whole.
        engine.close()
    return metrics


def summary_lines(m: dict) -> list[str]:
    """Human lines: every number says how it was computed (engine, model, split, n, sample,
    prompt and shots, scoring)."""
    if m.get("dry_run"):
        e = m["estimate"]
        return [f"dry run: {m['engine']} on {m['dataset']}: {m['n_items']} items, "
                f"{m['n_images']} images; estimated input tokens {e['input_tokens']}, "
                f"output tokens at most {e['output_tokens_max']}, cost at most "
                f"{e['cost_usd_max']} USD ({e['how']})"
                + ("; a real run would need " + FLAG + " (clinical data to an external "
                   "provider); nothing was sent" if (m.get("governance") or {}).get(
                       "would_refuse") else "")]
    model = f" (model {m['model']})" if m.get("model") and m["model"] not in m["engine"] else ""
    head = (f"{m['engine']}{model} on {m['dataset']} split {m['split']}, n={m['n']}"
            + (f" (seeded sample {m['sample']['n']} of {m['sample']['of']}, seed "
               f"{m['sample']['seed']})" if m.get("sample") else "")
            + (f"; prompt: {m['prompt']}" if m.get("prompt") else ""))
    lines = [head, *(_mcq_lines(m) if m.get("kind") == "mcq" else _generative_lines(m))]
    u = m.get("usage")
    if u:
        lines.append(f"API calls: {u['calls']} new, {u['cached']} from the response cache; "
                     f"tokens {u['input_tokens']} in / {u['output_tokens']} out (provider-"
                     f"reported, new calls); cost {u['cost_usd']} USD at list prices as of "
                     f"{u['prices_as_of']}")
    return lines


def _ci(block: dict) -> str:
    lo, hi = block.get("ci95") or (None, None)
    if _f(block.get("mean")) == "n/a":
        return "n/a (nothing to average)"
    return f"{_f(block['mean'])} [95% CI {_f(lo)}, {_f(hi)}]"


def _mcq_lines(m: dict) -> list[str]:
    ci = m.get("how", {}).get("ci", {})
    boot = (f"percentile bootstrap over items, {ci.get('resamples')} resamples, seed "
            f"{ci.get('seed')}")
    lines = [f"accuracy {_ci(m['metrics']['accuracy'])}: exact set of letters (all-correct "
             f"rule), {m['n_conforming']} conforming of {m['n']} outputs, "
             f"{m['n_nonconforming']} non-conforming excluded; {boot}; "
             f"{m['n_skipped_images']} image items skipped (images go to API engines only)"]
    for kind, b in sorted(m.get("per_kind", {}).items()):
        lines.append(f"  {kind}: accuracy {_ci(b['metrics']['accuracy'])}, {b['n_conforming']} "
                     f"conforming of {b['n']}")
    shuffle = m.get("shuffle") or {}
    how = (f"options shuffled per item, seed {shuffle.get('seed')}" if shuffle.get("enabled")
           else "options as released (no shuffle)")
    lines.append(f"gold-key letters ({how}), of the {m['n']} scored "
                 f"items: {_counts(m['key_distribution'])}")
    whole = m.get("key_distribution_split")
    if whole:
        lines.append(f"gold-key letters over the whole {whole['split']} split "
                     f"({whole['n']} items): {_counts(whole['counts'])}")
    if "loglik" in m:
        ll = m["loglik"]
        lines.append(f"option log-likelihood (single-answer items, n={ll['n']}, argmax of "
                     f"summed log-prob / of log-prob per character): acc {_ci(ll['acc'])}, "
                     f"acc_norm {_ci(ll['acc_norm'])}; {boot}")
    return lines


def _generative_lines(m: dict) -> list[str]:
    ci = m.get("how", {}).get("ci", {})
    boot = (f"percentile bootstrap over {ci.get('unit', 'item')}s, {ci.get('resamples')} "
            f"resamples, seed {ci.get('seed')}")
    scores = ", ".join(f"{label} {_ci(m['metrics'][name])}" for name, label in
                       (("f1", "F1"), ("em", "EM")) if isinstance(m["metrics"].get(name), dict))
    return [f"{scores} (metric mode {m['mode']}; {boot})"]


def _counts(counts: dict) -> str:
    total = sum(counts.values()) or 1
    return ", ".join(f"{k} {v} ({100 * v / total:.0f}%)" for k, v in sorted(counts.items()))


def _f(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.4f}"
