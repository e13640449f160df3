"""`medray score` and `medray baseline`. Only typer at import time; the work is imported lazily."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from medray.cli.choices import BaselineKind, GroupMapping, MetricMode
from medray.console import fail

GEN_METRICS = ("f1", "em", "bleu", "meteor", "sacrebleu_bleu", "chrf")
MCQ_METRICS = ("accuracy", "partial_credit", "accuracy_nonconforming_wrong", "conforming_rate")



def _fmt(m: dict) -> str:
    if m.get("mean") is None:
        return "n/a"
    lo, hi = m["ci95"]
    return f"{m['mean']:.4f} [{lo:.4f}, {hi:.4f}]"


def _print_human(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    mcq = result["kind"] == "mcq"
    names = MCQ_METRICS if mcq else GEN_METRICS
    how = result["how"]
    source = (f"dataset={result['dataset']} split(s)={','.join(result['splits'])}"
              if result.get("dataset") and result.get("splits")
              else f"references={result.get('references') or 'given file'}")
    header = (f"mode={result['mode']} {source} n={result['n']} "
              f"CI: {how['ci']['method']}, {how['ci']['resamples']} resamples over "
              f"{how['ci']['unit']}s, seed {how['ci']['seed']}; fractions in [0, 1]")
    if not mcq:
        header += (f"\ntokenizer: {result['tokenizer']}; METEOR WordNet: "
                   f"{how['meteor_wordnet_source'] if result['meteor_wordnet'] else 'absent'}")
    else:
        header += f"\nnon-conforming (excluded): {result['n_nonconforming']}"
    table = Table(title=header, title_justify="left")
    extra = ("random_expected",) if mcq else ()
    for col in ("group", "n", *names, *extra):
        table.add_column(col)

    def add(label: str, block: dict) -> None:
        cells = [_fmt(block["metrics"][k]) for k in names]
        if mcq:
            rnd = block.get("random_expected_accuracy")
            cells.append("n/a" if rnd is None else f"{rnd:.4f}")
        table.add_row(label, str(block["n"]), *cells)

    add("all", result)
    for kind, block in (result.get("per_kind") or {}).items():
        add(f"kind={kind}", block)
    for field, groups in (result.get("by") or {}).items():
        for value, block in groups.items():
            add(f"{field}={value}", block)
    # Piped output gets a wide console so CIs are not truncated.
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def score(
    predictions: Annotated[
        Path,
        typer.Option("--predictions", "-p", help="JSONL/Parquet: id, prediction"),
    ],
    references: Annotated[Path | None, typer.Option(help="JSONL/Parquet: id, answer")] = None,
    data: Annotated[
        Path | None,
        typer.Option(help="prepared dataset dir (replaces --references)"),
    ] = None,
    mode: Annotated[
        MetricMode,
        typer.Option(help="medqaro (reference-exact) | robust (Romanian-aware)"),
    ] = MetricMode.medqaro,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    by: Annotated[str, typer.Option(help="breakdown fields, comma-separated")] = "",
    split: Annotated[
        str,
        typer.Option(help="restrict references to these splits (comma-separated)"),
    ] = "",
    fold_diacritics: Annotated[bool, typer.Option(help="robust mode: ă->a, ș->s ...")] = False,
    group_as_multiple: Annotated[
        GroupMapping,
        typer.Option(help="MCQ: map statement sets to group letters"),
    ] = GroupMapping.off,
    resamples: Annotated[int, typer.Option(help="bootstrap resamples")] = 1000,
    seed: Annotated[int, typer.Option(help="bootstrap seed")] = 0,
    workers: Annotated[int, typer.Option(help="scoring processes (0 = auto)")] = 0,
    wordnet: Annotated[bool, typer.Option(help="METEOR synonyms (WordNet/RoWordNet)")] = True,
) -> None:
    """Score predictions against references with bootstrap 95% CIs (and breakdowns)."""
    mode, group_as_multiple = str(mode), str(group_as_multiple)
    from medray.data.schema import DataError
    from medray.eval.metrics.generative import MODES
    from medray.eval.score import ScoreInputError, run_score

    if mode not in MODES:
        fail(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    if (references is None) == (data is None):
        fail("give exactly one of --references or --data")
    if group_as_multiple not in ("off", "heuristic", "first"):
        fail("--group-as-multiple must be off, heuristic or first")
    fields = [f.strip() for f in by.split(",") if f.strip()]
    try:
        result = run_score(
            predictions, references, data, mode=mode, by=fields,
            splits=[s.strip() for s in split.split(",") if s.strip()] or None,
            fold_diacritics=fold_diacritics,
            group_mapping=None if group_as_multiple == "off" else group_as_multiple,
            n_resamples=resamples, seed=seed, workers=workers or None, use_wordnet=wordnet)
    except (ScoreInputError, DataError, FileNotFoundError) as err:
        fail(str(err))
    if as_json:
        sys.stdout.write(json.dumps(result, ensure_ascii=False) + "\n")
    else:
        _print_human(result)


def baseline(
    data: Annotated[Path, typer.Option(help="prepared dataset directory")],
    kind: Annotated[BaselineKind, typer.Option(
        help="majority | random-token (generative) | random (MCQ)")],
    out: Annotated[Path, typer.Option(help="predictions JSONL to write")],
    tokens: Annotated[int, typer.Option(help="random-token budget N (1024/2048/4096)")] = 1024,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    split: Annotated[str, typer.Option(help="split to predict")] = "test",
    tokenizer: Annotated[
        str | None,
        typer.Option(help="HF tokenizer path (default: whitespace words)"),
    ] = None,
) -> None:
    """Write baseline predictions for one split (readable by `medray score`)."""
    kind = str(kind)
    from medray.data.prepared import load_prepared
    from medray.eval import baselines as bl

    try:
        prepared = load_prepared(data)
        examples = prepared.split(split)
    except (FileNotFoundError, KeyError) as err:
        fail(f"{data}: {err}")
    if prepared.kind == "generative":
        if kind == "majority":
            try:
                answer = bl.majority_answer(prepared.split("train"))
            except (KeyError, ValueError) as err:
                fail(f"{data}: {err}")
            rows = bl.majority_predictions(examples, answer)
            note = "majority answer of the train split"
        elif kind == "random-token":
            rows = bl.random_token_predictions(examples, prepared.context, tokens, seed, tokenizer)
            note = (f"random 1-3 token span from the first {tokens} tokens "
                    f"({tokenizer or 'whitespace words'}), seed {seed}")
        else:
            fail(f"--kind for generative data must be majority or random-token, got {kind!r}")
    else:
        if kind == "majority":
            rows = bl.mcq_majority_predictions(examples, prepared.split("train"))
            note = "majority answer per kind of the train split"
        elif kind == "random":
            rows = bl.mcq_random_predictions(examples, seed)
            note = f"uniform random guess per kind, seed {seed}"
        else:
            fail(f"--kind for multiple-choice data must be majority or random, got {kind!r}")
    from medray.io import OutputRefused, check_output, write_jsonl_atomic

    try:  # a file output replaces only what is there, but never inside the input
        check_output(out, [data], force=True)
    except OutputRefused as err:
        fail(str(err))
    write_jsonl_atomic(out, rows)
    typer.echo(f"wrote {len(rows)} predictions to {out} ({prepared.dataset}, split {split}: "
               f"{note})", err=True)
