"""`medray eval`: stream a split through a pool of evaluation actors, keep every prediction
as it arrives, resume where a previous run stopped, then score in parallel.

DIR/predictions.jsonl  one row per id, appended (and flushed) as each answer arrives
DIR/metrics.json       `medray score` results per metric mode (+ CIs, breakdowns), atomic
DIR/config.json        the validated config of the run

Resuming: ids already in predictions.jsonl are filtered out of the Ray Data stream before
any request is made; a torn last line (a crash mid-write) is dropped first.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from medray.eval.config import EvalConfig
from medray.fsutil import claim_directory, write_json_atomic, write_jsonl_atomic

log = logging.getLogger(__name__)
PREDICTIONS = "predictions.jsonl"
METRICS = "metrics.json"


def finished_ids(path: Path) -> set[str]:
    """Ids with a complete row; truncates a torn trailing line so appends stay valid JSONL."""
    if not path.exists():
        return set()
    done: set[str] = set()
    good = 0
    with path.open("rb") as f:
        for raw in f:
            try:
                row = json.loads(raw)
            except json.JSONDecodeError:
                break
            if not raw.endswith(b"\n"):
                break
            done.add(str(row["id"]))
            good += len(raw)
    if good != path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(good)
    return done


def _pending_rows(cfg: EvalConfig, done: set[str]):
    """Ray Data reads the split from the prepared examples table, minus finished ids."""
    from ray.data.expressions import col

    from medray.data.prepared import read_table

    # An expression filter (not a Python lambda): Ray Data can push it into the read.
    ds = read_table(cfg.data, "examples")
    ds = ds.filter(expr=col("split") == cfg.split)
    rows = list(ds.iter_rows())  # one split: small enough to hold its rows
    rows.sort(key=_id_order)
    if cfg.limit:
        rows = rows[: cfg.limit]
    selected = [str(r["id"]) for r in rows]
    return [_plain(r) for r in rows if str(r["id"]) not in done], selected


def _id_order(row: dict[str, Any]) -> tuple[int, int, str]:
    """Table order: "<split>:<index>" ids by index, anything else by string."""
    tail = str(row["id"]).rsplit(":", 1)[-1]
    return (0, int(tail), "") if tail.isdigit() else (1, 0, str(row["id"]))


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """Arrow/numpy values -> JSON-able Python (options arrive as numpy arrays)."""
    import numpy as np

    def conv(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return [conv(x) for x in v.tolist()]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, list):
            return [conv(x) for x in v]
        return v.item() if isinstance(v, np.generic) else v

    return {k: conv(v) for k, v in row.items()}


def worker_class(cfg: EvalConfig, max_concurrency: int) -> Any:
    """The evaluation actor class with its resource request (GPUs for vLLM on GPU)."""
    import ray

    from medray.eval.actors import EvalWorker

    return ray.remote(**cfg.engine.actor_options(), max_concurrency=max_concurrency)(EvalWorker)


def predict_all(cfg: EvalConfig, out: Path,
                on_prediction: Callable[[dict], None] | None = None,
                on_plan: Callable[[dict], None] | None = None) -> dict[str, int]:
    """Send pending items through `cfg.actors` actors with <= `cfg.max_in_flight` in flight.
    `on_plan(stats)` hears the item counts before the first request (a progress bar)."""
    import ray

    out.mkdir(parents=True, exist_ok=True)
    pred_path = out / PREDICTIONS
    done = finished_ids(pred_path)
    pending, selected = _pending_rows(cfg, done)
    stats = {"selected": len(selected), "resumed": len(done & set(selected)),
             "requested": 0, "written": 0}
    if on_plan is not None:
        on_plan(stats)
    if not pending:
        return stats
    n_actors = min(cfg.actors, len(pending))
    # vLLM's offline engine is not thread-safe: two threads in one actor calling it at once
    # abort the process, so an in-process vLLM actor takes one request at a time.
    per_actor = 1 if cfg.engine.kind == "vllm" else max(1, -(-cfg.max_in_flight // n_actors))
    worker_cls = worker_class(cfg, per_actor)
    config = cfg.model_dump(mode="json")
    # The API key is read here and handed to the actors, never written to config.json.
    api_key = os.environ.get(cfg.engine.api_key_env) if cfg.engine.kind == "serve" else None
    actors = [worker_cls.remote(config, api_key) for _ in range(n_actors)]
    ray.get([a.ready.remote() for a in actors])
    queue = list(reversed(pending))
    in_flight: dict[Any, int] = {}
    load = [0] * n_actors
    try:
        with pred_path.open("a", encoding="utf-8") as f:
            while queue or in_flight:
                while queue and len(in_flight) < cfg.max_in_flight:
                    i = min(range(n_actors), key=load.__getitem__)  # least-loaded actor
                    in_flight[actors[i].predict.remote(queue.pop())] = i
                    load[i] += 1
                    stats["requested"] += 1
                ready, _ = ray.wait(list(in_flight), num_returns=1)
                for ref in ready:
                    load[in_flight.pop(ref)] -= 1
                    row = ray.get(ref)
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                    stats["written"] += 1
                    if on_prediction is not None:
                        on_prediction(row)
    finally:
        for ref in in_flight:
            ray.cancel(ref, force=False)
        for a in actors:
            ray.kill(a)
    return stats


def _score_one(pred_path: str, data: str, split: str, mode: str, refs: str | None,
               spec: dict[str, Any]) -> dict:
    from medray.eval.score import run_score

    return run_score(
        pred_path, refs, None if refs else data, mode=mode, by=spec["by"],
        splits=None if refs else [split], n_resamples=spec["resamples"], seed=spec["seed"],
        use_wordnet=spec["wordnet"],
    )


def score_run(cfg: EvalConfig, out: Path) -> dict[str, Any]:
    """Score with the same function as `medray score`, one Ray task per metric mode."""
    import ray

    from medray.data.prepared import load_prepared

    pred_path = out / PREDICTIONS
    refs = None
    data = load_prepared(cfg.data)
    if cfg.limit:  # a subset: references restricted to the ids that were predicted
        ids = finished_ids(pred_path)
        ex = data.split(cfg.split)
        ex = ex[ex["id"].astype(str).isin(ids)]
        refs_path = out / "references.jsonl"
        write_jsonl_atomic(refs_path, (_plain(rec) for rec in ex.to_dict("records")))
        refs = str(refs_path)
    modes = cfg.score.modes if data.kind == "generative" else ["medqaro"]
    task = ray.remote(num_cpus=0.5)(_score_one)
    spec = cfg.score.model_dump()
    refs_ = [task.remote(str(pred_path), str(cfg.data), cfg.split, m, refs, spec) for m in modes]
    results = dict(zip(modes, ray.get(refs_), strict=True))
    return results


def run_eval(cfg: EvalConfig, out: str | os.PathLike,
             on_prediction: Callable[[dict], None] | None = None,
             on_plan: Callable[[dict], None] | None = None) -> dict[str, Any]:
    out = Path(out)
    claim_directory(out, inputs=[cfg.data], command="eval")
    write_json_atomic(out / "config.json", cfg.model_dump(mode="json"))
    stats = predict_all(cfg, out, on_prediction, on_plan)
    metrics = score_run(cfg, out)
    summary = {
        "run": {"dataset": json.loads((Path(cfg.data) / "manifest.json").read_text())["dataset"],
                "split": cfg.split, "engine": cfg.engine.kind, "model": cfg.engine.label,
                "adapter": cfg.engine.adapter, "fine_tuned": _fine_tuned(cfg),
                "prompt_format": cfg.prompt_format, "context_tokens": _context_tokens(cfg),
                "strategy": cfg.strategy, "n": stats["selected"]},
        "requests": stats,
        "metrics": metrics,
    }
    write_json_atomic(out / METRICS, summary)
    return summary


def _fine_tuned(cfg: EvalConfig) -> bool:
    if cfg.fine_tuned is not None:
        return cfg.fine_tuned
    return cfg.engine.adapter is not None


def _context_tokens(cfg: EvalConfig) -> int | None:
    """What the run's model saw: baselines read N tokens (random) or nothing (majority)."""
    if cfg.engine.kind != "baseline":
        return cfg.context_tokens
    return cfg.engine.tokens if cfg.engine.baseline == "random-token" else None
