"""Peak memory of a demo run, overall and per stage.

Two views, sampled from a background thread:
- the demo's own processes: this driver and every descendant (a local Ray cluster it
  started, Ray workers, Train workers, the vLLM replica and engine processes), summed PSS
  (shared pages split between the processes that map them, so shared libraries and Ray's
  object store are not counted once per process), every 3 s: reading PSS makes the kernel
  walk each process's page tables (~6 ms per Ray or vLLM process), too costly to do more
  often on a 2-core machine that is also training;
- system memory in use above the level at start (includes anything else running), every
  0.5 s (cheap).
When the demo joins a cluster started elsewhere, that cluster's workers are not its
descendants: only the system view covers them.
"""

from __future__ import annotations

import threading
from typing import Any

GIB = 2**30
HOW = ("'processes': summed PSS of the demo driver and all its descendant processes (local "
       "Ray cluster, Ray/Train workers, vLLM replica and engine), peak of samples every "
       "3 s, with the 5 largest processes at each stage's peak; 'system': system memory "
       "in use (total - available), peak minus the value at "
       "start, sampled every 0.5 s, includes anything else running on the machine")
PSS_EVERY = 6  # system samples per process-tree sample


TOP_N = 5  # the largest processes kept at each stage's peak


def _label(proc: Any) -> str:
    """A process as a reader recognises it: Ray sets its workers' titles (`ray::...`)."""
    try:
        argv = proc.cmdline()
    except Exception:  # psutil's errors for a process that ended or hides its arguments
        argv = []
    if not argv:
        try:
            return proc.name()
        except Exception:  # it ended since its PSS was read
            return f"pid {proc.pid}"
    head = argv[0].split(" ")[0] if argv[0].startswith("ray::") else argv[0].rsplit("/", 1)[-1]
    if head.startswith("python") and len(argv) > 1 and "-c" not in argv:  # its script or module
        rest = [a for a in argv[1:] if not a.startswith("-")]
        head = f"{head} {rest[0].rsplit('/', 1)[-1]}" if rest else head
    return head[:60]


def _tree_pss() -> tuple[int, list[tuple[str, int]]]:
    """The summed PSS of this process and its descendants, and the largest ones' (label,
    PSS): only those are labelled, since reading a command line is a /proc read too."""
    import psutil

    me = psutil.Process()
    each = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            each.append((proc, proc.memory_full_info().pss))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # a process that ended between listing and reading
    top = sorted(each, key=lambda x: -x[1])[:TOP_N]
    return sum(p for _, p in each), [(_label(proc), pss) for proc, pss in top]


def _system_used() -> int:
    import psutil

    vm = psutil.virtual_memory()
    return vm.total - vm.available


class MemoryPeak:
    """`.stage(name)` starts a new per-stage peak; `.stop()` returns every peak in GiB."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self._interval = interval_s
        self._start = _system_used()
        self._peak = {"processes": 0, "system": 0}
        self._stages: dict[str, dict[str, int]] = {}
        self._top: dict[str, list[tuple[str, int]]] = {}  # per stage, at its process peak
        self._current: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="memory-peak")

    def _sample(self, processes: bool = True) -> None:
        now = {"system": _system_used() - self._start}
        top: list[tuple[str, int]] = []
        if processes:
            now["processes"], top = _tree_pss()
        with self._lock:
            for key, value in now.items():
                self._peak[key] = max(self._peak[key], value)
                if self._current is not None:
                    stage = self._stages[self._current]
                    if key == "processes" and value > stage[key]:
                        self._top[self._current] = top
                    stage[key] = max(stage[key], value)

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(self._interval):
            n += 1
            self._sample(processes=n % PSS_EVERY == 0)

    def start(self) -> MemoryPeak:
        self._sample()
        self._thread.start()
        return self

    def stage(self, name: str) -> None:
        with self._lock:
            self._current = name
            self._stages.setdefault(name, {"processes": 0, "system": 0})
        self._sample()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        self._sample()

        def gib(values: dict[str, int]) -> dict[str, float]:
            return {k: round(v / GIB, 2) for k, v in values.items()}

        return {"peak_gib": gib(self._peak), "by_stage_gib": {
            name: gib(values) for name, values in self._stages.items()}, "how": HOW,
            # the key earlier metrics.json files and bench/demo_margin.py read
            "peak_above_start_gib": round(self._peak["system"] / GIB, 2),
            "top_by_stage": {name: [{"process": label, "pss_gib": round(pss / GIB, 2)}
                                    for label, pss in top]
                             for name, top in self._top.items()}}


def largest_at_peak(memory: dict[str, Any]) -> tuple[str, list[dict]] | None:
    """The stage with the highest process peak and its largest processes then (None for a
    metrics.json written before they were recorded)."""
    stages, top = memory.get("by_stage_gib", {}), memory.get("top_by_stage", {})
    ranked = [s for s in sorted(stages, key=lambda s: -stages[s].get("processes", 0))
              if top.get(s)]
    return (ranked[0], top[ranked[0]]) if ranked else None
