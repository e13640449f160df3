"""Serve config files: serve/*.yaml validate, `medray serve` rejects bad ones (no Ray)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from medray.cli import app
from medray.serve_config import AppConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((ROOT / "serve").glob("*.yaml")))
def test_repo_serve_configs_are_valid(path, tmp_path):
    raw = yaml.safe_load(path.read_text())
    (application,) = raw["applications"]
    module, attr = application["import_path"].split(":")
    assert callable(getattr(importlib.import_module(module), attr))
    assert raw["http_options"]["host"] == "127.0.0.1"
    # Point the adapters at a real (empty-weights) adapter folder; everything else as is.
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    args = dict(application["args"], adapters={k: str(adapter) for k in
                                               application["args"].get("adapters", {})})
    cfg = AppConfig.model_validate(args)
    assert cfg.reserve == cfg.max_new_tokens and cfg.max_context_tokens == cfg.max_model_len


def test_config_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="adapter_config.json"):
        AppConfig(model="m", adapters={"ft": str(tmp_path)})
    with pytest.raises(ValueError, match="context_tokens"):
        AppConfig(model="m", context_tokens=4096, max_model_len=2048)
    with pytest.raises(ValueError, match="extra"):
        AppConfig(model="m", surprise=1)
    keys = tmp_path / "keys"
    keys.write_text("# comment\nk1\n\nk2\n")
    monkeypatch.setenv("MY_KEYS", "k3, k4")
    cfg = AppConfig(model="m", api_keys_env="MY_KEYS", api_keys_file=str(keys))
    assert cfg.api_keys() == {"k1", "k2", "k3", "k4"}


def test_medray_serve_rejects_bad_config(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"applications": [{"import_path": "medray.serve_app:build_app",
                                                     "args": {"model": "m", "llm": 3}}]}))
    res = CliRunner().invoke(app, ["serve", "--config", str(bad)])
    assert res.exit_code == 2 and "bad.yaml" in res.output and "llm" in res.output
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    res = CliRunner().invoke(app, ["serve", "--config", str(empty)])
    assert res.exit_code == 2 and "applications" in res.output
