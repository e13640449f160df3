"""The Ray executor of evaluations: a pool of actors, each holding one `Predictor` (an HTTP
client of Serve, an in-process vLLM engine, or a baseline), fed items with at most
`max_in_flight` outstanding, least-loaded actor first. Rows come back to the driver, which
writes them as they arrive.

The actor class is plain Python; `worker_class` wraps it with `ray.remote` (so it can also
be unit-tested in-process).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


class EvalWorker:
    def __init__(self, config: dict[str, Any], api_key: str | None = None,
                 shots: Mapping[str, Sequence[dict]] | None = None, loglik: bool = False,
                 max_new_tokens: int | None = None) -> None:
        from medray.data.prepared import load_prepared
        from medray.eval.config import EvalConfig
        from medray.eval.predict import Predictor

        cfg = EvalConfig.model_validate(config)
        self.threads = _use_held_cpus() if cfg.engine.runs_on_cpu else None
        data = load_prepared(cfg.data)  # each actor keeps the epicrises once
        # The key comes from the driver (actors do not see its environment).
        kwargs = {"api_key": api_key} if cfg.engine.kind == "serve" else {}
        self.predictor = Predictor(cfg, data, shots=shots, loglik=loglik,
                                   max_new_tokens=max_new_tokens, **kwargs)

    def where(self) -> dict[str, Any]:
        """The node this actor runs on (recorded in metrics.json)."""
        import ray

        ctx = ray.get_runtime_context()
        where = {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address()}
        if self.threads is not None:  # a model on CPU: the threads it computes on
            where["torch_threads"] = self.threads
        return where

    def predict(self, examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Examples (rows of the examples table) -> their predictions-file rows, answered
        in one engine call."""
        return self.predictor.predict(examples)

    def close(self) -> None:
        self.predictor.close()


def _use_held_cpus() -> int:
    """torch (and vLLM on CPU, whose threads are unbound) on as many threads as the CPUs
    Ray gave this actor, never more than the cores the process may run on."""
    import os

    import ray
    import torch

    held = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, min(int(held), usable or 1))
    torch.set_num_threads(threads)
    return threads


