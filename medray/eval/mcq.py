"""Reading a multiple-choice reply (RoBiology, EuropeMedQA): the eval runner, Serve's
/v1/mcq route and ensembles all read answers here, so an item is read the same way whoever
asked it (the prompts are medray.prompts.text's).

EuropeMedQA replies start with the question id ("IT0001: A"); another item's id makes the
reply non-conforming. Letters come from the metrics module's extractors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from medray.data.registry import dataset_spec
from medray.eval.metrics.mcq import extract_answer, extract_statements, statements_to_group
from medray.prompts.text import loglik_prompt, question_id

_ID_PREFIX = re.compile(r"^\s*(?:question\s*id\s*[:=]?\s*)?\**([A-Z]{2}\d{1,6})\**\s*[:\-–]\s*",
                        re.IGNORECASE)


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
    scores = engine.score_options(*loglik_prompt(ex))
    labels = [o["label"] for o in ex["options"]]
    acc = labels[int(np.argmax([s.logprob for s in scores]))]
    norm = labels[int(np.argmax([s.normalized for s in scores]))]
    return {"loglik_prediction": acc, "loglik_norm_prediction": norm,
            "option_logprobs": [round(float(s.logprob), 4) for s in scores]}
