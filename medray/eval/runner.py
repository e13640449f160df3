"""`medray eval`: the one evaluation runner, for every engine: plan, predict, finish.

- plan: read the prepared data, check governance BEFORE any engine exists (so a refused run
  cannot have sent anything), select the items (split, seeded sample, first N), pick the
  shots once, decide what a text-only engine cannot be asked (image items);
- predict: open the run folder (medray/eval/runio.py; a resume must carry the same config),
  skip the ids already answered, and answer the rest with the engine's executor: a pool of
  Ray actors (Serve, vLLM) or in-process (transformers, chat APIs, baselines);
- finish: score with `medray score`'s function (one Ray task per metric mode when Ray is
  up) and write metrics.json, recording how every number was computed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from medray.eval import runio
from medray.eval.config import EXECUTION_ONLY, EvalConfig
from medray.eval.finish import finish_eval
from medray.eval.plan import EvalPlan, default_cache_path, plain_row, plan_eval
from medray.eval.prompting import with_resolved_prompt
from medray.eval.tracked import finish_eval_tracking, start_eval_tracking

__all__ = ["EvalPlan", "plan_eval", "predict", "run_eval", "with_resolved_prompt"]

def config_record(cfg: EvalConfig) -> dict[str, Any]:
    """config.json: the config as given, paths resolved (no key: only the name of its
    variable); `prompt` holds the fields it set (the model's own prompt is in metrics.json)."""
    record = cfg.model_dump(mode="json")
    record["data"] = str(Path(cfg.data).resolve())
    return record


def run_eval(cfg: EvalConfig, out: str | os.PathLike, *, engine: Any = None,
             plan: EvalPlan | None = None,
             on_prediction: Callable[[dict], None] | None = None,
             on_plan: Callable[[dict], None] | None = None,
             on_start: Callable[[], None] | None = None) -> dict[str, Any]:
    """Evaluate, resuming OUT; returns (and writes) metrics.json. `engine` injects a built
    engine (run in-process); `plan` one already made from `cfg`; `on_plan(stats)` hears
    the item counts before the first request, `on_start()` when the engines have started
    and the first request goes out, `on_prediction(row)` every answer."""
    plan = plan or plan_eval(cfg, engine=engine)
    out = Path(out)
    record = config_record(cfg)
    runio.open_run(out, record, inputs=[cfg.data], ignore=EXECUTION_ONLY)
    # MLflow / W&B (cfg.tracking): opened before the first request, so a tracking server
    # that cannot be reached fails the run before it costs anything
    tracker = start_eval_tracking(cfg, record, out)
    with tracker or nullcontext():
        stats, engine_info = predict(plan, out, engine, on_prediction, on_plan, on_start)
        summary = finish_eval(plan, out, stats, **engine_info)
        if tracker is not None:
            finish_eval_tracking(tracker, summary, out)
    return summary


def predict(plan: EvalPlan, out: Path, engine: Any = None,
            on_prediction: Callable[[dict], None] | None = None,
            on_plan: Callable[[dict], None] | None = None,
            on_start: Callable[[], None] | None = None) -> tuple[dict, dict]:
    """Answer every planned item not yet in OUT/predictions.jsonl."""
    cfg = plan.cfg
    pred_path = out / runio.PREDICTIONS
    runio.repair(pred_path)
    done = runio.done_ids(pred_path)
    asked = plan.asked
    pending = [plain_row(r) for r in asked.to_dict("records") if str(r["id"]) not in done]
    stats = {"selected": len(plan.items), "resumed": len(done & set(asked["id"].astype(str))),
             "requested": 0, "written": 0}
    if on_plan is not None:
        on_plan(stats)
    info: dict[str, Any] = {}
    if not pending:
        return stats, info
    with runio.PredictionWriter(pred_path) as writer:
        def write(row: dict) -> None:
            writer.append([row])
            stats["written"] += 1
            if on_prediction is not None:
                on_prediction(row)

        if plan.executor == "ray":
            from medray.eval.actors import run_pool

            # The API key is read here and handed to the actors, never written anywhere.
            key_env = cfg.engine.engine_kwargs().get("api_key_env")
            api_key = os.environ.get(key_env) if cfg.engine.kind == "serve" and key_env \
                else None
            stats.update(run_pool(plan, pending, write, api_key=api_key, on_start=on_start))
        else:
            info = _run_local(plan, pending, engine, write, stats, on_start)
    return stats, info


def _run_local(plan: EvalPlan, pending: list[dict], engine: Any,
               write: Callable[[dict], None], stats: dict,
               on_start: Callable[[], None] | None = None) -> dict[str, Any]:
    from medray.eval.predict import Predictor

    kwargs: dict[str, Any] = {}
    if engine is None and plan.cfg.engine.external:
        kwargs["cache"] = plan.cfg.cache or default_cache_path()
    predictor = Predictor(plan.cfg, plan.data, engine=engine, shots=plan.shots,
                          loglik=plan.loglik, max_new_tokens=plan.max_new_tokens, **kwargs)
    if on_start is not None:
        on_start()
    try:
        for call in plan.engine_calls(pending):
            stats["requested"] += len(call)
            for row in predictor.predict(call):
                write(row)
    finally:
        built = predictor.engine
        info = {"usage": built.usage.summary() if hasattr(built, "usage") else None,
                "engine_settings": built.describe() if hasattr(built, "describe") else None}
        if engine is None:
            predictor.close()
    return info


