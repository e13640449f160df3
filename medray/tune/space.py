"""Search spaces as YAML: parse, validate against the training config, convert for Ray Tune.

A space file names hyperparameters by their dotted path in the training config
(`optim.lr`, `lora.r`, `prompt.context_tokens`, ...) and says how to sample each one:

    search: optuna            # grid | random | optuna (Bayesian, TPE through Ray Tune)
    num_samples: 32           # random/optuna: trials; grid: repeats of the whole grid
    metric: val_f1            # what ASHA and the searcher optimise (reported each epoch)
    mode: max
    scheduler: {type: asha, grace_period: 1, reduction_factor: 2}
    max_concurrent_trials: 2
    fixed: {scaling.num_workers: 1}   # same value in every trial
    params:
      optim.lr: {type: loguniform, low: 1.0e-6, high: 1.0e-3, grid: [1.0e-6, 1.0e-5]}
      lora.dropout: {type: uniform, low: 0.0, high: 0.2, q: 0.05}
      lora.r: [4, 6, 8, 10]            # a bare list is a categorical choice

Everything is checked before Ray starts: unknown keys (in the space file or in the training
config), values the training config model rejects, continuous parameters without grid
values under `search: grid`.
"""

from __future__ import annotations

import copy
import math
import os
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, model_validator

from medray.config import ConfigError, Strict, apply_overrides, load_yaml, validate


class Param(Strict):
    """One hyperparameter. Ranges are inclusive; `q` is the step of a quantised range."""

    type: Literal["choice", "uniform", "loguniform", "int"]
    values: list[Any] | None = None  # choice
    low: float | None = None
    high: float | None = None
    q: float | None = Field(None, gt=0)
    grid: list[Any] | None = None  # grid-search values of a range (default: the q steps)

    @model_validator(mode="after")
    def _shape(self) -> Param:
        if self.type == "choice":
            if not self.values:
                raise ValueError("type choice needs a non-empty `values` list")
            if self.low is not None or self.high is not None or self.q is not None:
                raise ValueError("type choice takes `values`, not low/high/q")
            return self
        if self.values is not None:
            raise ValueError(f"type {self.type} takes low/high, not `values`")
        if self.low is None or self.high is None:
            raise ValueError(f"type {self.type} needs `low` and `high`")
        if self.low > self.high:
            raise ValueError(f"low {self.low} > high {self.high}")
        if self.type == "loguniform" and self.low <= 0:
            raise ValueError("type loguniform needs low > 0")
        if self.type == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ValueError("type int needs integer low/high")
        if self.grid is not None and not self.grid:
            raise ValueError("`grid` must not be empty")
        return self

    @property
    def log_scale(self) -> bool:
        return self.type == "loguniform"

    def grid_values(self) -> list[Any] | None:
        """The discrete values grid search walks, or None for an unquantised range."""
        if self.type == "choice":
            return list(self.values or [])
        if self.grid is not None:
            return list(self.grid)
        lo, hi = float(self.low), float(self.high)  # type: ignore[arg-type]
        if self.type == "int":
            step = int(self.q or 1)
            return list(range(int(lo), int(hi) + 1, step))
        if self.q is None:
            return None
        n = int(math.floor((hi - lo) / self.q + 1e-9))
        # round() strips float noise (0.15000000000000002) so configs and CSVs stay clean
        return [round(lo + i * self.q, 12) for i in range(n + 1)]

    def candidates(self) -> list[Any]:
        """Values checked against the training config before the sweep starts."""
        if self.type == "choice":
            return list(self.values or [])
        vals: list[Any] = [self.low, self.high, *(self.grid or [])]
        if self.type == "int":
            vals = [int(v) for v in vals]
        return vals

    def to_tune(self, search: str) -> Any:
        from ray import tune

        if search == "grid":
            return tune.grid_search(self.grid_values())
        if self.type == "choice":
            return tune.choice(list(self.values or []))
        lo, hi = float(self.low), float(self.high)  # type: ignore[arg-type]
        if self.type == "int":
            return tune.qrandint(int(lo), int(hi), int(self.q or 1))  # inclusive upper bound
        if self.type == "loguniform":
            return tune.qloguniform(lo, hi, self.q) if self.q else tune.loguniform(lo, hi)
        return tune.quniform(lo, hi, self.q) if self.q else tune.uniform(lo, hi)


class Scheduler(Strict):
    type: Literal["asha", "none"] = "asha"
    time_attr: str = "epoch"  # reported by the training loop at each epoch end
    grace_period: int = Field(1, ge=1)
    reduction_factor: float = Field(2, gt=1)


