"""The quiet console: a command's own lines reach the terminal; everything else a process
writes, including what it writes while the interpreter exits, goes to the command's log."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import atexit, os, sys
    from pathlib import Path
    from medray.console import command_console, exit_output_to_log

    # what Ray's threads and finalizers do after a node loss: write once the command is over
    atexit.register(lambda: print("Traceback (most recent call last): at exit",
                                  file=sys.stderr, flush=True))
    with command_console("probe", Path(sys.argv[1])) as display:
        display.print("the command's own line")
        os.write(2, b"library chatter on fd 2\\n")
        print("library chatter on sys.stdout")
    print("the summary after the console")
    exit_output_to_log()
""")


def test_exit_output_goes_to_the_log_and_the_command_lines_to_the_terminal(tmp_path: Path):
    logs = tmp_path / "logs"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(logs)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    terminal = proc.stdout + proc.stderr
    assert "the command's own line" in terminal and "the summary after the console" in terminal
    assert "chatter" not in terminal and "Traceback" not in terminal, terminal
    log = (logs / "probe.log").read_text()
    for line in ("library chatter on fd 2", "library chatter on sys.stdout",
                 "Traceback (most recent call last): at exit", "[medray] the command's own"):
        assert line in log, log
