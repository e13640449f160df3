"""Prefix reuse: evaluation throughput when a patient's questions share the epicrisis as a
prompt PREFIX (E+Q+A, vLLM automatic prefix caching) against Q+E+A (question first, so no
shared prefix), with vLLM's prefix-cache hit rate, the prefill tokens it computed against
those submitted, and the F1 of each, in one run.

    .venv/bin/python bench/prefix_reuse.py [--shape prefill|small] [--model PATH [--adapter PATH]]

Shapes:
- ``prefill`` (default): where prefix reuse matters. Synthetic MedQARo at the paper's
  question density (``scale=paper``: 96 breast / 122 lung questions per patient), epicrises
  of 1,200-1,300 words (over 2,048 tokens) trimmed to --context-tokens (2,048), the test
  split's patients (--patients, 2), and a random-init model wide and deep enough that
  prefill dominates (hidden 256, 4 layers, 4 heads of 64, vocabulary <= 2,048).
- ``small``: the synthetic small corpus and the tiny model (hidden 128, 2 layers), 96
  items, 768 tokens: decode and per-request overhead dominate there.

Offline vLLM engine (medray.engines.vllm), greedy, max_new_tokens 10, prompts assembled by
medray.prompts.tokens.build_prompt_ids (trim), items ordered by patient and sent as
`medray eval` sends them to an in-process engine (medray.eval.plan.EvalPlan.engine_calls):
one engine call per patient (at most 128 items) for E+Q+A, the same calls for Q+E+A so only
the prompt order differs. Rows: Q+E+A and E+Q+A on ONE engine with prefix caching on (the
cache reset between rows), plus (--no-cache-row) E+Q+A on a second engine with caching off.
Hit rate: vLLM's prefix_cache_hits / prefix_cache_queries (tokens) over the row; prefill
computed = prompt tokens submitted - cache hits. F1: medqaro mode, mean over items (a
random-init model answers nonsense, F1 ~ 0: pass a trained --model to compare F1).
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import sys
import tempfile
import time
from pathlib import Path

from _tiny import prepared_and_model

PREFILL_MODEL = {"vocab_size": 2048, "hidden_size": 256, "n_layers": 4, "n_heads": 4,
                 "intermediate_size": 688}


def prefill_shape(work: Path, model: str | None, patients: int) -> tuple[Path, str]:
    """Paper-density synthetic MedQARo with epicrises over 2,048 tokens, and the wider model."""
    from medray.data.prepare import prepare
    from medray.data.synth import write_medqaro
    from medray.models import build_tiny_model, corpus_from_prepared

    data = work / "data-prefill"
    if not (data / "manifest.json").exists():
        raw = write_medqaro(work / "raw-prefill", seed=0, scale="paper", words=(1200, 1300),
                            n_patients={"train": 2, "val": 1, "test": patients,
                                        "test_cross": 1})
        prepare("medqaro", raw, data)
    if model is None:
        model_dir = work / "model-prefill"
        if not (model_dir / "config.json").exists():
            build_tiny_model(model_dir, corpus_from_prepared(data), seed=0, **PREFILL_MODEL)
        model = str(model_dir)
    return data, model


def _cache_counters(engine) -> dict[str, float]:
    wanted = {"vllm:prefix_cache_queries": "queries", "vllm:prefix_cache_hits": "hits"}
    out = dict.fromkeys(wanted.values(), 0.0)
    for metric in engine.llm.get_metrics():
        if metric.name in wanted:
            out[wanted[metric.name]] += float(metric.value)
    return out


def _run(engine, tok, calls, fmt: str, context_tokens: int) -> dict:
    from medray.eval.metrics.generative import f1_medqaro
    from medray.prompts.spec import PromptSpec
    from medray.prompts.tokens import build_prompt_ids, encode_context

    spec = PromptSpec(format=fmt, context_tokens=context_tokens)  # reserve: 10 new tokens
    cache: dict[str, list[int]] = {}
    prompt_calls = []
    for call in calls:
        prompts = []
        for q, cid, ctx, _ in call:
            if cid not in cache:
                cache[cid] = encode_context(tok, ctx)
            prompts.append(build_prompt_ids(tok, q, cache[cid], spec))
        prompt_calls.append(prompts)
    before = _cache_counters(engine)
    t0 = time.perf_counter()
    gens = []
    for prompts in prompt_calls:
        gens += engine.generate(prompts, max_new_tokens=10)
    wall = time.perf_counter() - t0
    after = _cache_counters(engine)
    items = [item for call in calls for item in call]
    f1 = sum(f1_medqaro(g.text.strip(), ans) for g, (*_, ans) in zip(gens, items, strict=True))
    submitted = sum(len(p) for prompts in prompt_calls for p in prompts)
    hits, queries = after["hits"] - before["hits"], after["queries"] - before["queries"]
    return {"items/s": len(items) / wall, "wall": wall, "f1": f1 / len(items),
            "prompt_tokens": submitted / len(items), "hit_rate": hits / queries if queries else 0,
            "prefill_submitted": submitted, "prefill_computed": submitted - int(hits)}


def patient_calls(items: list[tuple], per_call: int) -> list[list[tuple]]:
    """One patient's items per call (items are in patient order), at most `per_call` each:
    the shape whose prefix reuse this bench measures."""
    calls = []
    for _, group in itertools.groupby(items, key=lambda item: item[1]):
        group = list(group)
        calls += [group[i:i + per_call] for i in range(0, len(group), per_call)]
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=["prefill", "small"], default="prefill")
    ap.add_argument("--model", default=None)
    ap.add_argument("--adapter", default=None)
    ap.add_argument("--patients", type=int, default=2, help="prefill shape: test patients")
    ap.add_argument("--items", type=int, default=None,
                    help="first N items (default: all of the prefill shape, 96 for small)")
    ap.add_argument("--context-tokens", type=int, default=None,
                    help="default 2048 (prefill) / 768 (small)")
    ap.add_argument("--no-cache-row", action="store_true", help="also E+Q+A without caching")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()

    from medray.data.prepared import load_prepared
    from medray.engines.vllm import VLLMEngine
    from medray.eval.plan import PATIENT_CALL

    work = Path(args.work or tempfile.mkdtemp(prefix="medray-bench-"))
    if args.shape == "prefill":
        data_dir, model = prefill_shape(work, args.model, args.patients)
        context_tokens, n_items = args.context_tokens or 2048, args.items
    else:
        data_dir, model = prepared_and_model(work, args.model)
        context_tokens, n_items = args.context_tokens or 768, args.items or 96
    data = load_prepared(data_dir)
    test = data.split("test").sort_values(["context_id", "id"], kind="stable")
    test = test.head(n_items) if n_items else test
    items = [(r.question, r.context_id, data.context(r.context_id), r.answer)
             for r in test.itertuples()]
    n_patients = test["context_id"].nunique()
    calls = patient_calls(items, PATIENT_CALL)

    rows = []
    engine = VLLMEngine(model, adapter=args.adapter, max_model_len=context_tokens + 64,
                        enable_prefix_caching=True, disable_log_stats=False)
    _run(engine, engine.tokenizer, [items[:4]], "qea", context_tokens)  # warm-up
    for fmt, label in (("qea", "Q+E+A, prefix cache on"), ("eqa", "E+Q+A, prefix cache on")):
        engine.llm.reset_prefix_cache()
        rows.append((label, _run(engine, engine.tokenizer, calls, fmt, context_tokens)))
        print(label, rows[-1], flush=True)
    engine.close()
    if args.no_cache_row:
        engine = VLLMEngine(model, adapter=args.adapter, max_model_len=context_tokens + 64,
                            enable_prefix_caching=False, disable_log_stats=False)
        rows.append(("E+Q+A, prefix cache off", _run(engine, engine.tokenizer, calls, "eqa",
                                                     context_tokens)))
        engine.close()

    base = rows[0][1]["items/s"]
    print(f"\nprefix reuse ({args.shape} shape): model={Path(model).name} "
          f"adapter={args.adapter}, {len(items)} test items of {n_patients} patients (ordered "
          f"by patient, {len(calls)} engine calls), trim to {context_tokens} tokens, greedy "
          "10 new tokens")
    print(f"{'setting':<26} {'items/s':>8} {'x':>6} {'wall s':>7} {'prompt tok':>10} "
          f"{'hit rate':>8} {'prefill computed/submitted':>27} {'F1 (medqaro)':>12}")
    for label, r in rows:
        share = r["prefill_computed"] / r["prefill_submitted"]
        print(f"{label:<26} {r['items/s']:>8.2f} {r['items/s'] / base:>6.2f} {r['wall']:>7.1f} "
              f"{r['prompt_tokens']:>10.0f} {r['hit_rate']:>8.3f} "
              f"{r['prefill_computed']:>11,}/{r['prefill_submitted']:<11,} ({share:.1%}) "
              f"{r['f1']:>12.4f}")
    from _results import write_results

    by = dict(rows)
    qea, eqa = by["Q+E+A, prefix cache on"], by["E+Q+A, prefix cache on"]
    write_results("prefix_reuse", {
        "headline": "putting the epicrisis first (E+Q+A) answers "
                    f"{eqa['items/s'] / qea['items/s']:.1f}x the items/s of question-first "
                    "prompts: vLLM reuses the shared prefix "
                    f"(hit rate {eqa['hit_rate']:.2f})",
        "tables": [{"title": f"{args.shape} shape: {len(items)} test items of {n_patients} "
                             f"patients, {len(calls)} engine calls, trimmed to {context_tokens} "
                             "tokens, greedy 10 new tokens",
                    "columns": ["prompt order", "items/s", "x Q+E+A", "prefix-cache hit rate",
                                "prefill computed", "prefill submitted", "F1 (medqaro)"],
                    "rows": [[label, r["items/s"], r["items/s"] / base, r["hit_rate"],
                              int(r["prefill_computed"]), int(r["prefill_submitted"]), r["f1"]]
                             for label, r in rows]}],
        "notes": ["F1 is about 0 with the default random-init model; pass --model for a "
                  "trained one"] if args.model is None else [],
    }, command=shlex.join(["bench/prefix_reuse.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
