"""What a long command shows a person: its own stages, progress and results.

`command_console(name, log_dir)` sends every other line a process writes (Ray, vLLM,
DeepSpeed, transformers, warnings, C++ logs on the file descriptors) to
`log_dir/<name>.log`, and gives the command a `Display` that still reaches the terminal.
Ray is joined with `log_to_driver=False` in that mode (`quiet()` says so), so worker
output stays in the Ray session's own log folder, which is linked as `log_dir/ray`.

On failure the display prints the stage that failed, the cause and the last log lines,
then exits: 1 for an unexpected error (traceback in the log file), 130 for Ctrl-C.
`verbose=True` leaves the console untouched: raw logs interleave as they always did.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

_TERMINAL: Console | None = None  # set while a quiet command runs
_LAST_LOG: Path | None = None  # the log of the quiet command this process ran
TAIL_LINES = 15


def quiet() -> bool:
    """True inside a quiet `command_console`: Ray should not forward worker logs."""
    return _TERMINAL is not None


def terminal() -> Console:
    """The console that reaches the person, quiet or not."""
    return _TERMINAL or Console(highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> None:
    """The one way a command reports a usage or input error: `error: ...`, exit `code`."""
    out = _TERMINAL or Console(stderr=True, highlight=False, soft_wrap=True)
    out.print(f"error: {message}", markup=False)
    raise typer.Exit(code)


class Display:
    """Stages with their times, progress bars, and plain result lines."""

    def __init__(self, console: Console, log_path: Path | None,
                 log: IO[str] | None = None) -> None:
        self.console = console
        self.log_path = log_path
        self.log = log  # the log file gets the person's lines too: one complete record
        self.current: str | None = None
        self.timings: dict[str, float] = {}

    def _record(self, message: str) -> None:
        if self.log is not None and not self.log.closed:
            self.log.write(f"[medray] {message}\n")

    def print(self, message: str) -> None:
        self.console.print(message, markup=False, highlight=False)
        self._record(message)

    @contextmanager
    def stage(self, title: str) -> Iterator[None]:
        self.current, start = title, time.monotonic()
        yield
        self.timings[title] = time.monotonic() - start
        self.console.print(f"[green]✓[/green] {title} [dim]({self.timings[title]:.0f} s)[/dim]")
        self._record(f"done: {title} ({self.timings[title]:.0f} s)")
        self.current = None

    def progress(self) -> Progress:
        """A rich progress display on the terminal; use as a context manager."""
        return Progress(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                        console=self.console, transient=False)


def _tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if ln.strip()][-n:]


def _undo(made: list[Path], log_path: Path) -> None:
    """Remove the log and the folders this command created for it, if nothing else is there."""
    log_path.unlink(missing_ok=True)
    for folder in made:  # innermost first
        try:
            folder.rmdir()
        except OSError:  # not empty: something else was written there
            return


@contextmanager
def _redirect_fds(log: IO[str]) -> Iterator[Console]:
    """fds 1 and 2 and sys.stdout/err into `log`; yields a console on the old stdout."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    py_out, py_err = sys.stdout, sys.stderr
    try:
        on_fd1 = sys.stdout.fileno() == 1
    except (AttributeError, OSError, ValueError):  # a test harness's stream (CliRunner)
        on_fd1 = False
    # The person's terminal is what fd 1 was; a harness's own stream stays as it is.
    term = (open(os.dup(saved_out), "w", buffering=1, encoding="utf-8",  # noqa: SIM115
                 errors="replace") if on_fd1 else py_out)
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = sys.stderr = log
        yield Console(file=term, highlight=False, soft_wrap=True,
                      force_terminal=True if on_fd1 and term.isatty() else None)
    finally:
        log.flush()
        sys.stdout, sys.stderr = py_out, py_err
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        os.close(saved_out)
        os.close(saved_err)
        if on_fd1:
            term.close()


@contextmanager
def library_output_hidden() -> Iterator[None]:
    """Hide what libraries print on fds 1 and 2 (for a short step whose only output is
    third-party chatter, e.g. DeepSpeed's accelerator warning inside save_pretrained);
    exceptions still propagate."""
    with open(os.devnull, "w", encoding="utf-8") as sink, _redirect_fds(sink):
        yield


def _ray_up() -> bool:
    ray = sys.modules.get("ray")  # never import Ray just to ask
    return bool(ray is not None and ray.is_initialized())


def link_ray_logs(log_dir: Path) -> None:
    """`log_dir/ray` -> this Ray session's log folder (worker output lives there)."""
    try:
        import ray

        if not ray.is_initialized():
            return
        context = ray.get_runtime_context()  # the session folder is temp dir / session name
        session = Path(context.get_temp_dir()) / context.get_session_name()
    except Exception:  # a client connection or no local node: the dashboard has the logs
        return
    link = log_dir / "ray"
    if log_dir.is_dir() and not link.is_symlink() and (session / "logs").is_dir():
        link.symlink_to(session / "logs", target_is_directory=True)


@contextmanager
def command_console(name: str, log_dir: Path, *, verbose: bool = False) -> Iterator[Display]:
    """Run a command with a clean console (see the module docstring)."""
    global _TERMINAL, _LAST_LOG
    if verbose:
        display = Display(Console(highlight=False, soft_wrap=True), None)
        yield display
        return
    ray_was_up = _ray_up()
    made = [d for d in (log_dir, *log_dir.parents) if not d.exists()]
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    _LAST_LOG = log_path
    with open(log_path, "a", buffering=1, encoding="utf-8", errors="replace") as log:
        log.write(f"\n===== medray {name} {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n")
        failure: BaseException | None = None
        with _redirect_fds(log) as console:
            _TERMINAL = console
            display = Display(console, log_path, log)
            try:
                yield display
            except (typer.Exit, typer.Abort, SystemExit) as exc:
                if getattr(exc, "exit_code", getattr(exc, "code", 1)) == 2 and made:
                    _undo(made, log_path)  # bad input: leave nothing behind, as before
                raise
            except KeyboardInterrupt as exc:
                failure = exc
            except Exception as exc:  # noqa: BLE001 - reported below, traceback in the log
                traceback.print_exc(file=log)
                failure = exc
            finally:
                link_ray_logs(log_dir)
                if not ray_was_up and _ray_up():
                    # Leave Ray while the console is still redirected: raylet warnings and
                    # shutdown messages arrive until then, and belong in the log.
                    import ray

                    ray.shutdown()
                _TERMINAL = None
    if failure is None:
        return
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    where = f" during '{display.current}'" if display.current else ""
    if isinstance(failure, KeyboardInterrupt):
        err.print(f"interrupted (Ctrl-C){where}; what was saved is kept. Log: {log_path}",
                  markup=False)
        raise typer.Exit(130)
    err.print(f"error{where}: {type(failure).__name__}: {failure}", markup=False)
    tail = _tail(log_path)
    if tail:
        err.print("last log lines:", markup=False)
        for line in tail:
            err.print(f"  {line}", markup=False)
    err.print(f"full log: {log_path}", markup=False)
    raise typer.Exit(1)


def exit_output_to_log() -> None:
    """After a quiet command's last line: what the interpreter writes while it exits (Ray's
    threads and finalizers, e.g. after a node was lost) goes to that command's log too."""
    if _LAST_LOG is None or not _LAST_LOG.exists():
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    log = open(_LAST_LOG, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log


def ray_quiet_settings() -> dict[str, Any]:
    """ray.init keyword arguments that match the console mode."""
    return {"log_to_driver": not quiet()}
