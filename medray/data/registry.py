"""Every benchmark medray knows, as plain data: one `DatasetSpec` per dataset.

Preparation, the data commands, prompt dispatch, the eval runner and governance all read
this table instead of testing dataset names, so a new benchmark is one entry here plus its
loader module (medray/data/NAME.py) and, for multiple choice, its prompt in medray/prompts/text.py.
Loaders and generators are named as "module:function" and imported only when used, so
reading the table costs nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    kind: Literal["generative", "mcq"]
    # Clinical text (real patients' records): never sent to an external provider without
    # the explicit opt-in flag (medray.eval.governance).
    clinical: bool
    loader: str  # "module:function" (input_path, **options) -> (examples, contexts, manifest)
    synthetic: str  # "module:function" (out_dir, seed=, scale=) -> raw files like the release
    prompt: str  # "module:function" rendering one item (mcq) or (question, context) (generative)
    # Minimal generation budget per question kind ("" = every kind; none: the PromptSpec's):
    # the protocols leave no room for explanations.
    max_new_tokens: Mapping[str, int] = field(default_factory=dict)
    shots: tuple[int, ...] = (0,)  # in-context example counts the protocol allows
    # Replies start with the item's question id ("IT0001: A"); another id is non-conforming.
    id_prefix: bool = False
    # `medray data synth`'s default scale: the smallest corpus its tiny recipe learns from.
    synthetic_scale: Literal["small", "paper"] = "small"

    def budget(self, kind: str = "") -> int | None:
        """None: no protocol budget (the PromptSpec's max_new_tokens applies)."""
        return self.max_new_tokens.get(kind, self.max_new_tokens.get(""))

    def load(self, input_path: Any, **options: Any) -> tuple[Any, Any, dict]:
        return _resolve(self.loader)(input_path, **options)

    def write_synthetic(self, out_dir: Any, **options: Any) -> Any:
        return _resolve(self.synthetic)(out_dir, **options)

    def prompt_fn(self) -> Callable[..., Any]:
        return _resolve(self.prompt)


def _resolve(ref: str) -> Callable[..., Any]:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in (
    DatasetSpec(
        name="medqaro", kind="generative", clinical=True,
        loader="medray.data.loaders:load_medqaro",
        synthetic="medray.data.synth.medqaro:write_medqaro",
        prompt="medray.prompts.text:medqaro_prompt"),  # budget: the PromptSpec's
    DatasetSpec(
        name="robiology", kind="mcq", clinical=False,
        loader="medray.data.loaders:load_robiology",
        synthetic="medray.data.synth.mcq:write_robiology",
        prompt="medray.prompts.text:robiology_item_prompt",
        max_new_tokens={"single": 5, "group": 5, "multiple": 10, "group_as_multiple": 10},
        # 90 small items teach the tiny model only the answer format; 11,347 teach content.
        shots=(0, 1, 3, 5), synthetic_scale="paper"),
    DatasetSpec(
        name="europemedqa", kind="mcq", clinical=False,
        loader="medray.data.loaders:load_europemedqa",
        synthetic="medray.data.synth.mcq:write_europemedqa",
        prompt="medray.prompts.text:europemedqa_item_prompt",
        # Answers carry the question id ("IT0001: A"); multi-answer ones list letters.
        max_new_tokens={"single": 12, "multiple": 20}, id_prefix=True),
)}
NAMES: tuple[str, ...] = tuple(DATASETS)


def dataset_spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(NAMES)}") from None
