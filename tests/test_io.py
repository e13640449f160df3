"""The safe-output mechanism: swap order, stale temp siblings, permissions, refusals."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from medray import io as fsio
from medray.io import (
    MARKER,
    OutputRefused,
    atomic_directory,
    check_output,
    claim_directory,
    clean_stale,
    write_json_atomic,
)


def test_swap_renames_old_aside_before_the_new_one_goes_in(tmp_path, monkeypatch):
    out = tmp_path / "out"
    with atomic_directory(out) as tmp:
        (tmp / "v").write_text("1")
    calls: list[tuple[str, str]] = []
    real_rename = os.rename

    def spy(src, dst):
        # At every rename, a complete output exists under `out` or under an aside name.
        names = os.listdir(tmp_path)
        assert "out" in names or any(".medray-old." in n for n in names)
        calls.append((Path(src).name, Path(dst).name))
        real_rename(src, dst)

    monkeypatch.setattr(fsio.os, "rename", spy)
    with atomic_directory(out) as tmp:
        (tmp / "v").write_text("2")
    assert (out / "v").read_text() == "2"
    assert calls[0][0] == "out" and ".medray-old." in calls[0][1]  # old aside first
    assert ".medray-tmp." in calls[1][0] and calls[1][1] == "out"  # then new in
    assert sorted(os.listdir(tmp_path)) == ["out"]  # old deleted last


def test_failure_keeps_the_old_output_and_leaves_no_temp(tmp_path):
    out = tmp_path / "out"
    with atomic_directory(out) as tmp:
        (tmp / "v").write_text("1")
    with pytest.raises(RuntimeError), atomic_directory(out) as tmp:
        (tmp / "v").write_text("half")
        raise RuntimeError("killed")
    assert (out / "v").read_text() == "1" and sorted(os.listdir(tmp_path)) == ["out"]


def test_permissions_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_directory(tmp_path / "out") as tmp:
            (tmp / "f").write_text("x")
        write_json_atomic(tmp_path / "one.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "one.json").stat().st_mode) == 0o644


def test_marker_is_written_and_deterministic(tmp_path):
    for name in ("a", "b"):
        with atomic_directory(tmp_path / name, command="test"):
            pass
    a, b = ((tmp_path / n / MARKER).read_bytes() for n in "ab")
    assert a == b and json.loads(a)["created_by"].startswith("medray")


def _kill_mid_write(tmp_path: Path, out: Path) -> None:
    """A real process killed with SIGKILL inside atomic_directory."""
    code = (f"import time; from medray.io import atomic_directory\n"
            f"with atomic_directory({str(out)!r}) as t:\n"
            f"    (t / 'half').write_text('x'); print('ready', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_stale_temp_from_a_killed_run_is_removed_by_the_next_run(tmp_path):
    out = tmp_path / "out"
    _kill_mid_write(tmp_path, out)
    stale = [n for n in os.listdir(tmp_path) if ".medray-tmp." in n]
    assert len(stale) == 1
    foreign = tmp_path / ".out.tmp-unrelated"  # not medray's pattern: never touched
    foreign.mkdir()
    with atomic_directory(out) as tmp:
        (tmp / "v").write_text("new")
    assert sorted(os.listdir(tmp_path)) == [".out.tmp-unrelated", "out"]


def test_a_live_writers_temp_is_kept(tmp_path):
    live = tmp_path / f".out.medray-tmp.{fsio.socket.gethostname().replace('.', '_')}" \
        f".{os.getpid()}.abcd"
    live.mkdir()
    assert clean_stale(tmp_path / "out") == [] and live.exists()


def test_old_output_set_aside_by_a_kill_is_put_back(tmp_path):
    out = tmp_path / "out"
    host = fsio.socket.gethostname().replace(".", "_")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    time.sleep(0.1)
    aside = tmp_path / f".out.medray-old.{host}.{dead}.abcd"
    aside.mkdir()
    (aside / "v").write_text("old")
    clean_stale(out)
    assert (out / "v").read_text() == "old" and not aside.exists()


def test_refusals_name_both_paths(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.csv").write_text("1")
    for out, word in ((data, "is the input"), (tmp_path, "contains the input"),
                      (data / "sub", "is inside the input")):
        for force in (False, True):
            with pytest.raises(OutputRefused, match=word) as err:
                check_output(out, [data], force=force)
            assert str(out) in str(err.value) and str(data) in str(err.value)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(OutputRefused, match="did not create"):
        claim_directory(foreign)
    check_output(foreign, force=True)
    claim_directory(tmp_path / "fresh")
    assert (tmp_path / "fresh" / MARKER).is_file()
    check_output(tmp_path / "fresh")  # medray's own (marker): fine


def test_report_and_export_refuse_foreign_folders(tmp_path):
    from medray.train.checkpoints import export_adapter

    ckpt = tmp_path / "ckpt"
    (ckpt / "adapter").mkdir(parents=True)
    (ckpt / "adapter" / "adapter_config.json").write_text("{}")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep").write_text("x")
    with pytest.raises(OutputRefused):
        export_adapter(ckpt, foreign)
    with pytest.raises(OutputRefused, match="is inside the input"):
        export_adapter(ckpt, ckpt / "out")
    assert export_adapter(ckpt, tmp_path / "adapter") == tmp_path / "adapter"
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert (foreign / "keep").read_text() == "x"
