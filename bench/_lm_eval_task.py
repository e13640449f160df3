"""Shared by the benches that compare medray with the tools users pick instead
(lm_eval_parity.py, eval_peer.py, train_peer.py): the SmolLM2 checkpoint, `medray` CLI
calls, and lm-evaluation-harness task folders written from the strings medray itself uses.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OFFLINE = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def medray_cli(*args: str) -> None:
    """`medray ARGS` in a child process (the same interpreter), quiet unless it fails."""
    proc = subprocess.run([sys.executable, "-m", "medray", *args], capture_output=True,
                          text=True)
    if proc.returncode:
        raise RuntimeError(f"medray {shlex.join(args)} failed:\n{proc.stdout}{proc.stderr}")


def smollm2_checkpoint(model: str | None, default: Path) -> str:
    """`model`, else SmolLM2-135M-Instruct imported by `medray model smollm2` into
    `default` (kept: a folder that already holds it is reused)."""
    if model is not None:
        return model
    if not (default / "config.json").is_file():
        t0 = time.perf_counter()
        medray_cli("model", "smollm2", "--out", str(default))
        print(f"imported SmolLM2-135M-Instruct to {default} in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    return str(default)


def write_task(folder: Path, task: str, docs: list[dict], **fields: Any) -> str:
    """A task folder lm-eval reads with `TaskManager(include_path=folder)`: the docs as
    JSON lines (its test split) and TASK.yaml with `fields` (JSON is YAML)."""
    data = folder / f"{task}.jsonl"
    data.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
    (folder / f"{task}.yaml").write_text(json.dumps({
        "task": task, "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test", **fields, "metadata": {"version": 1.0}}, indent=1))
    return task
