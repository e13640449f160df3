"""What an evaluation will do, decided before any request: the items (split, seeded
sample, first N), governance (checked BEFORE any engine exists, so a refused run cannot
have sent anything), the shots (picked once), and what a text-only engine is not asked."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from medray.data.prepared import PreparedData, load_prepared
from medray.engines.serve import QA_BATCH
from medray.eval.config import EvalConfig
from medray.eval.governance import GovernanceError, check_external_use
from medray.io import cache_root
from medray.prompts.spec import PromptSpec
from medray.prompts.text import protocol_budget, shot_sets

CALL = 16  # items per engine call
PATIENT_CALL = 128  # items per E+Q+A call: whole patients, packed up to this many


@dataclass
class EvalPlan:
    cfg: EvalConfig  # with `prompt` resolved against the evaluated model's own
    data: PreparedData
    items: pd.DataFrame  # the selected items, in table order
    governance: dict
    shots: dict[str, list[dict]] = field(default_factory=dict)
    skipped_images: list[str] = field(default_factory=list)  # not asked: text-only engine
    loglik: bool = False
    executor: str = "local"
    max_new_tokens: int | None = None  # set in the config: else each dataset's budget

    @property
    def prompt(self) -> PromptSpec:
        return self.cfg.prompt or PromptSpec()

    def budget(self, ex: Any = None) -> int:
        """Generation budget (PromptSpec.new_tokens): the configured one, else a
        multiple-choice item's protocol budget, else the prompt's."""
        protocol = (None if ex is None or self.data.kind == "generative"
                    else protocol_budget(ex, self.cfg.group_as_multiple))
        return self.prompt.new_tokens(self.max_new_tokens, protocol)

    @property
    def asked(self) -> pd.DataFrame:
        return self.items[~self.items["id"].isin(self.skipped_images)]

    @property
    def patient_units(self) -> bool:
        """Generative items through Serve: one call per patient (/v1/qa/batch), so the
        pool's units are patients, not single items."""
        return self.data.kind == "generative" and self.cfg.engine.kind == "serve"

    def engine_calls(self, pending: list[dict]) -> list[list[dict]]:
        """The pending items cut into engine calls, a patient's items next to each other
        (patients in order of first appearance, items in table order within one).

        With the epicrisis first (E+Q+A) a patient's questions share it as a prompt prefix,
        which vLLM's prefix cache computes once. For vLLM each call then holds whole
        patients, packed up to PATIENT_CALL items (a patient with more is split): a bigger
        batch keeps vLLM's scheduler full, where one small patient per call left it
        waiting between calls. Through Serve each call is one patient (up to QA_BATCH
        items): one /v1/qa/batch request, several of them in flight so the replica batches
        across patients. Otherwise CALL items per call (a crash loses at most one call's
        answers)."""
        if not pending:
            return []
        if self.data.kind == "generative" and "context_id" in pending[0]:
            first: dict[Any, int] = {}
            for i, row in enumerate(pending):
                first.setdefault(row["context_id"], i)
            pending = sorted(pending, key=lambda row: first[row["context_id"]])  # stable
            if self.patient_units:
                return patient_calls(pending, QA_BATCH, pack=False)
            if self.prompt.format == "eqa" and self.cfg.engine.kind == "vllm":
                return patient_calls(pending, PATIENT_CALL)
        return [pending[i:i + CALL] for i in range(0, len(pending), CALL)]


def patient_calls(rows: list[dict], per_call: int, pack: bool = True) -> list[list[dict]]:
    """`rows` (a patient's rows next to each other) cut into calls of at most `per_call`
    rows: whole patients packed in order (`pack`; else one patient per call); a patient
    with more rows than fit in the call being filled starts a new one, split only when
    alone it has more than `per_call`."""
    calls: list[list[dict]] = []
    for _, group in itertools.groupby(rows, key=lambda row: row["context_id"]):
        group = list(group)
        if pack and calls and len(calls[-1]) + len(group) <= per_call:
            calls[-1] += group
            continue
        calls += [group[i:i + per_call] for i in range(0, len(group), per_call)]
    return calls


def default_cache_path() -> Path:
    return cache_root() / "api_responses.sqlite"


