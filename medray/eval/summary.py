"""Human lines for a run's metrics.json (`medray eval`, `medray ensemble`): every number says
how it was computed (engine, model, split, n, sample, prompt and shots, scoring)."""

from __future__ import annotations

import numpy as np

from medray.eval.governance import FLAG


def dry_run_lines(m: dict) -> list[str]:
    e = m["estimate"]
    return [f"dry run: {m['engine']} on {m['dataset']}: {m['n_items']} items, "
            f"{m['n_images']} images; estimated input tokens {e['input_tokens']}, "
            f"output tokens at most {e['output_tokens_max']}, cost at most "
            f"{e['cost_usd_max']} USD ({e['how']})"
            + ("; a real run would need " + FLAG + " (clinical data to an external "
               "provider); nothing was sent" if (m.get("governance") or {}).get(
                   "would_refuse") else "")]


def head_line(run: dict) -> str:
    spec = run.get("engine_spec") or run["engine"]
    model = f" (model {run['model']})" if run.get("model") and run["model"] not in spec else ""
    sample = run.get("sample")
    return (f"{spec}{model} on {run['dataset']} split {run['split']}, n={run['n']}"
            + (f" (seeded sample {sample['n']} of {sample['of']}, seed {sample['seed']})"
               if sample else "")
            + (f"; prompt: {run['prompt']}" if run.get("prompt") else ""))


def summary_lines(m: dict) -> list[str]:
    if m.get("dry_run"):
        return dry_run_lines(m)
    lines = [head_line(m["run"])]
    for result in m["metrics"].values():
        lines += mcq_lines(result, m) if result.get("kind") == "mcq" else generative_lines(result)
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


def mcq_lines(r: dict, m: dict) -> list[str]:
    ci = r.get("how", {}).get("ci", {})
    boot = (f"percentile bootstrap over items, {ci.get('resamples')} resamples, seed "
            f"{ci.get('seed')}")
    lines = [f"accuracy {_ci(r['metrics']['accuracy'])}: exact set of letters (all-correct "
             f"rule), {r['n_conforming']} conforming of {r['n']} outputs, "
             f"{r['n_nonconforming']} non-conforming excluded; {boot}; "
             f"{r.get('n_skipped_images', 0)} image items skipped (images go to API engines "
             "and vision-language models only)"]
    for kind, b in sorted(r.get("per_kind", {}).items()):
        lines.append(f"  {kind}: accuracy {_ci(b['metrics']['accuracy'])}, {b['n_conforming']} "
                     f"conforming of {b['n']}")
    shuffle = m.get("shuffle") or {}
    how = (f"options shuffled per item, seed {shuffle.get('seed')}" if shuffle.get("enabled")
           else "options as released (no shuffle)")
    if "key_distribution" in r:
        lines.append(f"gold-key letters ({how}), of the {r['n']} scored "
                     f"items: {_counts(r['key_distribution'])}")
    whole = m.get("key_distribution_split")
    if whole:
        lines.append(f"gold-key letters over the whole {whole['split']} split "
                     f"({whole['n']} items): {_counts(whole['counts'])}")
    if "loglik" in r:
        ll = r["loglik"]
        lines.append(f"option log-likelihood (single-answer items, n={ll['n']}, argmax of "
                     f"summed log-prob / of log-prob per character): acc {_ci(ll['acc'])}, "
                     f"acc_norm {_ci(ll['acc_norm'])}; {boot}")
    return lines


def generative_lines(r: dict) -> list[str]:
    ci = r.get("how", {}).get("ci", {})
    boot = (f"percentile bootstrap over {ci.get('unit', 'item')}s, {ci.get('resamples')} "
            f"resamples, seed {ci.get('seed')}")
    scores = ", ".join(f"{label} {_ci(r['metrics'][name])}" for name, label in
                       (("f1", "F1"), ("em", "EM")) if isinstance(r["metrics"].get(name), dict))
    return [f"{scores} (metric mode {r['mode']}; {boot})"]


def _counts(counts: dict) -> str:
    total = sum(counts.values()) or 1
    return ", ".join(f"{k} {v} ({100 * v / total:.0f}%)" for k, v in sorted(counts.items()))


def _f(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.4f}"