def cpus_per_actor(n_actors: int) -> int:
    """A CPU engine's default share: this machine's cores (at most a node's CPUs in Ray)
    split among the actors."""
    import os

    import ray

    node_cpus = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]),
                    default=1)
    return max(1, int(min(node_cpus, os.cpu_count() or 1)) // max(n_actors, 1))


def worker_class(cfg: Any, max_concurrency: int, cpus: int = 1) -> Any:
    """The evaluation actor class with its resource request (GPUs for vLLM on GPU, a share
    of the cores for a model on CPU)."""
    import ray

    return ray.remote(**cfg.engine.actor_options(cpus), max_concurrency=max_concurrency,
                      scheduling_strategy=cfg.actor_placement)(EvalWorker)


MAX_REPLACEMENTS = 3  # actor deaths one evaluation survives before it stops (answers kept)


class PoolError(RuntimeError):
    """The evaluation actors kept dying; what was answered is in the predictions file."""


def run_pool(plan: Any, pending: list[dict], write: Callable[[dict], None], *,
             api_key: str | None = None,
             on_start: Callable[[], None] | None = None) -> dict[str, Any]:
    """Send `pending` through `cfg.actor_count` actors; `write(row)` as each answer arrives,
    `on_start()` as the first request goes out (an actor has started).
    Returns {"requested": items sent (a re-asked item counts again), "reasked",
    "actors": where each actor ran, "actors_replaced"}.

    A thread-safe engine (a client of Serve or an API) gets `max_in_flight` requests
    outstanding, in patient order (the server's prefix cache sees a patient's questions
    together): Serve one patient's generative items per request (/v1/qa/batch), an API one
    item; one that is not (in-process vLLM) gets whole engine calls
    (EvalPlan.engine_calls: with E+Q+A one patient's items), one running and one queued per
    actor.

    An actor that dies (its process, or its node) is replaced by a fresh one, which Ray
    places on a node still alive, and the units it held go back to the queue. A unit's
    rows are written only once its whole call returned, so nothing is lost or written twice.
    Actors get work once they have started (`where` answered), and the pool keeps feeding
    the live ones while a replacement starts (a vLLM actor takes ~30 s on 2 cores), so one
    can end the run unstarted: `actors` lists the actors that started.
    """
    import ray
    from ray.exceptions import RayActorError

    cfg = plan.cfg
    n_actors = min(cfg.actor_count, len(pending))
    thread_safe = cfg.engine.entry.thread_safe
    calls = plan.engine_calls(pending)
    if thread_safe:
        units = calls if plan.patient_units else [[row] for call in calls for row in call]
        window = cfg.max_in_flight
        per_actor = max(1, -(-cfg.max_in_flight // n_actors))
    else:
        units, window, per_actor = calls, 2 * n_actors, 1
    per_slot = -(-window // max(n_actors, 1))  # units outstanding on one actor
    cpus = cpus_per_actor(n_actors) if cfg.engine.runs_on_cpu else 1
    worker_cls = worker_class(cfg, per_actor, cpus)
    config = cfg.model_dump(mode="json")

    placements: list[dict[str, Any]] = []
    replaced = 0
    actors: list[Any] = [None] * n_actors
    started = [False] * n_actors
    # an actor's `where` call -> (its slot, whether it replaces one), until it answers
    starting: dict[Any, tuple[int, bool]] = {}

    def launch(i: int, replacing: bool) -> None:
        actors[i] = worker_cls.remote(config, api_key, plan.shots, plan.loglik,
                                      plan.max_new_tokens)
        started[i] = False
        starting[actors[i].where.remote()] = (i, replacing)

    def replace(i: int, exc: Exception) -> None:
        nonlocal replaced
        replaced += 1
        if replaced > MAX_REPLACEMENTS:
            raise PoolError(f"{replaced} evaluation actors died (last: "
                            f"{type(exc).__name__}); the answers so far are kept: rerun "
                            "the same command to resume") from exc
        ray.kill(actors[i])
        launch(i, replacing=True)

    for slot in range(n_actors):
        launch(slot, replacing=False)
    queue = list(reversed(units))
    in_flight: dict[Any, tuple[int, Any, list[dict]]] = {}  # ref -> (slot, actor, unit)
    load = [0] * n_actors
    requested = reasked = 0
    try:
        while queue or in_flight:
            while queue and len(in_flight) < window:
                free = [i for i in range(n_actors) if started[i] and load[i] < per_slot]
                if not free:
                    break
                i = min(free, key=load.__getitem__)  # least-loaded actor
                unit = queue.pop()
                if on_start is not None and not requested:
                    on_start()
                in_flight[actors[i].predict.remote(unit)] = (i, actors[i], unit)
                load[i] += 1
                requested += len(unit)
            ready, _ = ray.wait([*in_flight, *starting], num_returns=1)
            for ref in ready:
                if ref in starting:
                    i, replacing = starting.pop(ref)
                    try:
                        placements.append(ray.get(ref))
                        started[i] = True
                    except RayActorError as exc:
                        if not replacing and not any(started):
                            raise  # no actor could start: the engine's error, the run's
                        # a lost process or node: another actor started, or this one
                        # replaced an actor that did
                        replace(i, exc)
                    continue
                i, actor, unit = in_flight.pop(ref)
                load[i] -= 1
                try:
                    rows = ray.get(ref)
                except RayActorError as exc:
                    queue.append(unit)  # asked again, first
                    reasked += len(unit)
                    if actor is actors[i]:  # not yet replaced by another failed call
                        replace(i, exc)
                    continue
                for row in rows:
                    write(row)
    finally:
        for ref in in_flight:
            ray.cancel(ref, force=False)
        for a in actors:
            ray.kill(a)
    return {"requested": requested, "reasked": reasked, "actors": placements,
            "actors_replaced": replaced}
