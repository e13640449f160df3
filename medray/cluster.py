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
                           "medray.cluster.connect() first")


class StorageNotShared(RuntimeError):
    """A local path that some node of a multi-node cluster does not see."""


def check_shared_storage(path: str | os.PathLike, what: str) -> None:
    """On a cluster of several nodes, `path` must be storage every node sees (NFS) or a
    filesystem URI: a marker written here is looked for by a task on every alive node.
    One node: nothing to check."""
    import uuid
    from pathlib import Path

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if "://" in str(path):
        return  # pyarrow resolves URIs the same way on every node
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) < 2:
        return
    # The nearest folder that exists: a refused run must not leave folders behind, and a
    # folder made later under a shared one is shared too.
    folder = Path(path).resolve()
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    marker = folder / f".medray-shared-check-{uuid.uuid4().hex}"
    marker.write_text("medray")

    @ray.remote(num_cpus=0)
    def sees(p: str) -> bool:
        return os.path.exists(p)

    try:
        refs = {n["NodeManagerAddress"]: sees.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(str(marker)) for n in nodes}
        blind = [ip for ip, ref in refs.items() if not ray.get(ref, timeout=120)]
    finally:
        marker.unlink(missing_ok=True)
    if blind:
        raise StorageNotShared(
            f"{what} {Path(path).resolve()} is not shared storage: node(s) "
            f"{', '.join(sorted(blind))} do not see {folder}. Use a folder every node mounts "
            "(NFS) or a URI (s3://, gs://)")
