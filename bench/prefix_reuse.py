"""Prefix reuse: evaluation throughput when the questions of a patient share the epicrisis as
a prompt PREFIX (E+Q+A, vLLM automatic prefix caching) against Q+E+A (question first, so no
shared prefix), with the F1 of each, in one run.

    .venv/bin/python bench/prefix_reuse.py [--model PATH [--adapter PATH]] [--items 96]

Offline vLLM engine (medray.engines.vllm), greedy, max_new_tokens 10, prompts assembled by
medray.tokenization.build_prompt_ids (trim, --context-tokens), items of the synthetic MedQARo
test split ordered by patient, batches of --batch prompts. Rows: E+Q+A and Q+E+A on ONE
engine with prefix caching on, plus (--no-cache-row) E+Q+A on a second engine with caching
off. F1: medray's medqaro-mode F1 (the metrics helper's f1_medqaro), mean over items. The
default tiny random model answers nonsense (F1 ~ 0): pass a trained model to compare F1.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _tiny import prepared_and_model


def _run(engine, tok, items, fmt: str, context_tokens: int, batch: int) -> dict:
    from medray.eval.metrics.generative import f1_medqaro
    from medray.prompts import PromptSpec
    from medray.tokenization import build_prompt_ids, encode_context

    spec = PromptSpec(format=fmt, context_tokens=context_tokens)  # reserve: 10 new tokens
    cache: dict[str, list[int]] = {}
    prompts = []
    for q, cid, ctx, _ in items:
        if cid not in cache:
            cache[cid] = encode_context(tok, ctx)
        prompts.append(build_prompt_ids(tok, q, cache[cid], spec))
    t0 = time.perf_counter()
    gens = []
    for i in range(0, len(prompts), batch):
        gens += engine.generate(prompts[i : i + batch], max_new_tokens=10)
    wall = time.perf_counter() - t0
    f1 = sum(f1_medqaro(g.text.strip(), ans) for g, (*_, ans) in zip(gens, items, strict=True))
    return {"items/s": len(items) / wall, "wall": wall, "f1": f1 / len(items),
            "prompt_tokens": sum(map(len, prompts)) / len(prompts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--adapter", default=None)
    ap.add_argument("--items", type=int, default=96)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context-tokens", type=int, default=768)
    ap.add_argument("--no-cache-row", action="store_true", help="also E+Q+A without caching")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()

    from medray.data.prepared import load_prepared
    from medray.engines.vllm import VLLMEngine

    work = Path(args.work or tempfile.mkdtemp(prefix="medray-bench-"))
    data_dir, model = prepared_and_model(work, args.model)
    data = load_prepared(data_dir)
    test = data.split("test").sort_values(["context_id", "id"], kind="stable")
    test = test.head(args.items)
    items = [(r.question, r.context_id, data.context(r.context_id), r.answer)
             for r in test.itertuples()]
    n_patients = test["context_id"].nunique()

    rows = []
    engine = VLLMEngine(model, adapter=args.adapter, max_model_len=args.context_tokens + 64,
                        enable_prefix_caching=True)
    _run(engine, engine.tokenizer, items[:4], "qea", args.context_tokens, 4)  # warm-up
    engine.llm.reset_prefix_cache()
    for fmt, label in (("qea", "Q+E+A, prefix cache on"), ("eqa", "E+Q+A, prefix cache on")):
        engine.llm.reset_prefix_cache()
        rows.append((label, _run(engine, engine.tokenizer, items, fmt, args.context_tokens,
                                 args.batch)))
        print(label, rows[-1], flush=True)
    engine.close()
    if args.no_cache_row:
        engine = VLLMEngine(model, adapter=args.adapter, max_model_len=args.context_tokens + 64,
                            enable_prefix_caching=False)
        rows.append(("E+Q+A, prefix cache off", _run(engine, engine.tokenizer, items, "eqa",
                                                     args.context_tokens, args.batch)))
        engine.close()

    base = rows[0][1]["items/s"]
    print(f"\nprefix reuse: model={Path(model).name} adapter={args.adapter}, {len(items)} "
          f"test items of {n_patients} patients (ordered by patient), trim to "
          f"{args.context_tokens} tokens, greedy 10 new tokens, batches of {args.batch}")
    print(f"{'setting':<26} {'items/s':>8} {'x':>6} {'wall s':>7} {'prompt tok':>10} "
          f"{'F1 (medqaro)':>12}")
    for label, r in rows:
        print(f"{label:<26} {r['items/s']:>8.2f} {r['items/s'] / base:>6.2f} {r['wall']:>7.1f} "
              f"{r['prompt_tokens']:>10.0f} {r['f1']:>12.4f}")


if __name__ == "__main__":
    main()
