"""Run-directory I/O for evaluation runs: predictions appended as they arrive (resumable),
run.json (the run's settings; a resume must match them), atomic JSON writes
(re-exported from medray.fsutil)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# write_*_atomic live in medray.fsutil; re-exported for the evaluation modules.
from medray.fsutil import (  # noqa: F401
    atomic_file,
    claim_directory,
    write_json_atomic,
    write_jsonl_atomic,
)

PREDICTIONS = "predictions.jsonl"
METRICS = "metrics.json"
RUN = "run.json"
# Settings that define a run: resuming OUT with different ones would mix two runs.
RUN_IDENTITY = ("engine", "dataset", "split", "shots", "sample", "seed",
                "group_as_multiple", "task")


class RunMismatch(ValueError):
    pass


def meta_dict(meta: Any) -> dict:
    if isinstance(meta, str):
        return json.loads(meta) if meta else {}
    return dict(meta or {})


def check_run(out: str | Path, settings: dict) -> None:
    """Write OUT/run.json, or check that an existing one describes the same run."""
    path = Path(out) / RUN
    if not path.is_file():
        claim_directory(out, command="eval")
    else:
        old = json.loads(path.read_text())
        diff = {k: (old.get(k), settings.get(k)) for k in RUN_IDENTITY
                if old.get(k) != settings.get(k)}
        if diff:
            detail = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
            raise RunMismatch(f"{path}: this output directory holds a different run "
                              f"({detail}); use another --output")
    write_json_atomic(path, settings)


def _repair(path: Path) -> None:
    """Drop a truncated last line (a run killed mid-write), atomically."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    with atomic_file(path) as tmp:
        tmp.write_bytes(data[: data.rfind(b"\n") + 1])


def read_predictions(path: str | Path) -> dict[str, dict]:
    """id -> row (the first answer per id wins); a truncated last line is ignored."""
    path = Path(path)
    rows: dict[str, dict] = {}
    if not path.is_file():
        return rows
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            if line.strip():
                row = json.loads(line)
                rows.setdefault(str(row["id"]), row)
    return rows


def done_ids(path: str | Path) -> set[str]:
    return set(read_predictions(path))


class PredictionWriter:
    """Appends rows and fsyncs after each batch, so a crash loses at most one batch."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            _repair(self.path)

    def append(self, rows: Sequence[dict]) -> None:
        if not rows:
            return
        with self.path.open("a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())


def prediction_row(engine: Any, ex: dict, prediction: str, gen: Any, conforming: bool,
                   prompt_format: str, context_tokens: int | None = None) -> dict:
    """The predictions row (docs/architecture.md), plus token usage of API calls."""
    logprob = getattr(gen, "mean_logprob", None)
    return {
        "id": ex["id"],
        "prediction": prediction,
        "logprob": logprob,
        "n_tokens": getattr(gen, "output_tokens", 0) or gen.n_tokens,
        "engine": getattr(engine, "name", type(engine).__name__),
        "model": str(getattr(engine, "model", "")),
        "adapter": getattr(engine, "adapter", None),
        "prompt_format": prompt_format,
        "context_tokens": context_tokens,
        "raw_output": gen.raw if gen.raw is not None else gen.text,
        "conforming": bool(conforming),
        "prompt_tokens": gen.prompt_tokens,
        "cached": bool(getattr(gen, "cached", False)),
    }
