"""The run folder every `medray eval` writes, whatever the engine:

OUT/config.json        the resolved eval config; a resume must give the same one
OUT/predictions.jsonl  one `prediction_row` per item, appended (and fsynced) as answers
                       arrive; a torn last line (a crash mid-write) is dropped on resume
OUT/metrics.json       `{"run": how it was computed, "requests", "metrics": {mode: score}}`
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# write_*_atomic live in medray.io; re-exported for the evaluation modules.
from medray.io import (  # noqa: F401
    atomic_file,
    check_output,
    claim_directory,
    write_json_atomic,
    write_jsonl_atomic,
)

CONFIG = "config.json"
PREDICTIONS = "predictions.jsonl"
METRICS = "metrics.json"
# The fields every prediction row has, in this order (engine-specific extras follow).
PREDICTION_FIELDS = ("id", "prediction", "logprob", "n_tokens", "engine", "model", "adapter",
                     "prompt_format", "context_tokens", "raw_output", "conforming")


class RunMismatch(ValueError):
    pass


def prediction_row(example_id: str, prediction: str, *, engine: str, model: str | None,
                   adapter: str | None = None, raw_output: str | None = None,
                   conforming: bool = True, logprob: float | None = None,
                   n_tokens: int | None = None, prompt_format: str | None = None,
                   context_tokens: int | None = None, **extra: Any) -> dict[str, Any]:
    """One predictions.jsonl row (readable by `medray score`)."""
    row = {"id": str(example_id), "prediction": prediction, "logprob": logprob,
           "n_tokens": n_tokens, "engine": engine, "model": model, "adapter": adapter,
           "prompt_format": prompt_format, "context_tokens": context_tokens,
           "raw_output": prediction if raw_output is None else raw_output,
           "conforming": bool(conforming)}
    return row | extra


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any],
                ignore: Sequence[str] = ()) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (old, new) for every setting that differs."""
    a, b = _flat(old), _flat(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not any(k == i or k.startswith(i + ".") for i in ignore)}


def open_run(out: str | Path, config: Mapping[str, Any], *, inputs: Sequence[str | Path] = (),
             ignore: Sequence[str] = ()) -> None:
    """Claim OUT and write config.json, or check that an existing one is the same run
    (settings in `ignore` may change between sessions of one run)."""
    path = Path(out) / CONFIG
    check_output(out, inputs)  # a folder medray did not create is refused before reading it
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise RunMismatch(f"{path}: not valid JSON ({err.msg}); use another --output"
                              ) from None
        diff = config_diff(old, config, ignore)
        if diff:
            detail = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
            raise RunMismatch(f"{path}: this output directory holds a different run "
                              f"({detail}); use another --output")
    claim_directory(out, inputs=list(inputs), command="eval")
    write_json_atomic(path, dict(config))


def _complete_bytes(path: Path) -> int:
    """Length of the file's prefix made of whole JSON lines."""
    good = 0
    with path.open("rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            try:
                json.loads(raw)
            except json.JSONDecodeError:
                break
            good += len(raw)
    return good


def repair(path: str | Path) -> None:
    """Drop a torn last line (a run killed mid-write) so appends stay valid JSONL."""
    path = Path(path)
    if not path.is_file():
        return
    good = _complete_bytes(path)
    if good != path.stat().st_size:
        with atomic_file(path) as tmp:
            tmp.write_bytes(path.read_bytes()[:good])


def read_predictions(path: str | Path) -> dict[str, dict]:
    """id -> row (the first answer per id wins); a torn last line is ignored."""
    path = Path(path)
    rows: dict[str, dict] = {}
    if not path.is_file():
        return rows
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break
            rows.setdefault(str(row["id"]), row)
    return rows


def done_ids(path: str | Path) -> set[str]:
    return set(read_predictions(path))


class PredictionWriter:
    """Appends rows and fsyncs after each batch, so a crash loses at most one batch."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair(self.path)
        self._f = self.path.open("a", encoding="utf-8")

    def append(self, rows: Sequence[dict]) -> None:
        if not rows:
            return
        for row in rows:
            self._f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> PredictionWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
