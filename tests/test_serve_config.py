"""Serve config files: serve/*.yaml validate, `medray serve` rejects bad ones (no Ray)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from medray.cli import app
from medray.serve.config import AppConfig, load_serve_file
from medray.serve.validation import ServeConfigError, check_servable

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((ROOT / "serve").glob("*.yaml")))
def test_repo_serve_configs_are_valid(path, tmp_path):
    raw = yaml.safe_load(path.read_text())
    (application,) = raw["applications"]
    module, attr = application["import_path"].split(":")
    assert callable(getattr(importlib.import_module(module), attr))
    assert raw["http_options"]["host"] == "127.0.0.1"
    cfg = AppConfig.model_validate(application["args"])
    assert cfg.max_context_tokens == cfg.max_model_len
    assert cfg.prompt is not None and cfg.prompt.model_fields_set == {"context_tokens"}


def test_config_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="adapter_config.json"):
        check_servable(AppConfig(model="m", device="cpu", adapters={"ft": str(tmp_path)}))
    with pytest.raises(ValueError, match="prompt.context_tokens 4096 > limit 2048"):
        AppConfig(model="m", device="cpu", prompt={"context_tokens": 4096}, max_model_len=2048)
    with pytest.raises(ValueError, match="'max_new_tokens' moved to 'prompt.max_new_tokens'"):
        AppConfig(model="m", device="cpu", max_new_tokens=12)
    with pytest.raises(ValueError, match="extra"):
        AppConfig(model="m", device="cpu", surprise=1)
    with pytest.raises(ValueError, match="device"):  # explicit: cpu or gpu, no guessing
        AppConfig(model="m")
    with pytest.raises(ValueError, match="device"):
        AppConfig(model="m", device="auto")
    keys = tmp_path / "keys"
    keys.write_text("# comment\nk1\n\nk2\n")
    monkeypatch.setenv("MY_KEYS", "k3, k4")
    cfg = AppConfig(model="m", device="cpu", api_keys_env="MY_KEYS", api_keys_file=str(keys))
    assert cfg.api_keys() == {"k1", "k2", "k3", "k4"}


def _model(path: Path) -> Path:
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=1, tie_word_embeddings=True).save_pretrained(path)
    return path


def _adapter(path: Path, modules: list[str], **config) -> Path:
    import json

    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 8, "target_modules": modules, **config}))
    save_file({f"base_model.model.model.layers.0.{m}.lora_A.weight": torch.zeros(8, 64)
               for m in modules}, str(path / "adapter_model.safetensors"))
    return path


def test_startup_checks_name_the_path_and_the_fix(tmp_path):
    base = _model(tmp_path / "base")
    ok = _adapter(tmp_path / "ok", ["self_attn.q_proj", "mlp.down_proj"])
    check_servable(AppConfig(model=str(base), device="cpu", adapters={"ft": str(ok)}))
    cases = {
        "modules_to_save": (_adapter(tmp_path / "mts", ["self_attn.q_proj"],
                                     modules_to_save=["embed_tokens"]), "medray export"),
        "rank 64 > max_lora_rank 16": (_adapter(tmp_path / "r64", ["self_attn.q_proj"], r=64),
                                       "max_lora_rank"),
        "lm_head": (_adapter(tmp_path / "head", ["lm_head"]), "--merge"),
        "DoRA": (_adapter(tmp_path / "dora", ["self_attn.q_proj"], use_dora=True), "--merge"),
    }
    for problem, (path, fix) in cases.items():
        with pytest.raises(ServeConfigError) as err:
            check_servable(AppConfig(model=str(base), device="cpu", adapters={"x": str(path)}))
        assert problem in str(err.value) and fix in str(err.value) and str(path) in str(err.value)


def test_relative_paths_resolve_against_the_config_folder(tmp_path):
    conf = tmp_path / "serve"
    conf.mkdir()
    _model(tmp_path / "models" / "base")
    (conf / "x.yaml").write_text(yaml.safe_dump({"applications": [{
        "import_path": "medray.serve.app:build_app",
        "args": {"model": "../models/base", "models": {"ft": "../models/merged"},
                 "device": "cpu"}}]}))
    spec = load_serve_file(conf / "x.yaml")
    cfg = spec.args.resolved()
    assert cfg.model == str(tmp_path / "models" / "base")
    with pytest.raises(ServeConfigError) as err:
        check_servable(cfg, spec.args)
    msg = str(err.value)
    assert f"models.ft: no such model folder {tmp_path / 'models' / 'merged'}" in msg
    assert f"resolved against {conf}, the config file's folder" in msg
    # `medray serve` says the same and exits 2 before starting Ray.
    res = CliRunner().invoke(app, ["serve", "--config", str(conf / "x.yaml")])
    assert res.exit_code == 2 and "no such model folder" in res.output


def test_cpu_config_serves_what_make_demo_writes():
    """serve/medqaro-cpu.yaml: the demo's pre-trained base and its merged fine-tuned model."""
    from medray.demo import model_dirs

    spec = load_serve_file(ROOT / "serve" / "medqaro-cpu.yaml")
    cfg = spec.args.resolved()
    dirs = model_dirs(ROOT / "runs" / "demo")  # the Makefile's DEMO_DIR
    assert cfg.model == str(dirs["pretrained"])
    assert cfg.models == {"medray-ft": str(dirs["merged"])}
    assert cfg.device == "cpu" and cfg.api_keys_env == "MEDRAY_API_KEYS"
    readme = (ROOT / "README.md").read_text()
    assert "MEDRAY_API_KEYS=" in readme and "medray serve --config serve/medqaro-cpu.yaml" in readme


