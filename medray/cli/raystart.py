"""How a command joins Ray: the one start helper of the command line.

A command calls it after its own checks (a bad option never waits for Ray to start), and
medray.cluster.connect does the joining: the address (or RAY_ADDRESS), else a local
cluster with a CPU floor.
"""

from __future__ import annotations

from typing import Any


def start_ray(address: str | None = None, *, num_cpus: int | None = None,
              min_cpus: float = 0, worker_logs: bool | None = None) -> Any:
    """Join or start Ray for this command (`worker_logs` False: the workers' output stays
    in Ray's log files, for commands whose own console reports what happens)."""
    from medray.cluster import connect

    return connect(address, num_cpus=num_cpus, min_cpus=min_cpus, log_to_driver=worker_logs)


def join_serve_app(engine: Any, address: str | None = None) -> None:
    """An evaluation of a Serve app in-cluster (engine.app) joins the app's Ray cluster
    before planning (the plan reads the served prompt through it): `address`, else
    RAY_ADDRESS, else the cluster already running on this machine; never a new one, where
    the app cannot be."""
    import os

    from medray.console import fail

    if getattr(engine, "kind", None) != "serve" or not engine.app:
        return
    try:
        start_ray(address or os.environ.get("RAY_ADDRESS") or "auto")
    except ConnectionError as err:
        fail(f"engine.app {engine.app!r}: no Ray cluster to join ({err}); give --address "
             "of the cluster that serves the app, or set engine.url (without engine.app) "
             "to call it over HTTP")