def sample_rows(df: pd.DataFrame, n: int | None, seed: int) -> pd.DataFrame:
    """The papers' seeded random subset: n items drawn without replacement, kept in order."""
    if n is None or n >= len(df):
        return df.reset_index(drop=True)
    idx = np.sort(np.random.default_rng(seed).choice(len(df), size=n, replace=False))
    return df.iloc[idx].reset_index(drop=True)


def plan_eval(cfg: EvalConfig, *, engine: Any = None, dry_run: bool = False) -> EvalPlan:
    """Everything decided before a request is made. Raises GovernanceError (unless a dry
    run, which records that the flag would be needed) and ValueError on bad settings."""
    data = load_prepared(cfg.data)
    spec = cfg.engine
    try:
        governance = check_external_use(data.dataset, spec, cfg.allow_external_api,
                                        spec.base_url)
    except GovernanceError as err:
        if not dry_run:
            raise
        governance = {"flag_required": True, "would_refuse": str(err)}
    if spec.kind == "baseline" and spec.baseline == "majority" \
            and "train" not in data.manifest["splits"]:
        raise ValueError(f"engine baseline:majority takes its answer from the train split; "
                         f"{cfg.data} ({data.dataset}) has only "
                         f"{', '.join(sorted(data.manifest['splits']))}: use baseline:random")
    items = sample_rows(data.split(cfg.split), cfg.sample, cfg.seed)
    if cfg.limit:
        items = items.iloc[: cfg.limit].reset_index(drop=True)
    if items.empty:
        raise ValueError(f"{cfg.data}: split {cfg.split!r} has no items")
    given = cfg.prompt
    plan = EvalPlan(cfg.model_copy(update={"prompt": _prompt(cfg, dry_run)}), data, items,
                    governance, executor="local" if engine is not None else spec.entry.executor,
                    max_new_tokens=given.max_new_tokens if given is not None
                    and "max_new_tokens" in given.model_fields_set else None)
    shots = plan.prompt.shots
    if data.kind == "mcq" and spec.kind == "serve" and cfg.group_as_multiple:
        raise ValueError("group_as_multiple: Serve's /v1/mcq asks items as their own kind")
    if data.kind == "mcq" and spec.kind != "baseline":
        plan.shots = shot_sets(data.examples, list(items["kind"]), shots, cfg.seed)
        images_ok = (getattr(engine, "supports_images", False) if engine is not None
                     else spec.entry.images or _vision_model(cfg, dry_run))
        if not images_ok:
            plan.skipped_images = [str(i) for i, im in zip(items["id"], items["images"],
                                                           strict=True) if len(im)]
        default = (hasattr(engine, "score_options") and not hasattr(engine, "chat")
                   if engine is not None else spec.entry.loglik)
        plan.loglik = cfg.loglik if cfg.loglik is not None else default
    elif given is not None and given.shots:  # a model's recorded shots ask nothing here
        raise ValueError(f"prompt.shots: {data.dataset} is {data.kind}; in-context examples "
                         "are for multiple-choice data")
    return plan


def _prompt(cfg: EvalConfig, dry_run: bool) -> PromptSpec | None:
    """The evaluated model's recorded prompt with the config's fields over it (the model's
    own unless the config says otherwise); a dry run asks no endpoint."""
    if cfg.engine.kind == "baseline":
        return cfg.prompt
    if dry_run:
        return cfg.prompt or PromptSpec()
    from medray.eval.prompting import with_resolved_prompt

    return with_resolved_prompt(cfg).prompt


def plain_row(row: dict[str, Any]) -> dict[str, Any]:
    """Arrow/numpy values -> JSON-able Python (options arrive as numpy arrays)."""
    def conv(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return [conv(x) for x in v.tolist()]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, list):
            return [conv(x) for x in v]
        return v.item() if isinstance(v, np.generic) else v

    return {k: conv(v) for k, v in row.items()}


def _vision_model(cfg: EvalConfig, dry_run: bool) -> bool:
    """A vllm/hf engine on a vision-language model, or an endpoint serving one (its
    /v1/models card; a dry run asks no endpoint): it is asked the image items too."""
    spec = cfg.engine
    if spec.kind == "serve":
        from medray.eval.prompting import serve_api_key, served_model

        card = None if dry_run else served_model(spec, serve_api_key(cfg))
        return bool(card and card.get("images"))
    from medray.models.vision import is_vision_model

    return spec.kind in ("vllm", "hf") and is_vision_model(spec.model)
