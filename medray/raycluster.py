"""Joining Ray: the cluster named by --address / RAY_ADDRESS, or a local one for a laptop.

One place for every entry point (the CLI commands, jobs/*.py, tune/sweep.py, bench/), so
a 2-core laptop gets the same working set-up everywhere. Library code never connects: it
runs on the Ray its entry point joined (`require_connected`), so the entry point's
resource floor (`min_cpus`) is the one that applies.
"""

from __future__ import annotations

import os
from typing import Any

# Logical CPUs are scheduling tokens. A local run holds Train workers, a Serve proxy,
# ingresses and eval actors that mostly wait, while Ray Data tasks need a CPU too: with
# as many tokens as physical cores (2) a read waits forever behind the Train workers.
LOCAL_MIN_LOGICAL_CPUS = 8


def use_small_data_reader() -> None:
    """Ray Data's Parquet V1 reader for this process's datasets (they keep the context).

    Ray 2.60's V2 reader starts a pool of 32 FooterReader actors at every execution:
    15-40 s per read on a 2-core machine, for tables of a few MB. V1 reads them with one
    task. Only for local clusters; a real cluster keeps Ray's default.
    """
    from ray.data import DataContext

    DataContext.get_current().use_datasource_v2 = False


def connect(address: str | None = None, *, num_cpus: int | None = None, min_cpus: float = 0,
            dashboard: bool = False, log_to_driver: bool | None = None) -> Any:
    """ray.init once: join `address` (or RAY_ADDRESS), else start a local cluster with
    at least LOCAL_MIN_LOGICAL_CPUS logical CPUs (and `min_cpus`). Returns the RayContext,
    or None when Ray was already initialised by the caller. Worker logs reach the driver
    unless a quiet console (medray.console) is drawing the command's own progress."""
    import ray

    from medray import console

    if console.quiet():
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = False
    if ray.is_initialized():
        return None
    if log_to_driver is None:
        log_to_driver = not console.quiet()
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        return ray.init(address=address, log_to_driver=log_to_driver)
    use_small_data_reader()
    cpus = num_cpus or max(LOCAL_MIN_LOGICAL_CPUS, os.cpu_count() or 1, int(min_cpus + 0.999))
    return ray.init(num_cpus=cpus, include_dashboard=dashboard, log_to_driver=log_to_driver,
                    **({"dashboard_host": "127.0.0.1"} if dashboard else {}))


def require_connected(what: str) -> None:
    """Library code that needs Ray calls this instead of starting one: an implicit
    `ray.init` would size a local cluster by the physical cores and ignore `min_cpus`."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError(f"{what} needs Ray: the entry point calls "
                           "medray.raycluster.connect() first")
