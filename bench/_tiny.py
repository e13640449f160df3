"""Shared set-up for the serving benchmarks: synthetic MedQARo + the tiny model (or yours)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def prepared_and_model(work: Path, model: str | None) -> tuple[Path, str]:
    """Prepared synthetic MedQARo under `work`, and `model` or a freshly built tiny model."""
    from medray.data.prepare import prepare
    from medray.data.synth import write_medqaro
    from medray.models import build_tiny_model, corpus_from_prepared

    data = work / "data"
    if not (data / "manifest.json").exists():
        prepare("medqaro", write_medqaro(work / "raw", seed=0, scale="small"), data)
    if model is None:
        model_dir = work / "model"
        if not (model_dir / "config.json").exists():
            build_tiny_model(model_dir, corpus_from_prepared(data), seed=0)
        model = str(model_dir)
    return data, model


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


BENCH_KEY = "bench-key"  # the serving benches' API key (env MEDRAY_BENCH_KEYS)


def local_serve(num_cpus: int) -> str:
    """A local Ray cluster with Serve's HTTP proxy on a free 127.0.0.1 port; its URL.
    Apps built with api_keys_env="MEDRAY_BENCH_KEYS" accept BENCH_KEY."""
    import os
    import socket

    import ray
    from ray import serve

    os.environ["MEDRAY_BENCH_KEYS"] = BENCH_KEY
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"MEDRAY_BENCH_KEYS": BENCH_KEY}})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    return f"http://127.0.0.1:{port}"
