"""Shared fixtures: ONE local Ray cluster per test session, synthetic data, tiny models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# shared/ lies beside the repository (here and in CI); MEDRAY_SHARED_DATA overrides it.
SHARED_DATA = Path(
    os.environ.get("MEDRAY_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)

# Keep every test offline and quiet.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"real data not available at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray cluster for the whole session (4 logical CPUs so Serve ingress fits)."""
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=4,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
        )
    yield ray
    ray.shutdown()


# --- data fixtures (lead) ---
@pytest.fixture(scope="session")
def synthetic_medqaro_raw(tmp_path_factory) -> Path:
    from medray.data.synth import write_medqaro

    return write_medqaro(tmp_path_factory.mktemp("medqaro_raw"), seed=0, scale="small")


@pytest.fixture(scope="session")
def medqaro_prepared(synthetic_medqaro_raw, tmp_path_factory) -> Path:
    from medray.data.prepare import prepare

    out = tmp_path_factory.mktemp("medqaro_prepared") / "data"
    prepare("medqaro", synthetic_medqaro_raw, out)
    return out


@pytest.fixture(scope="session")
def synthetic_robiology_raw(tmp_path_factory) -> Path:
    from medray.data.synth import write_robiology

    return write_robiology(tmp_path_factory.mktemp("robiology_raw"), seed=0, scale="small")


@pytest.fixture(scope="session")
def robiology_prepared(synthetic_robiology_raw, tmp_path_factory) -> Path:
    from medray.data.prepare import prepare

    out = tmp_path_factory.mktemp("robiology_prepared") / "data"
    prepare("robiology", synthetic_robiology_raw, out)
    return out


@pytest.fixture(scope="session")
def synthetic_europemedqa_raw(tmp_path_factory) -> Path:
    from medray.data.synth import write_europemedqa

    return write_europemedqa(tmp_path_factory.mktemp("europemedqa_raw"), seed=0, scale="small")


@pytest.fixture(scope="session")
def europemedqa_prepared(synthetic_europemedqa_raw, tmp_path_factory) -> Path:
    from medray.data.prepare import prepare

    out = tmp_path_factory.mktemp("europemedqa_prepared") / "data"
    prepare("europemedqa", synthetic_europemedqa_raw, out)
    return out


# --- metrics fixtures (issue 3) ---

# --- model and training fixtures (issue 4) ---

# --- serving and evaluation fixtures (issue 6) ---
