"""Safe outputs: the one place where medray writes a folder or a file.

- A folder output is built in a temporary sibling and swapped in: the old output is renamed
  aside, the new one renamed in, then the old one deleted, so at every instant a complete
  old or new output exists under a known name (a reader never sees half a dataset).
- A file output is written to a temporary sibling and `os.replace`d (atomic on POSIX).
- Temporary siblings are named `.NAME.medray-tmp.HOST.PID.RANDOM` (`medray-old` for an old
  output set aside); the next write to NAME removes those a dead process left, and puts
  back an old output that a kill left aside. Nothing else is ever removed.
- Every folder medray creates holds `MARKER`; medray replaces only such folders (or empty
  ones, or with `force`), and never an output that equals, contains or lies inside an input.
- Permissions follow the umask (mkdtemp/mkstemp would give 0700/0600).
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MARKER = ".medray-output.json"
_TMP, _OLD = "medray-tmp", "medray-old"
# A temp sibling from another host cannot be checked for liveness: only remove it this late.
_FOREIGN_STALE_S = 24 * 3600


class OutputRefused(ValueError):
    """Writing here could destroy data medray did not create (exit status 2 in the CLI)."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _sibling(out: Path, kind: str) -> Path:
    host = socket.gethostname().replace(".", "_")
    return out.with_name(f".{out.name}.{kind}.{host}.{os.getpid()}.{secrets.token_hex(4)}")


def _is_stale(path: Path) -> bool:
    parts = path.name.rsplit(".", 3)  # [".NAME.kind", host, pid, random]
    if len(parts) != 4 or not parts[2].isdigit():
        return False
    if parts[1] != socket.gethostname().replace(".", "_"):
        try:
            return time.time() - path.lstat().st_mtime > _FOREIGN_STALE_S
        except FileNotFoundError:
            return False
    try:
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def clean_stale(out: str | os.PathLike) -> list[Path]:
    """Remove temp siblings of `out` left by killed runs; restore an old output set aside."""
    out = Path(out)
    if not out.parent.is_dir():
        return []
    removed = []
    for kind in (_OLD, _TMP):
        for path in sorted(out.parent.glob(f".{glob.escape(out.name)}.{kind}.*")):
            if not _is_stale(path):
                continue
            if kind == _OLD and not os.path.lexists(out):
                os.rename(path, out)  # killed between the two renames: the old one is complete
                continue
            _remove(path)
            removed.append(path)
    return removed


def is_medray_output(path: str | os.PathLike) -> bool:
    path = Path(path)
    if (path / MARKER).is_file():
        return True
    manifest = path / "manifest.json"  # prepared datasets written before the marker existed
    try:
        return json.loads(manifest.read_text()).get("created_by", "").startswith("medray")
    except (OSError, ValueError, AttributeError):
        return False


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def check_output(out: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (),
                 force: bool = False) -> None:
    """Raise OutputRefused when writing `out` could destroy an input or foreign data.

    An output that equals, contains or lies inside an input is refused even with `force`;
    a non-empty folder (or a file where a folder goes) that medray did not create is
    refused unless `force`.
    """
    out = Path(out)
    real_out = out.resolve()
    for inp in inputs:
        real_in = Path(inp).resolve()
        if _overlaps(real_out, real_in):
            relation = ("is" if real_out == real_in else
                        "contains" if real_out in real_in.parents else "is inside")
            raise OutputRefused(f"output {out} {relation} the input {inp}; "
                                "choose an output outside the input")
    if force or not os.path.lexists(out):
        return
    if out.is_dir() and not out.is_symlink():
        if any(out.iterdir()) and not is_medray_output(out):
            raise OutputRefused(f"output {out} is a non-empty folder medray did not create "
                                f"(no {MARKER}); choose another output or pass --force")
    else:
        raise OutputRefused(f"output {out} exists and is not a folder; choose another "
                            "output or pass --force")


def _write_marker(folder: Path, command: str | None) -> None:
    from medray import __version__

    # No timestamp: the same command on the same input gives byte-identical outputs.
    info = {"created_by": f"medray {__version__}", "command": command}
    write_text_atomic(folder / MARKER, json.dumps(info) + "\n")


def _swap_in(new: Path, out: Path) -> None:
    if not os.path.lexists(out):
        os.rename(new, out)
        return
    old = _sibling(out, _OLD)
    os.rename(out, old)
    os.rename(new, out)
    _remove(old)


@contextmanager
def atomic_directory(out: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = (),
                     force: bool = False, command: str | None = None) -> Iterator[Path]:
    """Yield an empty temp sibling of `out`; on success it becomes `out`, on error it goes."""
    out = Path(out)
    check_output(out, inputs, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(out)
    tmp = _sibling(out, _TMP)
    tmp.mkdir(mode=0o777)  # the umask applies
    try:
        yield tmp
        _write_marker(tmp, command)
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def claim_directory(out: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = (),
                    force: bool = False, command: str | None = None) -> Path:
    """Create (or reuse) `out` for an output written over time (training runs, resumable
    evaluations, sweeps): the same refusals as `atomic_directory`, and the marker."""
    out = Path(out)
    check_output(out, inputs, force)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).is_file():
        _write_marker(out, command)
    return out


@contextmanager
def atomic_file(path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = ()
                ) -> Iterator[Path]:
    """Yield a temp sibling path of `path`; on success it replaces `path` atomically."""
    path = Path(path)
    for inp in inputs:
        if path.resolve() == Path(inp).resolve():
            raise OutputRefused(f"output {path} is the input {inp}; choose another output")
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(path)
    tmp = _sibling(path, _TMP)
    try:
        yield tmp
        if tmp.exists():
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            _remove(tmp)


def cache_root() -> Path:
    """Where medray keeps what it can rebuild (API responses, imported models):
    $MEDRAY_CACHE_DIR, else ~/.cache/medray."""
    return Path(os.environ.get("MEDRAY_CACHE_DIR") or Path.home() / ".cache" / "medray")


def copy_tree_files(src: Path, dst: Path) -> None:
    """Copy the plain files of folder `src` (not its marker) into the folder `dst`."""
    for f in src.iterdir():
        if f.is_file() and f.name != MARKER:
            shutil.copyfile(f, dst / f.name)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str)
                             + "\n")


def write_jsonl_atomic(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    with atomic_file(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    return Path(path)
