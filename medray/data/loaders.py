"""One loader signature for every benchmark (what `DatasetSpec.loader` names):
(input_path, *, compat, shuffle, seed, encoding, image_dir) -> (examples, contexts or None,
manifest). Each adapter passes on the options its format has. A loader whose input embeds
images (EuropeMedQA's Parquet form) points its examples into `image_dir` (the prepared
folder) and hands the bytes over under manifest[EMBEDDED] ({name under images/: bytes}),
which `medray data prepare` writes there and never into manifest.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

Loaded = tuple[pa.Table, pa.Table | None, dict]
EMBEDDED = "_embedded_image_bytes"


def load_medqaro(input_path: str | Path, *, compat: str | None = None,
                 encoding: str | None = None, **_: Any) -> Loaded:
    from medray.data import medqaro

    return medqaro.load(input_path, compat=compat, encoding=encoding)


def load_robiology(input_path: str | Path, *, encoding: str | None = None, **_: Any) -> Loaded:
    from medray.data import robiology

    examples, manifest = robiology.load(input_path, encoding=encoding)
    return examples, None, manifest


def load_europemedqa(input_path: str | Path, *, shuffle: bool = True, seed: int | None = None,
                     encoding: str | None = None, image_dir: str | Path | None = None,
                     **_: Any) -> Loaded:
    from medray.data import europemedqa

    seed = europemedqa.SHUFFLE_SEED if seed is None else seed
    examples, manifest, blobs = europemedqa.load(input_path, shuffle=shuffle, seed=seed,
                                                 encoding=encoding, image_dir=image_dir)
    if blobs:
        manifest[EMBEDDED] = blobs
    return examples, None, manifest
