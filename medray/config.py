"""Every medray YAML config, loaded one way: a strict pydantic model, dotted overrides,
one error type that names the file and the key.

    cfg = load_yaml(TrainConfig, "configs/tiny-cpu.yaml", ["optim.lr=1e-3"])

Unknown keys are rejected everywhere (`Strict`: `extra="forbid"`), so a typo fails before
anything starts, with the dotted key in the message. `ConfigError` is a ValueError: the
command line reports it as `error: FILE: KEY ...` with exit status 2.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A bad config: the message names the file and the dotted key."""


class Strict(BaseModel):
    """Base of every config section: unknown keys are errors, `model_*` names are fields."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())


M = TypeVar("M", bound=BaseModel)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b.c=VALUE` -> (["a", "b", "c"], VALUE parsed as YAML)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not key=value")
    key, raw = item.split("=", 1)
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override {item!r}: bad key {key!r}")
    return key.split("."), yaml.safe_load(raw) if raw != "" else ""


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Set each dotted `key=value` in `raw` (in place; missing sections are created)."""
    for item in overrides:
        path, value = parse_override(item)
        node = raw
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[path[-1]] = value
    return raw


def format_errors(exc: ValidationError, source: str, prefix: str = "") -> str:
    """One line per pydantic error: `SOURCE: unknown key 'a.b'`, `SOURCE: 'a.b': why`.
    `prefix`: where the validated mapping sits in the file (`applications.0.args`)."""
    lines = []
    for err in exc.errors():
        key = ".".join([*filter(None, [prefix]), *(str(p) for p in err["loc"])]) or "<root>"
        if err["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key '{key}'")
        elif err["type"] == "missing":
            lines.append(f"{source}: missing key '{key}'")
        else:
            lines.append(f"{source}: '{key}': {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


def read_yaml(path: str | os.PathLike, what: str = "config file") -> dict:
    """The top-level mapping of a YAML file; a missing file, bad YAML or a non-mapping is
    a ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {path} not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return raw


def validate(model: type[M], raw: Any, source: str, prefix: str = "") -> M:
    """`model.model_validate(raw)`, its errors as one ConfigError naming `source` and the
    dotted key (under `prefix`)."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, source, prefix)) from None


def load_yaml(model: type[M], path: str | os.PathLike, overrides: list[str] | None = None,
              *, what: str = "config file", check: Callable[[dict, str], None] | None = None,
              section: Callable[[dict], tuple[Any, str]] | None = None) -> M:
    """Read `path`, apply dotted overrides, validate as `model`: how every config file is
    loaded. `check(raw, source)` runs first, for rules a model cannot state (keys that
    moved, paths left unset on purpose); `section(raw)` picks the mapping the model
    describes and its dotted place in the file (a Serve config's `applications.0.args`)."""
    raw = apply_overrides(read_yaml(path, what), list(overrides or []))
    if check is not None:
        check(raw, str(path))
    data, prefix = section(raw) if section is not None else (raw, "")
    return validate(model, data, str(path), prefix)
