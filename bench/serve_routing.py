"""Routing with two LLM replicas: Serve's default router against medray's prefix-aware one
(`routing: default | prefix`) on /v1/qa's E+Q+A shape, side by side in one run, on
127.0.0.1 only.

    .venv/bin/python bench/serve_routing.py [--patients 12] [--questions 16]
        [--context-tokens 2048] [--orders shuffled,patient] [--model PATH]

Several patients, many questions each, sent to /v1/qa at --concurrency, in two orders, each
to both routers: shuffled (patients interleaved, as several evaluations or clients at once
send them; the order of the targets), and patient order (as one `medray eval` sends them, a
patient's questions together). The default shape is near a MedQARo test evaluation (about
20 patients, 27 questions each, epicrises past 2,048 tokens) and still runs in minutes on
a small CPU machine: with fewer questions per patient the first, missing question of each
weighs more than in a real evaluation, and with fewer patients one replica's extra patient
decides the run. Per replica: requests, and vLLM's prefix-cache hit rate (prefix-cache hit
tokens / queried tokens at admission, the numbers behind vllm:prefix_cache_hits / _queries,
read from each replica by a stat logger medray adds to its engine); items/s is completed
requests / wall time of the client. "hit ceiling" is the best rate the prompts allow in
the order sent (hit_ceiling). Each replica's KV cache holds about --kv-patients epicrises:
a replica that sees every patient (default router) evicts and prefills epicrises again,
one that sees only its half of them (prefix) keeps them. Data and model:
bench/prefix_reuse.py's prefill shape (synthetic MedQARo epicrises over 2,048 tokens
trimmed to --context-tokens, a random-init model wide enough that prefill dominates),
greedy, max_new_tokens 10.
Targets: prefix hit rate >= 0.85 and >= 1.3x the default router's items/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path

from _tiny import BENCH_KEY as KEY
from _tiny import local_serve, percentile
from prefix_reuse import prefill_shape

TARGET_HIT, TARGET_SPEEDUP = 0.85, 1.3
BLOCK = 128  # vLLM's KV block on CPU (its default there): prefix hits come in whole blocks


def kv_bytes_per_token(model: str) -> int:
    """KV-cache bytes one token takes in every layer (float32 checkpoints stay float32)."""
    cfg = json.loads((Path(model) / "config.json").read_text())
    heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    width = 4 if (cfg.get("torch_dtype") or cfg.get("dtype")) == "float32" else 2
    return cfg["num_hidden_layers"] * 2 * heads * head_dim * width


async def _send(url: str, items: list[tuple[str, str]], concurrency: int) -> dict:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    lat: list[float] = []
    errors = 0
    prompts: list[list[int] | None] = [None] * len(items)

    async def one(client: httpx.AsyncClient, i: int, q: str, ctx: str) -> None:
        nonlocal errors
        async with sem:
            t0 = time.perf_counter()
            r = await client.post("/v1/qa", json={"question": q, "context": ctx,
                                                  "return_prompt_ids": True})
            if r.status_code == 200:
                lat.append(time.perf_counter() - t0)
                prompts[i] = r.json()["prompt_ids"][0]
            else:
                errors += 1

    async with httpx.AsyncClient(base_url=url, timeout=600,
                                 limits=httpx.Limits(max_connections=concurrency),
                                 headers={"Authorization": f"Bearer {KEY}"}) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, i, q, ctx) for i, (q, ctx) in enumerate(items)))
        wall = time.perf_counter() - t0
    return {"n": len(lat), "errors": errors, "wall": wall, "items/s": len(lat) / wall,
            "p50": percentile(lat, 50), "p95": percentile(lat, 95), "prompts": prompts}


def hit_ceiling(items: list[tuple[str, str]], prompts: list[list[int] | None]) -> float:
    """The best prefix-cache hit rate these prompts allow, in this order: a patient's first
    question hits nothing; each later one its longest shared prefix with an earlier one of
    the same patient (the epicrisis), in whole KV blocks, at most all tokens but the last
    (vLLM's rule: it recomputes the last prompt token)."""
    seen: dict[str, list[list[int]]] = {}
    hits = queries = 0
    for (_, ctx), ids in zip(items, prompts, strict=True):
        if ids is None:
            continue
        shared = max((len(os.path.commonprefix([ids, e])) for e in seen.get(ctx, ())),
                     default=0)
        hits += min(shared, len(ids) - 1) // BLOCK * BLOCK
        queries += len(ids)
        seen.setdefault(ctx, []).append(ids)
    return hits / queries if queries else 0.0


def _row(routing: str, model: str, args: argparse.Namespace, kv: int, url: str,
         items: list[tuple[str, str]]) -> dict:
    from ray import serve

    from medray.serve.app import build_app
    from medray.serve.config import AppConfig
    from medray.serve.routing import llm_deployments, replica_cache_stats

    cfg = AppConfig(model=model, device="cpu", max_model_len=args.context_tokens + 256,
                    llm={"num_replicas": 2, "num_cpus": 1}, routing=routing,
                    prefix_routing=({"imbalanced_threshold": args.imbalanced_threshold}
                                    if routing == "prefix" else {}),
                    engine_kwargs={"kv_cache_memory_bytes": kv},
                    prompt={"format": "eqa", "context_tokens": args.context_tokens,
                            "max_new_tokens": 10},
                    api_keys_env="MEDRAY_BENCH_KEYS", ready_cache_s=3600)
    t0 = time.perf_counter()
    serve.run(build_app(cfg), name="medray", route_prefix="/")
    print(f"# {routing}: 2 replicas up in {time.perf_counter() - t0:.0f} s", flush=True)
    # Warm-up: every replica's first full-length prefills (slow on CPU), on contexts no
    # patient's prompt shares a block with; distinct ones, so that the prefix router
    # spreads them over both replicas as the default router does.
    ctx = items[0][1]
    asyncio.run(_send(url, [(f"warm up {i}?", f"warm-up {i}. {ctx}") for i in range(6)], 2))
    (deployment,) = llm_deployments("medray")
    before = replica_cache_stats("medray", deployment)
    res = asyncio.run(_send(url, items, args.concurrency))
    res["ceiling"] = hit_ceiling(items, res.pop("prompts"))
    after = replica_cache_stats("medray", deployment)
    serve.delete("medray")
    replicas = []
    for rid in sorted(after):
        d = {k: after[rid][k] - before.get(rid, {}).get(k, 0) for k in after[rid]}
        replicas.append({**d, "hit_rate": d["hits"] / d["queries"] if d["queries"] else 0.0})
    hits, queries = sum(r["hits"] for r in replicas), sum(r["queries"] for r in replicas)
    return {"routing": routing, **res, "replicas": replicas,
            "hit_rate": hits / queries if queries else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model path (default: the prefill model)")
    ap.add_argument("--patients", type=int, default=12)
    ap.add_argument("--questions", type=int, default=16, help="per patient")
    ap.add_argument("--context-tokens", type=int, default=2048)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--kv-patients", type=float, default=8,
                    help="epicrises (plus their questions) one replica's KV cache holds")
    ap.add_argument("--orders", default="shuffled,patient",
                    help="shuffled: patients interleaved (several evaluations or clients at "
                         "once; the targets' order); patient: one evaluation's order")
    ap.add_argument("--imbalanced-threshold", type=float, default=None,
                    help="prefix_routing.imbalanced_threshold of the prefix rows")
    ap.add_argument("--work", default=None, help="folder for data/model (default: temp)")
    args = ap.parse_args()
    orders = args.orders.split(",")
    if not orders or not set(orders) <= {"shuffled", "patient"}:
        ap.error("--orders: shuffled and/or patient, comma-separated")

    import ray
    from ray import serve

    from medray.data.prepared import load_prepared

    work = Path(args.work or tempfile.mkdtemp(prefix="medray-bench-"))
    data_dir, model = prefill_shape(work, args.model, args.patients)
    data = load_prepared(data_dir)
    test = data.split("test")
    by_patient: dict[str, list[str]] = {}
    for q, cid in zip(test["question"], test["context_id"], strict=True):
        by_patient.setdefault(cid, []).append(q)
    in_order = [(q, data.context(cid)) for cid, qs in sorted(by_patient.items())[:args.patients]
                for q in qs[:args.questions]]
    kv = int(args.kv_patients * (args.context_tokens + 128) * kv_bytes_per_token(model))

    url = local_serve(num_cpus=6)  # 2 x 1.5 CPUs of LLM replicas, 0.5 of ingress
    runs: dict[str, list[dict]] = {}
    for order in orders:
        items = list(in_order)
        if order == "shuffled":
            random.Random(0).shuffle(items)
        for routing in ("default", "prefix"):
            runs.setdefault(order, []).append(_row(routing, model, args, kv, url, items))
            print(order, runs[order][-1], flush=True)
    serve.shutdown()
    ray.shutdown()
    report(runs, args, kv, model)


def report(runs: dict[str, list[dict]], args: argparse.Namespace, kv: int, model: str) -> None:
    columns = ["routing", "n", "errors", "items/s", "x items/s", "hit rate", "hit ceiling",
               "p50 s", "p95 s", "requests per replica", "hit rate per replica"]
    tables, notes, headline = [], [], ""
    for order, (base, prefix) in runs.items():
        speedup = prefix["items/s"] / base["items/s"] if base["items/s"] else float("nan")
        shape = (f"{args.patients} patients x {args.questions} questions, E+Q+A "
                 f"{args.context_tokens} tokens, {order} order, concurrency {args.concurrency},"
                 f" KV cache {kv / 2**20:.0f} MiB per replica (~{args.kv_patients:g} epicrises)")
        rows = [[r["routing"], r["n"], r["errors"], r["items/s"], r["items/s"] / base["items/s"],
                 r["hit_rate"], r["ceiling"], r["p50"], r["p95"],
                 " / ".join(str(x["requests"]) for x in r["replicas"]),
                 " / ".join(f"{x['hit_rate']:.2f}" for x in r["replicas"])]
                for r in (base, prefix)]
        tables.append({"title": shape, "columns": columns, "rows": rows})
        summary = (f"prefix-cache hit rate {prefix['hit_rate']:.2f} (default router "
                   f"{base['hit_rate']:.2f}), {speedup:.2f}x the items/s")
        if order == "shuffled":  # the targets' order: patients interleaved
            headline = ("With 2 LLM replicas and patients interleaved, prefix-aware routing "
                        f"keeps each patient on one replica: {summary}")
            for what, got, want in (("prefix hit rate", prefix["hit_rate"], TARGET_HIT),
                                    ("prefix/default items/s", speedup, TARGET_SPEEDUP)):
                verdict = "met" if got >= want else f"MISSED by {want - got:.2f}"
                notes.append(f"target (shuffled) {what} >= {want:g}: {got:.2f}, {verdict}")
        else:
            notes.append(f"patient order (one evaluation, no target): {summary}")
        print(f"\n/v1/qa routing, model={Path(model).name}, {shape}")
        print(" | ".join(columns))
        for row in rows:
            print(" | ".join(f"{c:.2f}" if isinstance(c, float) else str(c) for c in row))
    notes.append(f"hit ceiling: the rate the prompts allow in the order sent, a patient's first "
                 f"question missing and each later one hitting whole {BLOCK}-token KV blocks "
                 f"of its epicrisis (no eviction, one replica per patient)")
    print("\n".join(notes))
    from _results import write_results

    write_results("serve_routing", {
        "headline": headline or notes[0],
        "tables": tables,
        "notes": notes,
    }, command=shlex.join(["bench/serve_routing.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
