"""`medray data prepare`: any benchmark's raw files -> one prepared directory."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from medray import __version__
from medray.data import europemedqa
from medray.data.loaders import EMBEDDED
from medray.data.prepared import PreparedData, load_prepared, write_prepared
from medray.data.registry import dataset_spec
from medray.io import check_output


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
    spec = dataset_spec(dataset)
    check_output(out, [input_path], force)
    examples, contexts, manifest = spec.load(input_path, compat=compat, shuffle=shuffle,
                                             seed=seed, encoding=encoding,
                                             image_dir=Path(out).resolve())
    images = manifest.pop(EMBEDDED, {})  # written into `out`, where the examples point
    splits = Counter(examples.column("split").to_pylist())
    manifest.update(
        source=str(Path(input_path).resolve()),
        splits=dict(sorted(splits.items())),
        created_by=f"medray {__version__}",
    )
    write_prepared(out, manifest, examples, contexts, inputs=(input_path,), force=force,
                   images=images)
    return load_prepared(out)
