"""The demo's report: DIR/report.md and DIR/report.html (the same text, plots inline),
DIR/metrics.json, the plots as PNG files, and the general `medray report` tables in
DIR/report/.

Shown: the three systems in and across domain with CIs, F1 by question type per system,
the training curve, a dozen example questions with every system's answer, and where the
time and memory went.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from medray.demo import figures, findings
from medray.demo.config import BASE_NAMES, DemoConfig
from medray.demo.html import to_html
from medray.demo.machine import describe_machine, machine_line
from medray.demo.memory import largest_at_peak
from medray.eval.report import load_run, to_markdown, write_report
from medray.io import atomic_file, write_json_atomic, write_text_atomic

METRICS = ("f1", "em", "bleu", "meteor")


def labels(base: str = "tiny") -> dict[str, str]:
    model = BASE_NAMES[base]
    zero = "pre-trained base" if base == "tiny" else "the instruct model as released"
    return {"majority": "majority baseline (train-split majority answer)",
            "zero_shot": f"{model}, zero-shot ({zero}, no adapter)",
            "fine_tuned": f"{model} + LoRA, fine-tuned"}


LABELS = labels()
DOMAINS = {"test": "in-domain (held-out patients)", "test_cross": "cross-domain",
           "val": "validation"}
HOW = ("F1 and EM in 'medqaro' metric mode (reference formulas: lowercase, ASCII punctuation "
       "removed, set-based token F1, per example then averaged); BLEU (NLTK, smoothing "
       "method4) and METEOR as in the reference; 95% CI: percentile bootstrap resampling "
       "patients ({resamples} resamples, seed 0); greedy decoding, {max_new} new tokens; "
       "prompt format {fmt} ({order}; prompt within {ctx} tokens, the epicrisis trimmed).")
ORDER = {"qea": "question, epicrisis, answer", "eqa": "epicrisis, question, answer"}
PLOTS = {"systems": "f1_by_system.png", "types": "f1_by_question_type.png",
         "training": "training_curve.png"}


def _metric(summary: dict, name: str, mode: str = "medqaro") -> dict[str, Any]:
    m = summary["metrics"][mode]["metrics"].get(name) or {}
    return {"mean": m.get("mean"), "ci95": m.get("ci95")}


def _fmt(m: dict[str, Any]) -> str:
    if m.get("mean") is None:
        return "–"
    lo, hi = m.get("ci95") or (None, None)
    return f"{m['mean']:.3f} [{lo:.3f}, {hi:.3f}]" if lo is not None else f"{m['mean']:.3f}"


def collect_rows(runs: dict[str, dict[str, Path]], base: str = "tiny") -> list[dict[str, Any]]:
    names, rows = labels(base), []
    for system, by_split in runs.items():
        for split, run_dir in by_split.items():
            s = load_run(run_dir)
            res = s["metrics"]["medqaro"]
            rows.append({
                "system": system, "label": names[system], "split": split,
                "domain": DOMAINS.get(split, split), "n": res.get("n", s["run"]["n"]),
                "n_patients": res.get("n_clusters"), "model": s["run"]["model"],
                "adapter": s["run"]["adapter"], "run_dir": str(run_dir),
                **{k: _metric(s, k) for k in METRICS},
                "f1_robust": _metric(s, "f1", "robust") if "robust" in s["metrics"] else None,
            })
    return rows


def _gap(by: dict, split: str, reference: str = "majority") -> float | None:
    if ("fine_tuned", split) in by and (reference, split) in by:
        return by["fine_tuned", split]["f1"]["mean"] - by[reference, split]["f1"]["mean"]
    return None


def _margins(cfg: DemoConfig, by: dict, prior: dict[str, dict]) -> dict[str, Any]:
    """Fine-tuned minus each reference, in-domain; met when every one cfg.eval.margin_over
    names reaches eval.min_margin."""
    gaps = {"majority": _gap(by, "test"), "zero_shot": _gap(by, "test", "zero_shot"),
            "question_prior": None}
    if ("fine_tuned", "test") in by and "test" in prior:
        gaps["question_prior"] = by["fine_tuned", "test"]["f1"]["mean"] - prior["test"]["f1"]
    need = cfg.eval.min_margin
    met = all(gaps[r] is not None and gaps[r] >= need for r in cfg.eval.margin_over)
    return {"value": gaps, "required": need, "over": list(cfg.eval.margin_over), "met": met}


def write_demo_report(output: Path, cfg: DemoConfig, runs: dict[str, dict[str, Path]], *,
                      pretrain: dict, trained: dict, timings: dict[str, float],
                      seed: int, memory: dict[str, Any] | None = None) -> dict[str, Any]:
    rows = collect_rows(runs, cfg.base)
    by = {(r["system"], r["split"]): r for r in rows}
    t = cfg.train
    margin, cross = _gap(by, "test"), _gap(by, "test_cross")
    how = HOW.format(resamples=cfg.eval.resamples, max_new=t.prompt.max_new_tokens,
                     fmt=t.prompt.format, ctx=t.prompt.context_tokens,
                     order=ORDER.get(t.prompt.format, t.prompt.format))
    extra = write_report([p for by_split in runs.values() for p in by_split.values()],
                         output / "report")
    by_type = findings.f1_by_type(runs)
    curve = findings.training_curve(output / "train", trained)
    chosen = findings.examples(output, runs)
    prior = findings.question_prior(output, tuple(runs.get("majority") or ("test",)))
    margins = _margins(cfg, by, prior)
    images = {PLOTS["systems"]: figures.systems_figure(rows, DOMAINS),
              PLOTS["types"]: figures.types_figure(by_type, list(findings.QUESTION_TYPES)),
              PLOTS["training"]: figures.training_figure(curve)}
    for name, png in images.items():
        with atomic_file(output / name) as tmp:
            Path(tmp).write_bytes(png)
    last = (trained.get("epochs") or [{}])[-1]
    machine = describe_machine()
    metrics = {
        "how": how, "seed": seed, "rows": rows,
        "margin_in_domain_f1": {"value": margin, "required": cfg.eval.min_margin,
                                "met": margin is not None and margin >= cfg.eval.min_margin},
        "margins_in_domain_f1": margins,
        "cross_domain_f1_gap": {"value": cross, "fine_tuned_above_majority":
                                cross is not None and cross > 0},
        "by_question_type": by_type,
        "question_prior_f1": prior,
        "training_curve": {k: v for k, v in curve.items() if k != "train_loss"},
        "examples": chosen,
        "data": {"synthetic": True, **cfg.synth.model_dump(mode="json")},
        "model": {"base": cfg.base, "name": BASE_NAMES[cfg.base],
                  "tiny": cfg.tiny_model.model_dump() if cfg.base == "tiny" else None,
                  "pretrain": pretrain,
                  "lora": t.lora.model_dump(mode="json"), "adapter": trained.get("adapter"),
                  "fine_tuned_served_as": "merged" if cfg.serves_merged else "adapter"},
        "training": {"epochs": trained.get("epochs"), "initial": trained.get("initial"),
                     "workers": t.scaling.num_workers, "deepspeed_stage": t.deepspeed.stage},
        "machine": machine,
        "timings_s": timings,
        "memory": memory,
        "files": {"plots": [str(output / n) for n in images], "report_html":
                  str(output / "report.html"), "tables": [str(p) for p in extra]},
    }
    write_json_atomic(output / "metrics.json", metrics)
    results = _results(cfg, rows, margins, cross, how, prior, seed)
    lines = [*results, *_by_type_section(by_type, prior.get("test"), labels(cfg.base)),
             *_training_section(curve, trained), *_examples_section(chosen),
             *(_what_ran(cfg, pretrain, last) if cfg.base == "tiny"
               else _what_ran_pretrained(cfg, last))]
    costs = _costs(timings, memory, machine)
    lines += costs
    text = "\n".join(lines) + "\n"
    write_text_atomic(output / "report.md", text)
    write_text_atomic(output / "report.html", to_html(text, images, "medray demo report"))
    # The console's summary: the results table, the two verdicts, the stage table.
    table = [ln for ln in results if ln.startswith("|")]
    return {**metrics, "lines": [*table, _cross_line(cross), _margin_line(margins), "",
                                 *[ln for ln in costs if ln.startswith("|")]]}


MARGIN_NAMES = {"majority": "majority", "zero_shot": "zero-shot",
                "question_prior": "question-text prior"}


def _margin_line(margins: dict[str, Any]) -> str:
    gaps, need = margins["value"], margins["required"]
    if gaps["majority"] is None:
        return "margin: not computed (no in-domain test split evaluated)"
    shown = ", ".join(f"{MARGIN_NAMES[r]} {gaps[r]:+.3f}" for r in MARGIN_NAMES
                      if gaps[r] is not None)
    over = " and ".join(MARGIN_NAMES[r] for r in margins["over"])
    verdict = "met" if margins["met"] else "NOT met"
    return (f"in-domain F1 margin, fine-tuned minus {shown} (required >= {need:.2f} over "
            f"{over}: {verdict})")


def _cross_line(gap: float | None) -> str:
    if gap is None:
        return "cross-domain: not evaluated"
    return (f"cross-domain F1, fine-tuned minus majority: {gap:+.3f} "
            f"({'above' if gap > 0 else 'NOT above'} the majority baseline)")


def _prior_line(prior: dict[str, dict]) -> str:
    if "test" not in prior:
        return ""
    cross = (f" ({prior['test_cross']['f1']:.3f} cross-domain)" if "test_cross" in prior
             else "")
    return ("- Reference point, not a system: answering every question with the train "
            "split's most frequent answer to the same question text scores F1 "
            f"{prior['test']['f1']:.3f} in-domain{cross}. That much needs question priors "
            "only; reading the record is what lies beyond it.")


def _results(cfg: DemoConfig, rows: list[dict], margins: dict[str, Any], cross: float | None,
             how: str, prior: dict[str, dict], seed: int) -> list[str]:
    import pandas as pd

    n = ", ".join(f"{split} {count}" for split, count in cfg.synth.n_patients.items())
    table = pd.DataFrame([{"system": r["label"], "domain": r["domain"], "n (patients)":
                           f"{r['n']} ({r['n_patients']})",
                           **{k.upper(): _fmt(r[k]) for k in METRICS}} for r in rows])
    return [
        "# medray demo report", "",
        f"Synthetic MedQARo-like data (seed {seed}; patients per split: {n}; epicrises "
        f"{cfg.synth.words[0]}-{cfg.synth.words[1]} words). **Synthetic: these numbers say "
        "the pipeline learns, not anything clinical.**", "",
        "## Results", "",
        to_markdown(table),
        f"- {_margin_line(margins)}",
        f"- {_cross_line(cross)}",
        _prior_line(prior), "",
        f"How computed: {how}", "",
        f"![F1 per system]({PLOTS['systems']})", "",
        "Full tables (Markdown, CSV, LaTeX) and the general plots: `report/`.", "",
    ]


def _by_type_section(by_type: dict[str, dict], prior: dict | None,
                     names: dict[str, str]) -> list[str]:
    import pandas as pd

    types = list(findings.QUESTION_TYPES)
    table = pd.DataFrame([{"system": names[s], **{
        f"{t} F1 (n)": (f"{_fmt(g[t])} ({g[t].get('n')})" if t in g else "–") for t in types}}
        for s, g in by_type.items()] + ([{"system": "(reference) question-text prior", **{
            f"{t} F1 (n)": f"{prior['by_type'][t]:.3f}" if t in prior["by_type"] else "–"
            for t in types}}] if prior else []))
    return [
        "## F1 by question type (in-domain test split)", "",
        to_markdown(table) if len(table) else "(no in-domain run)",
        "Binary questions answer Da/Nu, extractive ones copy a value from the epicrisis, "
        "reasoning ones combine facts (dates, counts, stages). The majority baseline scores "
        "on binary questions only; a gain there means the model read the record, a gain on "
        "extractive or reasoning questions can also come from learning which answers a kind "
        "of question tends to have.", "",
        f"![F1 by question type]({PLOTS['types']})", "",
    ]


def _training_section(curve: dict, trained: dict) -> list[str]:
    def points(key: str) -> str:
        return ", ".join(f"step {s}: {v:.3f}" for s, v in curve.get(key) or []) or "–"

    n_steps = len(curve.get("train_loss") or [])
    n_gen = ((trained.get("epochs") or [{}])[-1]).get("val_generated", "the first")
    return [
        "## Training curve", "",
        f"![training curve]({PLOTS['training']})", "",
        f"Training loss at each of {n_steps} optimiser steps (rank 0's micro-batch, from "
        "TensorBoard `train/loss`); validation before training and at each epoch end, on "
        f"the validation split: loss {points('val_loss')}; F1 on {n_gen} validation "
        f"questions (greedy): {points('val_f1')}.",
        "",
    ]


def _cell(text: str, limit: int = 60) -> str:
    text = " ".join(str(text).split())
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return text.replace("|", "\\|") or "(empty)"


def _examples_section(chosen: list[dict]) -> list[str]:
    if not chosen:
        return []
    systems = list(chosen[0]["answers"])
    head = "| type | question | reference | " + " | ".join(
        figures.SYSTEM_LABELS.get(s, s) for s in systems) + " |"
    lines = ["## Example questions (in-domain test split, synthetic)", "",
             f"The first {findings.EXAMPLES_PER_TYPE} questions of each type by id, from "
             "different patients (a fixed rule, not a selection); each answer with its F1.",
             "", head, "|" + "---|" * (3 + len(systems))]
    for ex in chosen:
        answers = " | ".join(f"{_cell(ex['answers'][s]['text'])} ({ex['answers'][s]['f1']:.2f})"
                             for s in systems)
        lines.append(f"| {ex['question_type']} | {_cell(ex['question'], 80)} | "
                     f"{_cell(ex['reference'])} | {answers} |")
    return [*lines, ""]


def _what_ran(cfg: DemoConfig, pretrain: dict, last: dict) -> list[str]:
    t, tm = cfg.train, cfg.tiny_model
    return [
        "## What ran", "",
        f"1. Tiny random-init Llama ({tm.n_layers} layers, hidden {tm.hidden_size}, "
        f"{tm.n_heads} heads, vocabulary <= {tm.vocab_size}); byte-level BPE tokenizer trained "
        "on train-split text only.",
        f"2. **Pre-training stage (added for the demo):** {pretrain['steps']} full-parameter "
        f"next-token steps on the train split's epicrises (unlabelled text, no questions or "
        f"answers); held-out LM loss {pretrain['held_out_loss_before']:.3f} -> "
        f"{pretrain['held_out_loss_after']:.3f}. Without it, LoRA on random weights learns "
        "nothing but the majority answer (measured: F1 equal to the majority baseline).",
        f"3. LoRA r={t.lora.r}, alpha={t.lora.alpha} on {t.lora.target_modules}"
        + (f" plus {t.lora.modules_to_save} trained in full (tied input/output embeddings: "
           "answer words such as 'Da'/'Nu' never occur in epicrises, so their embeddings "
           "stay random-init without it)" if t.lora.modules_to_save else "")
        + f", lr {t.optim.lr:g}, {t.scaling.num_workers} Ray Train workers, DeepSpeed "
        f"ZeRO-{t.deepspeed.stage}, {last.get('step', '?')} optimiser steps; final val_loss "
        f"{last.get('val_loss', float('nan')):.3f}.",
        "4. Ray Serve + vLLM: the pre-trained base answers the zero-shot row; "
        + ("the adapter merged into the base (vLLM loads plain LoRA only, not trained "
           "embeddings) answers the fine-tuned row, on its own replica."
           if t.lora.modules_to_save else
           "the LoRA adapter on the same replica answers the fine-tuned row.")
        + " Evaluation actors call the QA endpoint.", "",
        "## Honest caveats", "",
        "- A tiny model learns question priors (which answers a kind of question tends to "
        "have) as well as reading the epicrisis: the per-question-type table shows where "
        "the gain comes from.",
        "- Cross-domain patients have cancer types absent from training.", "",
    ]


def _what_ran_pretrained(cfg: DemoConfig, last: dict) -> list[str]:
    t = cfg.train
    return [
        "## What ran", "",
        f"1. {BASE_NAMES[cfg.base]} (Apache-2.0) from its Python wheel, dequantised from "
        "GGUF to float32 (`medray model smollm2`; provenance.json beside it); no "
        "pre-training stage and no trained embeddings: the papers' recipe shape.",
        f"2. Plain LoRA r={t.lora.r}, alpha={t.lora.alpha} on {t.lora.target_modules}, lr "
        f"{t.optim.lr:g}, {t.scaling.num_workers} Ray Train worker(s) with "
        f"{t.scaling.cpus_per_worker} CPU(s) each, DeepSpeed ZeRO-{t.deepspeed.stage}, "
        f"batching `{t.data.batching}`, {last.get('step', '?')} optimiser steps; final "
        f"val_loss {last.get('val_loss', float('nan')):.3f}. Prompts go through the "
        f"model's chat template (prompt.chat_template {t.prompt.chat_template!r}).",
        "3. Ray Serve + vLLM: the base answers the zero-shot row; "
        + ("the adapter merged into the base (PEFT merge_and_unload) answers the fine-tuned "
           "row, on its own replica (serve.fine_tuned_as 'merged': vLLM's CPU LoRA path "
           "answers several times slower than a plain model)." if cfg.serves_merged else
           "the LoRA adapter on the same base answers the fine-tuned row.")
        + " Evaluation actors call the QA endpoint.", "",
        "## Honest caveats", "",
        "- A 135M-parameter model: the per-question-type table shows how much comes from "
        "reading the record and how much from question priors.",
        "- Cross-domain patients have cancer types absent from training.", "",
    ]


def _costs(timings: dict[str, float], memory: dict[str, Any] | None,
           machine: dict[str, Any]) -> list[str]:
    import pandas as pd

    stages = (memory or {}).get("by_stage_gib") or {}
    table = pd.DataFrame([{
        "stage": name, "seconds": f"{sec:.1f}",
        "peak GiB, demo processes": f"{stages[name]['processes']:.2f}" if name in stages
        else "", "peak GiB, system above start": f"{stages[name]['system']:.2f}"
        if name in stages else ""} for name, sec in timings.items()])
    peak = (memory or {}).get("peak_gib")
    return [
        "## Time and memory (this machine)", "",
        to_markdown(table),
        (f"Peak memory: {peak['processes']:.2f} GiB (demo processes), {peak['system']:.2f} GiB "
         f"(system above start). {memory['how']}." if peak else ""), "",
        *_largest(memory),
        machine_line(machine),
    ]


def _largest(memory: dict[str, Any] | None) -> list[str]:
    """Which processes held the memory at the highest stage peak."""
    found = largest_at_peak(memory or {})
    if found is None:
        return []
    stage, top = found
    procs = ", ".join(f"{p['process']} {p['pss_gib']:.2f}" for p in top)
    return [f"Largest processes at the peak of '{stage}' (GiB PSS): {procs}.", ""]
