"""Translation pipeline (EuropeMedQA protocol 2.7.3): question and options to English with a
configured engine, as a PREPROCESSING step; output = a new prepared dataset, language "en".

One call per item: the question and its options go as one JSON object and must come back
as JSON with the same keys (a reply that is not is an error naming the item, never silently
kept). Ids, labels, keys and images are preserved unchanged. The input is already shuffled
(seed 42, per-id permutation): translating the shuffled options keeps the identical option
order in both tracks, which is what shuffling the translated original with the same
per-id permutation would give. API engines answer through their response cache, so a
rerun costs nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from medray.data.prepared import PreparedData, load_prepared, write_prepared
from medray.data.schema import MCQ_SCHEMA
from medray.engines.accounting import estimate_tokens
from medray.prompts.text import example_dict

LANGUAGE_NAMES = {"it": "Italian", "fr": "French", "es": "Spanish", "pt": "Portuguese",
                  "ro": "Romanian", "en": "English"}
SYSTEM = ("You are a professional medical translator. Translate every value of the JSON "
          "object the user sends from {source} to {target}. Keep the keys unchanged, keep "
          "medical terminology precise, add nothing. Reply with the JSON object only.")
_FENCE = re.compile(r"^\s*```(?:json)?\s*|\s*```\s*$")


class TranslationError(ValueError):
    pass


def _payload(ex: dict) -> dict[str, str]:
    return {"question": ex["question"], **{o["label"]: o["text"] for o in ex["options"]}}


def parse_reply(text: str, expected: Sequence[str], item_id: str) -> dict[str, str]:
    try:
        obj = json.loads(_FENCE.sub("", text.strip()))
    except json.JSONDecodeError as err:
        raise TranslationError(f"item {item_id}: the translation is not JSON ({err.msg})") \
            from None
    if not isinstance(obj, dict) or set(obj) != set(expected):
        got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise TranslationError(f"item {item_id}: expected keys {sorted(expected)}, got {got}")
    return {k: str(v).strip() for k, v in obj.items()}


def _ask(engine: Any, system: str, users: list[str], budgets: list[int]) -> list[str]:
    budget = max(budgets)
    if hasattr(engine, "chat"):
        from medray.engines.api import ChatRequest

        gens = engine.chat([ChatRequest(system, u) for u in users], max_new_tokens=budget)
    else:
        gens = engine.generate([f"{system}\n\n{u}" for u in users], max_new_tokens=budget)
    return [g.text for g in gens]


def translate_dataset(data_dir: str | Path, out: str | Path, engine: Any, *,
                      target: str = "en", batch: int = 16) -> PreparedData:
    data = load_prepared(data_dir)
    if data.kind != "mcq":
        raise ValueError(f"{data_dir}: translation is for multiple-choice exam data; "
                         f"{data.dataset} is {data.kind}")
    rows = []
    examples = [example_dict(r) for _, r in data.examples.iterrows()]
    for start in range(0, len(examples), batch):
        chunk = examples[start:start + batch]
        by_lang: dict[str, list[int]] = {}
        for i, ex in enumerate(chunk):
            by_lang.setdefault(ex["language"], []).append(i)
        replies: list[str | None] = [None] * len(chunk)
        for lang, idx in by_lang.items():
            if lang == target:
                continue
            system = SYSTEM.format(source=LANGUAGE_NAMES.get(lang, lang),
                                   target=LANGUAGE_NAMES.get(target, target))
            users = [json.dumps(_payload(chunk[i]), ensure_ascii=False) for i in idx]
            # Room for the translated JSON: about the source length plus a margin.
            budgets = [2 * estimate_tokens(u) + 64 for u in users]
            for i, text in zip(idx, _ask(engine, system, users, budgets), strict=True):
                replies[i] = text
        for ex, reply in zip(chunk, replies, strict=True):
            rows.append(_translated_row(ex, reply, target, engine))
    manifest = {k: v for k, v in data.manifest.items() if k not in ("source", "created_by")}
    manifest.update(
        source=str(Path(data_dir).resolve()), language=target,
        translation={"engine": getattr(engine, "name", "?"),
                     "model": str(getattr(engine, "model", "")), "target": target,
                     "unit": "one call per item: question + options as JSON",
                     "usage": engine.usage.summary() if hasattr(engine, "usage") else None})
    write_prepared(out, manifest, pa.Table.from_pylist(rows, schema=MCQ_SCHEMA))
    return load_prepared(out)


def _translated_row(ex: dict, reply: str | None, target: str, engine: Any) -> dict:
    meta = json.loads(ex["meta"]) if isinstance(ex["meta"], str) and ex["meta"] else {}
    if reply is not None:
        tr = parse_reply(reply, list(_payload(ex)), ex["id"])
        meta.update(translated_from=ex["language"],
                    translation_model=str(getattr(engine, "model", "")))
        ex = {**ex, "question": tr["question"],
              "options": [{"label": o["label"], "text": tr[o["label"]]} for o in ex["options"]]}
    return {**ex, "language": target, "meta": json.dumps(meta, ensure_ascii=False)}


def language_table(run_dirs: Sequence[str | Path]) -> list[dict]:
    """One row per run: accuracy overall / text-only / with images, by the run's language
    (original vs English tracks side by side), from each run's metrics.json."""
    out = []
    for d in run_dirs:
        summary = json.loads((Path(d) / "metrics.json").read_text())
        m = summary["metrics"]["mcq"]
        langs = sorted((m.get("by", {}).get("language") or {}).keys()) or ["?"]
        modal = m.get("by", {}).get("modality", {})
        acc = lambda b: None if not b else b["metrics"]["accuracy"]["mean"]  # noqa: E731
        out.append({"run": str(d), "model": summary["run"]["model"], "languages": langs,
                    "n": m["n"], "n_conforming": m["n_conforming"],
                    "accuracy": acc(m), "text_only": acc(modal.get("text_only")),
                    "with_images": acc(modal.get("with_images")),
                    "n_skipped_images": m.get("n_skipped_images", 0)})
    return out