class Space(Strict):
    description: str = ""
    search: Literal["grid", "random", "optuna"] = "random"
    num_samples: int = Field(1, ge=1)
    seed: int = 0
    metric: str = "val_f1"
    mode: Literal["min", "max"] = "max"
    scheduler: Scheduler = Scheduler()
    max_concurrent_trials: int | None = Field(None, ge=1)
    # CPUs for each trial's driver function (it only waits on the Train controller);
    # the Train workers' resources come from the training config's `scaling` section.
    driver_cpus: float = Field(1.0, ge=0)
    fixed: dict[str, Any] = {}
    params: dict[str, Param]

    @model_validator(mode="before")
    @classmethod
    def _bare_lists(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("params"), dict):
            data = dict(data)
            data["params"] = {k: ({"type": "choice", "values": v} if isinstance(v, list) else v)
                              for k, v in data["params"].items()}
        return data

    @model_validator(mode="after")
    def _nonempty(self) -> Space:
        if not self.params:
            raise ValueError("`params` must name at least one hyperparameter")
        return self

    def grid_size(self) -> int:
        return math.prod(len(p.grid_values() or []) for p in self.params.values())

    def tune_param_space(self, search: str | None = None) -> dict[str, Any]:
        search = search or self.search
        return {key: p.to_tune(search) for key, p in self.params.items()}


# ----------------------------------------------------------------------------- loading


def load_space(path: str | os.PathLike) -> Space:
    return load_yaml(Space, path, what="search space")


def parse_space(raw: dict, source: str = "<space>") -> Space:
    return validate(Space, raw, source)


# ------------------------------------------------------------- checks vs the training config


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model behind a field annotation (`X`, `X | None`), if any."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def check_key(model: type[BaseModel], dotted: str) -> None:
    """Raise KeyError with a readable message when `dotted` is not a config field."""
    node: type[BaseModel] | None = model
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or "the top level"
        if node is None:
            raise KeyError(f"'{'.'.join(parts[:i])}' is a value, not a section")
        fields = node.model_fields
        if part not in fields:
            raise KeyError(f"unknown key '{part}' in {where} (known: {', '.join(fields)})")
        node = _section_model(fields[part].annotation)
    if node is not None:
        raise KeyError(f"'{dotted}' is a whole section; name one of its keys")


def clean_value(value: Any) -> Any:
    """Strip float noise of quantised samples (0.15000000000000002 -> 0.15)."""
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.12g}")
    return value


def as_overrides(params: dict[str, Any]) -> list[str]:
    """Dotted `key=value` items that medray.train.config parses back to exactly these values
    (YAML-dumped: 1e-06 -> `1.0e-06`, which YAML 1.1 reads as a float, not a string)."""
    def dump(value: Any) -> str:
        text = yaml.safe_dump(clean_value(value), default_flow_style=True, width=math.inf)
        return text.removesuffix("...\n").strip()

    return [f"{key}={dump(value)}" for key, value in params.items()]


def apply_params(raw: dict, params: dict[str, Any]) -> dict:
    """A copy of the raw training config with each dotted key set (the config's own
    `key=value` override code, so a sweep and `medray train k=v` set values the same way)."""
    return apply_overrides(copy.deepcopy(raw), as_overrides(params))


def check_keys(space: Space, source: str = "<space>") -> None:
    """Every `fixed` and `params` key is a field of the training config (TrainConfig)."""
    from medray.prompts.spec import moved_prompt_keys
    from medray.train.config import TrainConfig

    keys = {**{k: "fixed" for k in space.fixed}, **{k: "params" for k in space.params}}
    for key, section in keys.items():
        try:
            check_key(TrainConfig, key)
        except KeyError as exc:
            head, _, tail = key.partition(".")
            moved = moved_prompt_keys({tail: None}, ("prompt_format", "context_tokens",
                                                     "max_new_tokens", "mode"), "data.")
            why = moved[0] if head == "data" and moved else exc.args[0]
            raise ConfigError(f"{source}: {section}: '{key}': {why}") from None
    dup = set(space.fixed) & set(space.params)
    if dup:
        raise ConfigError(f"{source}: {sorted(dup)} both fixed and searched; keep one")


def validate_space(space: Space, base_raw: dict, *, source: str = "<space>",
                   search: str | None = None) -> None:
    """Every param and fixed key exists in TrainConfig and every candidate value validates."""
    from medray.train.config import validate_config

    search = search or space.search
    check_keys(space, source)
    fixed_raw = apply_params(base_raw, space.fixed)
    validate_config(fixed_raw, f"{source} (fixed)")
    for key, param in space.params.items():
        for value in param.candidates():
            try:
                validate_config(apply_params(fixed_raw, {key: value}), source)
            except ConfigError as exc:
                raise ConfigError(f"{source}: params: '{key}' value {value!r} is rejected by "
                                 f"the training config:\n{exc}") from None
        if search == "grid" and param.grid_values() is None:
            raise ConfigError(f"{source}: params: '{key}' is a continuous {param.type} range; "
                             "grid search needs `grid: [...]` values or a step `q`")
