"""Memory of the README's CPU Serve config: processes, summed PSS and RSS per process kind,
with vLLM's engine in the replica's process (medray's default on CPU) and with vLLM's own
engine-core and worker processes, side by side in one run.

    .venv/bin/python bench/serve_memory.py [--model PATH] [--modes inproc,mp]
        [--also-kv-mib 64]   # one more in-process row, KV cache sized per replica

The app is serve/medqaro-cpu.yaml's `args` with `model` and `models.medray-ft` replaced by
--model (default: the tiny random Llama, built like the other serving benches; both
served names then load the same folder, two vLLM replicas as in the README's config).
For each mode: a fresh local Ray, `serve.run`, /readyz, one greedy completion per served
model, then every process of this bench's tree (this driver, GCS, raylet, Ray's agents,
Serve controller and proxy, replicas, vLLM's processes) is read with psutil
`memory_full_info` (PSS splits shared pages between the processes mapping them, as
medray/demo/memory.py sums it). Greedy answers must be the same in both modes.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _tiny import prepared_and_model

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
KEY = "bench-key"
PROMPT = "Pacienta de 54 ani, diagnosticata cu carcinom mamar"
MODES = {"inproc": "1", "mp": "0"}
TARGET_PSS_GIB = 4.0


def _kind(proc: Any, under_replica: bool) -> str:
    """What a process of the Ray session is, from its title (setproctitle) and ancestry."""
    try:
        title = " ".join(proc.cmdline()) or proc.name()
    except Exception:  # gone while listed
        return "gone"
    if proc.pid == os.getpid():
        return "driver (medray serve)"
    if under_replica:
        if "EngineCore" in title:
            return "vLLM engine core"
        return "vLLM worker" if "Worker" in title else "other child of a replica"
    for needle, kind in (("gcs_server", "GCS"), ("raylet", "raylet"),
                         ("ray::ServeController", "Serve controller"),
                         ("ray::ProxyActor", "Serve proxy"),
                         ("QAIngress", "ingress replica"),
                         ("ray::ServeReplica", "LLM replica"),
                         ("dashboard", "Ray agents"), ("runtime_env", "Ray agents"),
                         ("log_monitor", "Ray log monitor"), ("ray::", "Ray worker (other)")):
        if needle in title:
            return kind
    return "other"


def census() -> dict[str, Any]:
    """Count, PSS and RSS of this process and all its descendants, by kind."""
    import psutil

    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    replicas = set()
    for p in procs:
        try:
            title = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "ray::ServeReplica" in title and "QAIngress" not in title:
            replicas.add(p.pid)
    under = {c.pid for pid in replicas for c in psutil.Process(pid).children(recursive=True)}
    kinds: dict[str, dict[str, float]] = defaultdict(lambda: {"n": 0, "pss": 0, "rss": 0})
    for p in procs:
        kind = _kind(p, p.pid in under)
        try:
            mem = p.memory_full_info()
        except psutil.Error:
            continue
        kinds[kind]["n"] += 1
        kinds[kind]["pss"] += mem.pss
        kinds[kind]["rss"] += mem.rss

    def gib(v: float) -> float:
        return round(v / GIB, 3)

    by_kind = {k: {"processes": int(v["n"]), "pss_gib": gib(v["pss"]), "rss_gib": gib(v["rss"])}
               for k, v in sorted(kinds.items())}
    return {"processes": sum(v["processes"] for v in by_kind.values()),
            "pss_gib": gib(sum(v["pss"] for v in kinds.values())),
            "rss_gib": gib(sum(v["rss"] for v in kinds.values())), "by_kind": by_kind}


def _app_config(model: str, keys: Path, kv_mib: int | None) -> Any:
    import yaml

    from medray.serve.config import AppConfig

    spec = yaml.safe_load((ROOT / "serve" / "medqaro-cpu.yaml").read_text())
    args = dict(spec["applications"][0]["args"])
    args.update(model=model, models={name: model for name in args.get("models") or {}},
                api_keys_env=None, api_keys_file=str(keys), base_dir=None)
    if kv_mib is not None:  # instead of VLLM_CPU_KVCACHE_SPACE's whole GiB per replica
        args["engine_kwargs"] = {**(args.get("engine_kwargs") or {}),
                                 "kv_cache_memory_bytes": kv_mib * 2**20}
    return AppConfig.model_validate(args)


def run_mode(mode: str, model: str, work: Path, ready_timeout: float,
             kv_mib: int | None = None) -> dict[str, Any]:
    import httpx
    import ray
    from ray import serve

    from medray.cluster import connect
    from medray.engines.vllm import SERVE_INPROC_ENV
    from medray.serve.app import build_app

    os.environ[SERVE_INPROC_ENV] = MODES[mode]
    keys = work / "keys"
    keys.write_text(f"{KEY}\n")
    cfg = _app_config(model, keys, kv_mib)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    connect(None, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(cfg), name="medray", route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    answers = {}
    with httpx.Client(base_url=url, timeout=120,
                      headers={"Authorization": f"Bearer {KEY}"}) as client:
        deadline = time.monotonic() + ready_timeout
        while client.get("/readyz").status_code != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{mode}: /readyz not 200 after {ready_timeout} s")
            time.sleep(2)
        ready_s = time.perf_counter() - t0
        for name in [cfg.model_id, *cfg.models]:
            r = client.post("/v1/completions", json={
                "model": name, "prompt": PROMPT, "max_tokens": 16, "temperature": 0})
            r.raise_for_status()
            answers[name] = r.json()["choices"][0]["text"]
    time.sleep(3)  # let allocations settle after the first requests
    memory = census()
    serve.shutdown()
    ray.shutdown()
    label = mode if kv_mib is None else f"{mode}+kv{kv_mib}MiB"
    return {"mode": label, "kv_cache_mib": kv_mib, "ready_s": round(ready_s, 1),
            "answers": answers, **memory}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder (default: the tiny model)")
    ap.add_argument("--modes", default="inproc,mp", help="comma-separated: inproc, mp "
                    "(mp: vLLM's engine-core and worker processes, MEDRAY_SERVE_VLLM_INPROC=0)")
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: a temp one)")
    ap.add_argument("--ready-timeout", type=float, default=600)
    ap.add_argument("--also-kv-mib", type=int, default=None, help=(
        "also run the in-process engine with this KV cache per replica (MiB) instead of "
        "the config's VLLM_CPU_KVCACHE_SPACE=1 (GiB)"))
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(modes) <= set(MODES):
        ap.error(f"--modes: choose from {sorted(MODES)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="serve_memory_"))
    work.mkdir(parents=True, exist_ok=True)
    _, model = prepared_and_model(work, args.model)
    rows = [run_mode(mode, model, work, args.ready_timeout) for mode in modes]
    if args.also_kv_mib is not None:
        rows.append(run_mode("inproc", model, work, args.ready_timeout, args.also_kv_mib))
    for row in rows:
        print(f"{row['mode']}: {row['processes']} processes, PSS {row['pss_gib']:.2f} GiB, "
              f"RSS {row['rss_gib']:.2f} GiB, ready in {row['ready_s']} s")
        for kind, v in row["by_kind"].items():
            print(f"    {kind:<32} {v['processes']:>2}  PSS {v['pss_gib']:6.3f}  "
                  f"RSS {v['rss_gib']:6.3f}")
    results: dict[str, Any] = {"model": "tiny" if args.model is None else args.model,
                               "config": "serve/medqaro-cpu.yaml", "rows": rows,
                               "target_pss_gib": TARGET_PSS_GIB}
    by_mode = {r["mode"]: r for r in rows}
    if {"inproc", "mp"} <= set(by_mode):
        inproc, mp = by_mode["inproc"], by_mode["mp"]
        results.update(
            pss_ratio_mp_over_inproc=round(mp["pss_gib"] / inproc["pss_gib"], 2),
            rss_ratio_mp_over_inproc=round(mp["rss_gib"] / inproc["rss_gib"], 2),
            process_ratio_mp_over_inproc=round(mp["processes"] / inproc["processes"], 2),
            same_greedy_answers=inproc["answers"] == mp["answers"])
        print(f"mp / inproc: PSS x{results['pss_ratio_mp_over_inproc']}, "
              f"RSS x{results['rss_ratio_mp_over_inproc']}, processes "
              f"x{results['process_ratio_mp_over_inproc']}; same greedy answers: "
              f"{results['same_greedy_answers']}")
    results["within_target"] = {r["mode"]: r["pss_gib"] <= TARGET_PSS_GIB for r in rows}
    results["same_greedy_answers_all_rows"] = all(r["answers"] == rows[0]["answers"]
                                                  for r in rows)
    if not args.no_write:
        from _results import write_results

        write_results("serve_memory", results, command=" ".join(
            ["bench/serve_memory.py", *map(shlex.quote, sys.argv[1:])]))


if __name__ == "__main__":
    main()
