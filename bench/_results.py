"""Where benches put their numbers: docs/results/NAME.json, with the commit, the date and
the machine they were measured on (rendered into docs/results.md by bench/render_results.py).

    from _results import write_results
    write_results("serve_memory", {"rows": [...]}, command="bench/serve_memory.py")
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
sys.path.insert(0, str(ROOT))


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "medray", "bench"], capture_output=True, text=True).stdout
        return out + ("+changes" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_results(name: str, results: dict[str, Any], *, command: str,
                  folder: Path | None = None) -> Path:
    """Write `results` as NAME.json with commit, date (UTC) and machine; returns the path."""
    from medray.demo.machine import describe_machine
    from medray.io import write_json_atomic

    record = {"bench": name, "command": command, "commit": _commit(),
              "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
              "machine": describe_machine(), "results": results}
    path = (folder or RESULTS) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)
    print(f"results written to {path}", file=sys.stderr)
    return path
