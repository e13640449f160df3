"""The prepared-dataset directory: manifest.json + examples.parquet (+ contexts.parquet).

Written atomically (a temporary sibling directory renamed into place), so an interrupted
`medray data prepare` never leaves a half-written dataset behind.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from medray.io import atomic_directory, write_bytes_atomic

MANIFEST = "manifest.json"
EXAMPLES = "examples.parquet"
CONTEXTS = "contexts.parquet"
IMAGES = "images"  # images an input embeds (EuropeMedQA's Parquet form), by content hash


@dataclass
class PreparedData:
    manifest: dict
    examples: pd.DataFrame
    contexts: pd.DataFrame | None = None

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def dataset(self) -> str:
        return self.manifest["dataset"]

    def split(self, name: str) -> pd.DataFrame:
        if name not in self.manifest["splits"]:
            raise KeyError(f"split {name!r} not in {sorted(self.manifest['splits'])}")
        return self.examples[self.examples["split"] == name].reset_index(drop=True)

    def context(self, context_id: str) -> str:
        if self.contexts is None:
            raise KeyError(f"{self.dataset} has no contexts table")
        return self._context_index()[context_id]

    def _context_index(self) -> dict[str, str]:
        if not hasattr(self, "_ctx_cache"):
            assert self.contexts is not None
            ctx = self.contexts
            self._ctx_cache = dict(zip(ctx["context_id"], ctx["text"], strict=True))
        return self._ctx_cache


def load_prepared(path: str | os.PathLike) -> PreparedData:
    root = Path(path)
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{root} is not a prepared dataset (no {MANIFEST}); "
                                "run `medray data prepare` first")
    manifest = json.loads(manifest_path.read_text())
    examples = pq.read_table(root / EXAMPLES).to_pandas()
    contexts = pq.read_table(root / CONTEXTS).to_pandas() if (root / CONTEXTS).exists() else None
    return PreparedData(manifest=manifest, examples=examples, contexts=contexts)


def write_prepared(
    out: str | os.PathLike,
    manifest: dict,
    examples: pa.Table,
    contexts: pa.Table | None = None,
    *,
    inputs: tuple[str | os.PathLike, ...] = (),
    force: bool = False,
    images: Mapping[str, bytes] | None = None,
) -> Path:
    """Write all files into a temporary sibling directory, then swap it into place;
    `images` ({file name: bytes}) go to its images/ folder."""
    out = Path(out)
    with atomic_directory(out, inputs=inputs, force=force, command="data prepare") as tmp:
        for name, data in sorted((images or {}).items()):
            write_bytes_atomic(tmp / IMAGES / name, data)
        pq.write_table(examples, tmp / EXAMPLES)
        if contexts is not None:
            pq.write_table(contexts, tmp / CONTEXTS)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return out


def read_table(path: str | os.PathLike, table: str = "examples",
               columns: list[str] | None = None) -> Any:
    """One table of a prepared dataset ("examples" or "contexts") as a lazy Ray Dataset:
    the streamed reads of training and evaluation go through here, like load_prepared's."""
    import ray.data

    names = {"examples": EXAMPLES, "contexts": CONTEXTS}
    if table not in names:
        raise ValueError(f"unknown prepared table {table!r}; expected one of {sorted(names)}")
    return ray.data.read_parquet(str(Path(path) / names[table]), columns=columns)
