"""Config loading and the checks that fail before any worker starts (no Ray; ~10 s)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from medray.train.config import ConfigError, deepspeed_config, load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def _write(tmp_path: Path, cfg: dict) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_paper_defaults_and_overrides(tmp_path):
    p = _write(tmp_path, {"model": {"name_or_path": "m"}, "data": {"path": "d"}})
    cfg = load_config(p)
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout) == (8, 16, 0.05)
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.micro_batch_size,
            cfg.optim.grad_accum, cfg.optim.epochs, cfg.model.dtype) == (2e-5, 100, 1, 8, 3, "bf16")
    cfg = load_config(p, ["optim.lr=1e-3", "deepspeed.stage=3", "lora.target_modules=[q_proj]",
                          "prompt.context_tokens=3072"])
    assert cfg.optim.lr == 1e-3 and cfg.deepspeed.stage == 3
    assert cfg.lora.target_modules == ["q_proj"] and cfg.prompt.context_tokens == 3072


@pytest.mark.parametrize("bad, key", [
    ({"optim": {"lrr": 1}}, "unknown key 'optim.lrr'"),
    ({"extra": 1}, "unknown key 'extra'"),
    ({"deepspeed": {"stage": 4}}, "'deepspeed.stage'"),
    ({"deepspeed": {"stage": 2, "offload_params": True}}, "offload_params needs"),
    ({"data": {"path": "d", "batching": "prefix"},
      "model": {"name_or_path": "m", "attn_implementation": "eager"}},
     "data.batching 'prefix' needs model.attn_implementation 'sdpa'"),
])
def test_bad_keys_are_named(tmp_path, bad, key):
    raw = {"model": {"name_or_path": "m"}, "data": {"path": "d"}, **bad}
    with pytest.raises(ConfigError, match=key.replace("(", r"\(")):
        load_config(_write(tmp_path, raw))


def test_bad_override_is_named(tmp_path):
    p = _write(tmp_path, {"model": {"name_or_path": "m"}, "data": {"path": "d"}})
    with pytest.raises(ConfigError, match="unknown key 'optim.learning_rate'"):
        load_config(p, ["optim.learning_rate=3"])
    with pytest.raises(ConfigError, match="not key=value"):
        load_config(p, ["optim.lr"])


def test_deepspeed_config_generated():
    cfg = load_config(CONFIGS / "tiny-cpu.yaml", ["deepspeed.offload_optimizer=true",
                                                  "model.dtype=bf16", "model.name_or_path=m",
                                                  "data.path=d"])
    ds = deepspeed_config(cfg, world_size=2)
    assert ds["zero_optimization"]["stage"] == 2
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["bf16"]["enabled"] and not ds["fp16"]["enabled"]
    assert ds["train_batch_size"] == cfg.optim.micro_batch_size * cfg.optim.grad_accum * 2


TRAIN_CONFIGS = ["tiny-cpu", "phi-4-mini-2048", "phi-4-mini-3072", "phi-4-mini-4096",
                 "phi-4-mini-8192", "rollama2-7b-2048", "romistral-7b-4096", "openbiollm-8b-2048"]


def test_every_shipped_training_config_validates():
    for name in TRAIN_CONFIGS:
        p = CONFIGS / f"{name}.yaml"
        paths = ["model.name_or_path=m", "data.path=d"] if name == "tiny-cpu" else []
        cfg = load_config(p, paths)
        if "phi-4" in p.name:
            assert cfg.lora.target_modules == ["qkv_proj", "o_proj"]
            assert cfg.model.name_or_path == "microsoft/Phi-4-mini-instruct"


def test_preflight_fails_before_workers(tiny_model, medqaro_prepared, tmp_path):
    from medray.models import LoraTargetError
    from medray.prompts.tokens import BudgetError
    from medray.train.presets import tiny_config
    from medray.train.trainer import preflight

    plan = preflight(tiny_config(tiny_model, medqaro_prepared))
    assert plan.lora_targets == ["q_proj", "k_proj", "v_proj", "o_proj"]
    with pytest.raises(FileNotFoundError, match="model.name_or_path"):
        preflight(tiny_config(tmp_path / "no-model", medqaro_prepared))
    with pytest.raises(LoraTargetError, match=r"\['qkv_proj'\]"):
        preflight(tiny_config(tiny_model, medqaro_prepared, ["lora.target_modules=[qkv_proj]"]))
    with pytest.raises(BudgetError, match="prompt.context_tokens=16"):
        preflight(tiny_config(tiny_model, medqaro_prepared, ["prompt.context_tokens=16"]))
    with pytest.raises(FileNotFoundError, match="data.path"):
        preflight(tiny_config(tiny_model, tmp_path))


def test_train_cli_exits_2_on_bad_config(tiny_model, medqaro_prepared, tmp_path):
    from typer.testing import CliRunner

    from medray.cli import app

    p = _write(tmp_path, {"model": {"name_or_path": str(tiny_model)},
                          "data": {"path": str(medqaro_prepared)}})
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", "--config", str(p), "--output", str(out),
                                   "optim.lrr=1"])
    assert res.exit_code == 2 and "unknown key 'optim.lrr'" in res.output
    res = CliRunner().invoke(app, ["train", "--config", str(p), "--output", str(out),
                                   "lora.target_modules=[fc1]"])
    assert res.exit_code == 2 and "fc1" in res.output
    assert not out.exists()  # nothing written, no worker started


def test_shipped_tiny_config_names_the_paths_to_set():
    """configs/tiny-cpu.yaml carries no machine-specific paths: it says which key to set."""
    with pytest.raises(ConfigError, match=r"model.name_or_path is not set: pass "
                                          r"model.name_or_path=PATH"):
        load_config(CONFIGS / "tiny-cpu.yaml")
    with pytest.raises(ConfigError, match=r"data.path is not set: pass data.path=DIR"):
        load_config(CONFIGS / "tiny-cpu.yaml", ["model.name_or_path=m"])
    assert load_config(CONFIGS / "tiny-cpu.yaml",
                       ["model.name_or_path=m", "data.path=d"]).data.path == "d"


TRAIN_COMMAND = re.compile(r"(?:jobs/finetune\.py|jobs/sweep\.py|medray train|medray tune)\s+"
                           r"--config\s+(\S+)(.*)")
OVERRIDE = re.compile(r"^[a-z_]+(?:\.[a-z_]+)+=")


def _written_training_commands() -> list[tuple[str, str, list[str]]]:
    """(file, config, overrides) of every training/sweep command the repo writes out: README,
    docs, scripts, benches, config headers, deployment files. Shell continuations are joined;
    commands on a config the repo does not ship (a sweep's best.yaml) are left out."""
    files = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("scripts/*.sh"),
             *ROOT.glob("bench/*.py"), *ROOT.glob("configs/*.yaml"),
             *ROOT.glob("deploy/**/*.yaml"), ROOT / "cluster.yaml"]
    found = []
    for f in files:
        text = re.sub(r"\\\n\s*#?\s*", " ", f.read_text())
        for m in TRAIN_COMMAND.finditer(text):
            config = ROOT / m.group(1).strip("\"'`")
            if config.is_file():
                words = m.group(2).split("#", 1)[0].split()
                found.append((f.relative_to(ROOT).as_posix(), str(config),
                              [re.sub("[\"'`]", "", w) for w in words if OVERRIDE.match(w)]))
    return found


def test_every_written_training_command_loads_with_its_overrides():
    """A renamed config key breaks the commands users copy (the job-submit smoke script once
    passed one that had moved); each one's config and overrides must still validate."""
    commands = _written_training_commands()
    where = {f for f, _, _ in commands}
    assert {"README.md", "docs/training.md", "docs/sweeps.md", "scripts/smoke_job_submit.sh",
            "cluster.yaml"} <= where, where
    assert any(ov for _, _, ov in commands)
    for f, config, overrides in commands:
        paths = [f"{k}=x" for k in ("model.name_or_path", "data.path")
                 if not any(o.startswith(f"{k}=") for o in overrides)]
        try:
            load_config(config, overrides + paths)
        except ConfigError as e:
            pytest.fail(f"{f}: {Path(config).name} {' '.join(overrides)}: {e}")
