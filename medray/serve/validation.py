"""Start-up checks of every configured model and adapter, before any replica starts: a
bad path or an adapter vLLM cannot load fails here with a message that says how to fix it,
not minutes later as a replica that keeps dying."""

from __future__ import annotations

import json
from pathlib import Path

from medray.serve.config import AppConfig, _looks_local

MERGE_HINT = ("merge it into its base with `medray export RUN_DIR --merge` and serve the "
              "merged folder as a model (`models: {NAME: RUN_DIR/merged}`)")


class ServeConfigError(ValueError):
    """A Serve config that cannot be served (the message names the field and the path)."""


def _where(cfg: AppConfig, raw: str) -> str:
    if Path(raw).expanduser().is_absolute():
        return ""
    return f" (relative paths are resolved against {cfg.base_dir or Path.cwd()}" + (
        ", the config file's folder)" if cfg.base_dir else ", the current directory)")


def check_servable(cfg: AppConfig, raw: AppConfig | None = None) -> None:
    """`cfg` has resolved paths; `raw` (the config as written) gives the names in messages."""
    raw = raw or cfg
    problems: list[str] = []
    models = {"model": (raw.model, cfg.model)}
    models |= {f"models.{k}": (raw.models.get(k, v), v) for k, v in cfg.models.items()}
    for field, (written, path) in models.items():
        if Path(path).is_dir():
            if not (Path(path) / "config.json").is_file():
                problems.append(f"{field}: {path} has no config.json (not a model folder)")
            elif (Path(path) / "adapter_config.json").is_file():
                problems.append(f"{field}: {path} is a PEFT adapter, not a model; list it "
                                f"under `adapters` with its base as `model`")
        elif Path(path).is_absolute() or _looks_local(written):
            problems.append(f"{field}: no such model folder {path}{_where(raw, written)}")
    for name, path in cfg.adapters.items():
        written = raw.adapters.get(name, path)
        problems += [f"adapters.{name}: {p}" for p in _adapter_problems(
            Path(path), cfg, _where(raw, written))]
    if raw.api_keys_file and cfg.api_keys_file and not Path(cfg.api_keys_file).is_file():
        problems.append(f"api_keys_file: no such file {cfg.api_keys_file}"
                        f"{_where(raw, raw.api_keys_file)}")
    if not problems:
        problems += _prompt_problems(cfg)
    if problems:
        raise ServeConfigError("cannot serve this config:\n  " + "\n  ".join(problems))


def _prompt_problems(cfg: AppConfig) -> list[str]:
    """Each served name's prompt (its prompt.json + the config's `prompt`) must be
    readable and fit the context limit; a differing override is warned about here, on the
    machine that starts the app."""
    out = []
    for name in cfg.served_folders():
        try:
            spec = cfg.prompt_for(name)
        except ValueError as err:
            out.append(f"{name}: {err}")
            continue
        problem = cfg.context_problem(spec)
        if problem:
            out.append(f"{name}: {problem}")
    return out


def _adapter_problems(path: Path, cfg: AppConfig, where: str) -> list[str]:
    config_file = path / "adapter_config.json"
    if not path.is_dir():
        return [f"no such adapter folder {path}{where}"]
    if not config_file.is_file():
        return [f"{path} has no adapter_config.json (not a PEFT adapter)"]
    try:
        ac = json.loads(config_file.read_text())
    except ValueError as err:
        return [f"{config_file}: not valid JSON ({err})"]
    out = []
    if ac.get("peft_type", "LORA") != "LORA":
        out.append(f"{path}: peft_type {ac.get('peft_type')!r}; vLLM serves LoRA only")
    if ac.get("modules_to_save"):
        out.append(f"{path} also trains full modules (modules_to_save="
                   f"{ac['modules_to_save']}), which vLLM cannot load as LoRA; {MERGE_HINT}")
    if ac.get("use_dora"):
        out.append(f"{path} is a DoRA adapter, which vLLM cannot load; {MERGE_HINT}")
    if ac.get("bias", "none") != "none" or ac.get("lora_bias"):
        out.append(f"{path} trains biases, which vLLM cannot load; {MERGE_HINT}")
    rank = max([int(ac.get("r", 8)), *map(int, (ac.get("rank_pattern") or {}).values())])
    if rank > cfg.max_lora_rank:
        out.append(f"{path} has LoRA rank {rank} > max_lora_rank {cfg.max_lora_rank}; raise "
                   f"max_lora_rank to {rank} in the Serve config")
    out += _target_problems(path, cfg)
    return out


def _target_problems(path: Path, cfg: AppConfig) -> list[str]:
    """vLLM applies LoRA to linear layers of the decoder only (not the LM head or the
    embeddings); the safetensors keys are what it loads, so they are what is checked."""
    weights = path / "adapter_model.safetensors"
    if not weights.is_file():
        if (path / "adapter_model.bin").is_file():
            return []  # legacy format: vLLM checks it itself
        return [f"{path} has no adapter_model.safetensors"]
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as f:
        keys = list(f.keys())
    targets = {k.split(".lora_")[0].rsplit(".", 1)[-1] for k in keys if ".lora_" in k}
    linear = _linear_names(cfg.model)
    if linear is None:
        return []
    bad = sorted(targets - linear)
    if bad:
        return [f"{path} targets {bad}, which vLLM does not serve as LoRA (supported here: "
                f"{sorted(linear)}); {MERGE_HINT}"]
    return []


def _linear_names(model: str) -> set[str] | None:
    """Suffixes of the decoder's nn.Linear layers (meta device: no weights are read)."""
    if not (Path(model) / "config.json").is_file():
        return None
    import torch

    from medray.models import meta_model

    net = meta_model(model)
    head = net.get_output_embeddings()
    return {name.rsplit(".", 1)[-1] for name, mod in net.named_modules()
            if isinstance(mod, torch.nn.Linear) and mod is not head}
