"""`medray data prepare`: any benchmark's raw files -> one prepared directory."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa

from medray import __version__
from medray.data import europemedqa, medqaro, robiology
from medray.data.prepared import PreparedData, load_prepared, write_prepared
from medray.fsutil import check_output

DATASETS = ("medqaro", "robiology", "europemedqa")


def prepare(
    dataset: str,
    input_path: str | Path,
    out: str | Path,
    *,
    compat: str | None = None,
    shuffle: bool = True,
    seed: int = europemedqa.SHUFFLE_SEED,
    encoding: str | None = None,
    force: bool = False,
) -> PreparedData:
    """Validate, normalise and write `out` atomically; raises DataError on bad input and
    OutputRefused (before reading anything) when `out` could destroy data."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {DATASETS}")
    check_output(out, [input_path], force)
    contexts: pa.Table | None = None
    if dataset == "medqaro":
        examples, contexts, manifest = medqaro.load(input_path, compat=compat, encoding=encoding)
    elif dataset == "robiology":
        examples, manifest = robiology.load(input_path, encoding=encoding)
    else:
        examples, manifest = europemedqa.load(input_path, shuffle=shuffle, seed=seed,
                                              encoding=encoding)
    splits = Counter(examples.column("split").to_pylist())
    manifest.update(
        source=str(Path(input_path).resolve()),
        splits=dict(sorted(splits.items())),
        created_by=f"medray {__version__}",
    )
    write_prepared(out, manifest, examples, contexts, inputs=(input_path,), force=force)
    return load_prepared(out)
