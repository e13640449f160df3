"""Data governance: clinical context goes to an external provider only with explicit consent.

MedQARo holds real patients' epicrises: sending them to a paid API (openai:, anthropic:)
requires `--allow-external-api`, checked BEFORE any engine is built or any call is made.
Public exam data (RoBiology, EuropeMedQA) needs no flag. The decision is recorded in the
run's outputs (`governance` in metrics.json and config.json).
"""

from __future__ import annotations

import datetime as dt

from medray.data.registry import DATASETS
from medray.engines.registry import EngineSpec, parse_spec

# The datasets whose DatasetSpec says clinical text.
CLINICAL_DATASETS = frozenset(name for name, spec in DATASETS.items() if spec.clinical)
FLAG = "--allow-external-api"


class GovernanceError(RuntimeError):
    """Raised when clinical data would leave the machine without the explicit flag; the CLI
    maps it to exit status 2."""


def check_external_use(dataset: str, engine: str | EngineSpec, allow_external_api: bool,
                       base_url: str | None = None) -> dict:
    """Raise GovernanceError, or return the record of the decision for the run outputs."""
    spec = parse_spec(engine) if isinstance(engine, str) else engine
    clinical = dataset in CLINICAL_DATASETS
    if clinical and spec.external and not allow_external_api:
        raise GovernanceError(
            f"refusing to send clinical context ({dataset} epicrises) to the external "
            f"provider {spec.provider!r} (engine {spec}): pass {FLAG} to confirm that this "
            "is permitted for your copy of the data. Nothing was sent.")
    return {
        "dataset": dataset,
        "clinical_data": clinical,
        "engine": str(spec),
        "external_provider": spec.external,
        "base_url": base_url,
        "allow_external_api": bool(allow_external_api),
        "flag_required": clinical and spec.external,
        "checked_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