def test_medray_serve_rejects_bad_config(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"applications": [{"import_path": "medray.serve.app:build_app",
                                                     "args": {"model": "m", "llm": 3,
                                                              "device": "cpu"}}]}))
    res = CliRunner().invoke(app, ["serve", "--config", str(bad)])
    assert res.exit_code == 2 and "bad.yaml" in res.output and "llm" in res.output
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    res = CliRunner().invoke(app, ["serve", "--config", str(empty)])
    assert res.exit_code == 2 and "applications" in res.output


def test_llm_replicas_read_local_folders_in_place_and_size_their_kv_cache(tmp_path):
    """A local model folder skips Ray's per-node download task (a fresh worker that then
    idles holding memory); an explicit kv_cache_memory_bytes is not overridden by the
    whole-GiB VLLM_CPU_KVCACHE_SPACE the CPU replicas otherwise get."""
    import asyncio

    from medray.engines.vllm import KV_CACHE_ENV
    from medray.serve.llm import LocalModelCallback, llm_config

    model = tmp_path / "model"
    model.mkdir()
    cfg = AppConfig(model=str(model), model_id="m", device="cpu",
                    engine_kwargs={"kv_cache_memory_bytes": 2**28})
    llm = llm_config(cfg, "m", str(model), lora=False)
    assert llm.engine_kwargs["kv_cache_memory_bytes"] == 2**28
    assert KV_CACHE_ENV not in llm.runtime_env["env_vars"]
    assert llm.callback_config.callback_class is LocalModelCallback
    default = llm_config(AppConfig(model=str(model), model_id="m", device="cpu"), "m",
                         str(model), lora=False)
    assert default.runtime_env["env_vars"][KV_CACHE_ENV] == "1"

    def runs_download_task(source: str) -> bool:
        callback = LocalModelCallback(llm_config=llm_config(cfg, "m", source, lora=False))
        asyncio.run(callback.on_before_node_init())
        return callback.ctx.run_init_node

    assert runs_download_task(str(model)) is False
    assert runs_download_task("org/some-hub-model") is True  # hub ids still download


# A recorded prompt that differs from the defaults in every field.
TRAINED_PROMPT = {"format": "eqa", "context_tokens": 160, "max_new_tokens": 7, "reserve": 12,
                  "strategy": "chunks", "chunk_tokens": 48, "chat_template": True, "shots": 1}


def test_a_config_overrides_only_the_prompt_fields_it_sets_on_the_way_to_the_replicas(
        tmp_path):
    """The README's CPU config (serve/medqaro-cpu.yaml, as written) sets only
    `prompt.context_tokens`: the demo's merged model keeps the rest of its prompt.json
    through every dump/validate on the way to the ingress (the builder resolves paths, then
    ships the config to the replica as JSON)."""
    from medray.demo import model_dirs
    from medray.eval.config import EvalConfig
    from medray.prompts.spec import PROMPT_FILE, PromptSpec

    (tmp_path / "serve").mkdir()
    yaml_file = tmp_path / "serve" / "medqaro-cpu.yaml"
    yaml_file.write_text((ROOT / "serve" / "medqaro-cpu.yaml").read_text())
    dirs = model_dirs(tmp_path / "runs" / "demo")
    _model(dirs["pretrained"])
    merged = _model(dirs["merged"])
    (merged / PROMPT_FILE).write_text(PromptSpec(**TRAINED_PROMPT).model_dump_json())
    written = load_serve_file(yaml_file).args
    assert written.prompt.model_fields_set == {"context_tokens"}
    configured = written.prompt.context_tokens
    shipped = AppConfig.model_validate(written.resolved().model_dump(mode="json"))
    assert shipped.prompt.model_fields_set == {"context_tokens"}
    for cfg in (written, written.resolved(), shipped):
        assert cfg.prompt_for("medray-ft", warn=lambda _: None).model_dump() == {
            **TRAINED_PROMPT, "context_tokens": configured}
        assert cfg.prompt_for("medray") == PromptSpec(context_tokens=configured)
    # An eval config's `prompt` survives the trip to its actors the same way.
    ev = EvalConfig(data=tmp_path, engine={"kind": "vllm", "model": str(merged)},
                    prompt={"max_new_tokens": 4})
    again = EvalConfig.model_validate(ev.model_dump(mode="json"))
    assert again.prompt.model_fields_set == {"max_new_tokens"}
    assert again.model_dump(mode="json")["prompt"] == {"max_new_tokens": 4}


def test_the_old_serve_import_path_still_loads_the_app():
    """Serve config files written for earlier releases name medray.serve_app:build_app."""
    from medray import serve_app
    from medray.serve import app

    assert serve_app.build_app is app.build_app
