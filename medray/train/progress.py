"""Training progress, from rank 0's loop to the driver's console, through a named actor.

Ray forwards worker output only with `log_to_driver=True`, which also floods the console
with every library's logs. Instead rank 0 posts (step, total, loss, lr, tokens/s) to a
tiny actor a few times a second, and the driver draws one rich progress bar from it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

NAMESPACE = "medray"
POST_EVERY_S = 0.5


def _board_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class ProgressBoard:
        def __init__(self) -> None:
            self.state: dict = {}

        def post(self, state: dict) -> None:
            self.state.update(state)

        def read(self) -> dict:
            return dict(self.state)

    return ProgressBoard


class WorkerProgress:
    """Rank 0's reporter; the same interface as a tqdm bar (update / set_description)."""

    def __init__(self, board_name: str, total: int, initial: int) -> None:
        import ray

        self.board = ray.get_actor(board_name, namespace=NAMESPACE)
        self.step, self.total, self.info, self.last = initial, total, "", 0.0
        self._post(force=True)

    def _post(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= POST_EVERY_S:
            self.last = now
            self.board.post.remote({"step": self.step, "total": self.total, "info": self.info})

    def update(self, n: int = 1) -> None:
        self.step += n
        self._post()

    def set_description(self, desc: str) -> None:
        self.info = desc

    def close(self) -> None:
        self._post(force=True)


class TrainingBoard:
    """Driver side: create the board, draw it while `trainer.fit()` runs, remove it."""

    def __init__(self) -> None:
        self.name = f"medray-train-progress-{uuid.uuid4().hex[:8]}"
        self.actor = _board_class().options(name=self.name, namespace=NAMESPACE).remote()

    @contextmanager
    def shown(self, display: Any, title: str = "train") -> Iterator[None]:
        import ray

        stop = threading.Event()

        def draw() -> None:
            with display.progress() as bars:
                task = bars.add_task(title, total=None, info="starting workers")
                while True:
                    done = stop.wait(0.5)
                    try:
                        state = ray.get(self.actor.read.remote(), timeout=5)
                    except Exception:  # a slow or restarting cluster: keep the last frame
                        state = {}
                    if state:
                        bars.update(task, completed=state["step"], total=state["total"],
                                    info=state.get("info", ""))
                    if done:
                        return

        thread = threading.Thread(target=draw, name="medray-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=10)
            ray.kill(self.actor)


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def set_description(self, desc: str) -> None: ...
    def close(self) -> None: ...


def rank_zero_bar(total: int, initial: int, rank: int, board: str | None) -> Any:
    """Rank 0's bar: posted to the driver's board when the driver draws one, else Ray's
    tqdm_ray (shown when worker logs reach the driver). Other ranks draw nothing."""
    if rank != 0:
        return _NoBar()
    if board:
        return WorkerProgress(board, total, initial)
    from ray.experimental.tqdm_ray import tqdm

    bar = tqdm(total=total, desc="train", unit="step")
    bar.update(initial)
    return bar
