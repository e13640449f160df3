"""One loader signature for every benchmark (what `DatasetSpec.loader` names):
(input_path, *, compat, shuffle, seed, encoding) -> (examples, contexts or None, manifest).
Each adapter passes on the options its format has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

Loaded = tuple[pa.Table, pa.Table | None, dict]


def load_medqaro(input_path: str | Path, *, compat: str | None = None,
                 encoding: str | None = None, **_: Any) -> Loaded:
    from medray.data import medqaro

    return medqaro.load(input_path, compat=compat, encoding=encoding)


def load_robiology(input_path: str | Path, *, encoding: str | None = None, **_: Any) -> Loaded:
    from medray.data import robiology

    examples, manifest = robiology.load(input_path, encoding=encoding)
    return examples, None, manifest


def load_europemedqa(input_path: str | Path, *, shuffle: bool = True, seed: int | None = None,
                     encoding: str | None = None, **_: Any) -> Loaded:
    from medray.data import europemedqa

    seed = europemedqa.SHUFFLE_SEED if seed is None else seed
    examples, manifest = europemedqa.load(input_path, shuffle=shuffle, seed=seed,
                                          encoding=encoding)
    return examples, None, manifest
