"""Training progress, from rank 0's loop to the driver's console, through a named actor.

Ray forwards worker output only with `log_to_driver=True`, which also floods the console
with every library's logs. Instead rank 0 posts (step, total, loss, lr, tokens/s) to a
tiny actor a few times a second, and the driver draws one rich progress bar from it.
With tracking on (medray.tracking), rank 0 also posts every TensorBoard scalar there
(`RelayedWriter`) and the driver logs them: workers need no route to the tracking server.
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
            self.scalars: list[tuple[str, float, int]] = []

        def log(self, tag: str, value: float, step: int) -> None:
            self.scalars.append((tag, value, step))

        def take(self) -> list[tuple[str, float, int]]:
            taken, self.scalars = self.scalars, []
            return taken

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


class RelayedWriter:
    """Rank 0's TensorBoard writer that also posts each scalar to the driver's board: the
    tracked metrics carry TensorBoard's names and steps (train/loss, val/loss, ...)."""

    def __init__(self, writer: Any, board_name: str) -> None:
        import ray

        self._writer = writer
        self._board = ray.get_actor(board_name, namespace=NAMESPACE)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self._writer.add_scalar(tag, value, step)
        self._board.log.remote(tag, float(value), int(step))  # fire and forget

    def close(self) -> None:
        """Close the writer once the board has every scalar: one caller's actor calls run in
        order, so an answered read means the posts before it arrived (the worker may exit
        right after this)."""
        import ray

        self._writer.close()
        try:
            ray.get(self._board.read.remote(), timeout=30)
        except Exception:  # the driver gone or restarting: nothing left to hand over
            pass

    def __getattr__(self, name: str) -> Any:  # flush, log_dir, medray_fallback
        return getattr(self._writer, name)


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

    @contextmanager
    def relayed(self, log: Any, every_s: float = 2.0) -> Iterator[None]:
        """Hand the scalars rank 0 posts to `log(metrics, step)` while the block runs, and
        the rest at its end (the actor has all of them once fit() returned)."""
        import ray

        stop = threading.Event()

        def drain() -> None:
            try:
                scalars = ray.get(self.actor.take.remote(), timeout=30)
            except Exception:  # a slow or restarting cluster: the next round takes them
                return
            by_step: dict[int, dict[str, float]] = {}
            for tag, value, step in scalars:
                by_step.setdefault(step, {})[tag] = value
            for step in sorted(by_step):
                log(by_step[step], step)

        def loop() -> None:
            while not stop.wait(every_s):
                drain()

        thread = threading.Thread(target=loop, name="medray-tracking", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=60)
            drain()

    def close(self) -> None:
        import ray

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
