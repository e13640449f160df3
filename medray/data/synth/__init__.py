"""Deterministic synthetic corpora in the benchmarks' raw formats (public entry points).

- ``write_medqaro(out_dir, seed=0, scale="small")``: train/val/test/test_cross CSV files
  (extra kwargs ``n_patients`` and ``words`` resize the corpus, e.g. for the demo).
- ``write_robiology(out_dir, seed=0, scale="small")``: train/validation/test JSON files.
- ``write_europemedqa(out_dir, seed=0, scale="small")``: europemedqa.csv + images/*.png.

Same arguments -> byte-identical files. ``scale`` is one of ``SCALES``; anything else raises
``ValueError`` naming the allowed values.
"""

from __future__ import annotations

from medray.data.registry import DATASETS
from medray.data.synth.mcq import write_europemedqa, write_robiology
from medray.data.synth.medqaro import SCALES, write_medqaro

# Each benchmark's generator, as its DatasetSpec names it.
WRITERS = {name: spec.write_synthetic for name, spec in DATASETS.items()}

__all__ = ["SCALES", "WRITERS", "write_europemedqa", "write_medqaro", "write_robiology"]
