"""The one multiple-choice path (RoBiology, EuropeMedQA): render an item's prompt, then read
the answer out of a model's reply. The eval runner, Serve's /v1/mcq route, ensembles and
`medray data prompt` all use these functions, so an item is asked and read the same way
whoever asks it.

- Prompts: the dataset's prompt (`DatasetSpec.prompt`, texts in medray/prompts/text.py) per
  kind, with k shots from the train split picked by `pick_shots` (seeded; the same shots
  for every item of a kind). Group items can be asked as multiple choice over their
  statements and mapped back to a letter (`group_as_multiple`).
- Text-completion engines read `prompt_text`: the chat template when the model's PromptSpec
  says so (`chat_template`), else the flattened system + user text; chat APIs get the
  system/user pair.
- Reading: EuropeMedQA replies start with the question id ("IT0001: A"); another item's id
  makes the reply non-conforming. Letters come from the metrics module's extractors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from medray.data.registry import dataset_spec
from medray.eval.metrics.mcq import extract_answer, extract_statements, statements_to_group
from medray.prompts.spec import REFERENCE_MAX_NEW_TOKENS, ChatPrompt, PromptSpec

_ID_PREFIX = re.compile(r"^\s*(?:question\s*id\s*[:=]?\s*)?\**([A-Z]{2}\d{1,6})\**\s*[:\-–]\s*",
                        re.IGNORECASE)


def meta_dict(meta: Any) -> dict:
    if isinstance(meta, str):
        return json.loads(meta) if meta else {}
    return dict(meta or {})


def example_dict(row: pd.Series | Mapping[str, Any]) -> dict:
    """A prepared row with plain-Python options/answer/images (parquet gives numpy arrays)."""
    ex = dict(row)
    ex["options"] = [{"label": str(o["label"]), "text": str(o["text"])} for o in ex["options"]]
    ex["answer"] = [str(a) for a in ex.get("answer", [])]
    images = ex.get("images")
    ex["images"] = [str(p) for p in (images if images is not None else [])]
    return ex


def pick_shots(examples: pd.DataFrame, kind: str, k: int, seed: int) -> list[dict]:
    """k train items of `kind`, drawn without replacement with `seed`, in table order."""
    if k == 0:
        return []
    pool = examples[(examples["split"] == "train") & (examples["kind"] == kind)]
    if len(pool) < k:
        raise ValueError(f"{k}-shot prompts need {k} train items of kind {kind!r}; "
                         f"the prepared data has {len(pool)}")
    idx = np.sort(np.random.default_rng(seed).choice(len(pool), size=k, replace=False))
    return [example_dict(pool.iloc[i]) for i in idx]


def shot_sets(examples: pd.DataFrame, kinds: Sequence[str], k: int, seed: int
              ) -> dict[str, list[dict]]:
    return {kind: pick_shots(examples, kind, k, seed) for kind in sorted(set(kinds))}


def asked_kind(ex: Mapping[str, Any], group_as_multiple: bool) -> str:
    return "multiple" if ex["kind"] == "group" and group_as_multiple else str(ex["kind"])


def _as_statement_shot(shot: dict) -> dict:
    from medray.data.schema import GROUP_CODES

    return {**shot, "kind": "multiple",
            "answer": [str(n) for n in sorted(GROUP_CODES[shot["answer"][0]])]}


def mcq_prompt(ex: Mapping[str, Any], shots: Sequence[Mapping[str, Any]] = ()) -> ChatPrompt:
    """The prompt of a multiple-choice item: its dataset's (`DatasetSpec.prompt`)."""
    return dataset_spec(str(ex["dataset"])).prompt_fn()(ex, shots)


def render(ex: Mapping[str, Any], shots: Mapping[str, Sequence[dict]] | None = None,
           group_as_multiple: bool = False) -> ChatPrompt:
    """The item's system/user prompt (shots: per kind, from `shot_sets`)."""
    shots = shots or {}
    if ex["kind"] == "group" and group_as_multiple:
        asked = {**ex, "kind": "multiple"}
        return mcq_prompt(asked, [_as_statement_shot(s) for s in shots.get("group", [])])
    return mcq_prompt(ex, list(shots.get(str(ex["kind"]), [])))


def prompt_text(prompt: ChatPrompt, tokenizer: Any = None, spec: PromptSpec | None = None
                ) -> str:
    """What a text-completion engine reads: the model's PromptSpec decides whether its chat
    template is applied (PromptSpec.chat_text, the one place that applies one)."""
    return (spec or PromptSpec()).chat_text(tokenizer, prompt)


def max_new_tokens(ex: Mapping[str, Any], group_as_multiple: bool = False) -> int:
    """The protocol's minimal output budget for the item's dataset and asked kind."""
    kind = "group_as_multiple" if ex["kind"] == "group" and group_as_multiple else ex["kind"]
    return dataset_spec(str(ex["dataset"])).budget(str(kind)) or REFERENCE_MAX_NEW_TOKENS


def question_id(ex: Mapping[str, Any]) -> str:
    return str(meta_dict(ex.get("meta")).get("original_id") or ex["id"])


def answer_text(raw: str, ex: Mapping[str, Any]) -> tuple[str, bool]:
    """Strip the protocol's "<QuestionID>: " prefix; a different id is non-conforming."""
    text = raw or ""
    if dataset_spec(str(ex["dataset"])).id_prefix:
        m = _ID_PREFIX.match(text)
        if m:
            if m.group(1).upper() != question_id(ex).upper():
                return text, False
            text = text[m.end():]
    return text.strip(), True


def extract(text: str, ex: Mapping[str, Any], group_as_multiple: bool = False
            ) -> tuple[tuple[str, ...], bool]:
    """Letters chosen (group items: the group letter) via the metrics module's extractors."""
    kind = ex["kind"]
    if kind == "group" and group_as_multiple:
        stmts, ok = extract_statements(text, len(ex["options"]) or 4)
        letter = statements_to_group(stmts, "heuristic") if ok else None
        return ((letter,), True) if letter else ((), False)
    valid = list("ABCDE") if kind == "group" else [o["label"] for o in ex["options"]]
    ext = extract_answer(text, valid, multi=kind == "multiple")
    return ext.labels, ext.conforming


def read_answer(raw: str, ex: Mapping[str, Any], group_as_multiple: bool = False
                ) -> tuple[str, tuple[str, ...], bool]:
    """(answer text, letters, conforming) of one reply."""
    text, id_ok = answer_text(raw, ex)
    labels, conforming = extract(text, ex, group_as_multiple)
    return text, labels, conforming and id_ok


def loglik_choice(engine: Any, ex: Mapping[str, Any]) -> dict:
    """Option log-likelihood, lm-evaluation-harness ARC style: "Question: ...\\nAnswer:" +
    " option text"; acc = best summed log-prob, acc_norm = best log-prob per character."""
    prompt = f"Question: {ex['question']}\nAnswer:"
    scores = engine.score_options(prompt, [" " + o["text"] for o in ex["options"]])
    labels = [o["label"] for o in ex["options"]]
    acc = labels[int(np.argmax([s.logprob for s in scores]))]
    norm = labels[int(np.argmax([s.normalized for s in scores]))]
    return {"loglik_prediction": acc, "loglik_norm_prediction": norm,
            "option_logprobs": [round(float(s.logprob), 4) for s in scores]}
