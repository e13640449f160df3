"""Load test of /v1/qa: requests/s and p50/p95/p99 latency at concurrency 1, 4, 16 with 1 and
2 LLM replicas, in one run, on 127.0.0.1 only.

    .venv/bin/python bench/serve_load.py [--model PATH] [--requests 48] [--seconds 60]

Each (replicas, concurrency) cell sends at most --requests requests and stops sending after
--seconds; latency is client-side wall time per request (httpx, keep-alive), rps = completed
requests / cell wall time. Questions and epicrises come from the synthetic MedQARo test
split (trim strategy, Q+E+A, --context-tokens). Default model: the tiny random Llama (vLLM on
CPU here), so the numbers measure serving overhead, not answer quality. Ratios are against
1 replica at concurrency 1.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import tempfile
import time
from pathlib import Path

from _tiny import BENCH_KEY as KEY
from _tiny import local_serve, percentile, prepared_and_model


async def _cell(url: str, items: list[tuple[str, str]], concurrency: int, n: int,
                seconds: float, context_tokens: int) -> dict:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    lat: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal errors
        async with sem:
            if time.perf_counter() > deadline:
                return
            q, ctx = items[i % len(items)]
            t0 = time.perf_counter()
            r = await client.post("/v1/qa", json={"question": q, "context": ctx,
                                                  "context_tokens": context_tokens})
            if r.status_code == 200:
                lat.append(time.perf_counter() - t0)
            else:
                errors += 1

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits,
                                 headers={"Authorization": f"Bearer {KEY}"}) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, i) for i in range(n)))
        wall = time.perf_counter() - t0
    return {"n": len(lat), "errors": errors, "rps": len(lat) / wall,
            "p50": percentile(lat, 50), "p95": percentile(lat, 95), "p99": percentile(lat, 99)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model path (default: build the tiny model)")
    ap.add_argument("--requests", type=int, default=48, help="max requests per cell")
    ap.add_argument("--seconds", type=float, default=60, help="max sending time per cell")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--replicas", default="1,2")
    ap.add_argument("--context-tokens", type=int, default=256)
    ap.add_argument("--work", default=None, help="folder for data/model (default: temp)")
    args = ap.parse_args()

    import os

    import ray
    from ray import serve

    from medray.data.prepared import load_prepared
    from medray.serve.app import build_app
    from medray.serve.config import AppConfig

    work = Path(args.work or tempfile.mkdtemp(prefix="medray-bench-"))
    data_dir, model = prepared_and_model(work, args.model)
    data = load_prepared(data_dir)
    test = data.split("test")
    items = [(q, data.context(c)) for q, c in zip(test["question"], test["context_id"],
                                                 strict=True)]
    url = local_serve(num_cpus=4)
    results = []
    for replicas in [int(x) for x in args.replicas.split(",")]:
        cfg = AppConfig(model=model, device="cpu", max_model_len=1024,
                        prompt={"context_tokens": args.context_tokens},
                        api_keys_env="MEDRAY_BENCH_KEYS",
                        llm={"num_replicas": replicas, "num_cpus": 1})
        t0 = time.perf_counter()
        serve.run(build_app(cfg), name="medray", route_prefix="/")
        print(f"# {replicas} replica(s) up in {time.perf_counter() - t0:.0f} s", flush=True)
        asyncio.run(_cell(url, items, 2, 4, 60, args.context_tokens))  # warm-up
        for conc in [int(x) for x in args.concurrency.split(",")]:
            res = asyncio.run(_cell(url, items, conc, args.requests, args.seconds,
                                    args.context_tokens))
            results.append({"replicas": replicas, "concurrency": conc, **res})
            print(results[-1], flush=True)
        serve.delete("medray")
    serve.shutdown()
    ray.shutdown()

    base = results[0]["rps"] or float("nan")
    print(f"\n/v1/qa load, model={Path(model).name}, trim Q+E+A {args.context_tokens} tokens, "
          f"max_new_tokens 10, <= {args.requests} requests or {args.seconds:.0f} s per cell, "
          f"127.0.0.1, {os.cpu_count()} cores")
    print(f"{'replicas':>8} {'conc':>5} {'n':>4} {'err':>4} {'rps':>7} {'x rps':>6} "
          f"{'p50 s':>7} {'p95 s':>7} {'p99 s':>7}")
    for r in results:
        print(f"{r['replicas']:>8} {r['concurrency']:>5} {r['n']:>4} {r['errors']:>4} "
              f"{r['rps']:>7.2f} {r['rps'] / base:>6.2f} {r['p50']:>7.3f} {r['p95']:>7.3f} "
              f"{r['p99']:>7.3f}")
    from _results import write_results

    top = max(results, key=lambda r: r["rps"])
    write_results("serve_load", {
        "headline": f"`/v1/qa` serves up to {top['rps']:.1f} requests/s ({top['replicas']} "
                    f"replica(s), concurrency {top['concurrency']}, p95 {top['p95']:.2f} s) "
                    "with the tiny model",
        "tables": [{"title": f"trim Q+E+A {args.context_tokens} tokens, max_new_tokens 10, at "
                             f"most {args.requests} requests or {args.seconds:.0f} s per cell, "
                             "127.0.0.1",
                    "columns": ["replicas", "concurrency", "n", "errors", "rps", "x rps",
                                "p50 s", "p95 s", "p99 s"],
                    "rows": [[r["replicas"], r["concurrency"], r["n"], r["errors"], r["rps"],
                              r["rps"] / base, r["p50"], r["p95"], r["p99"]]
                             for r in results]}],
    }, command=shlex.join(["bench/serve_load.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
