"""`medray study context-length`: one model trained and tested at several context budgets.

The MedQARo paper's study (1,024 ... 32,768 tokens; longer did not help), composed from the
parts that already exist, so every length is trained, prompted and scored exactly as a
single run would be:

1. train: a Ray Tune grid over `prompt.context_tokens` (`medray tune`'s sweep, resumable;
   DIR/space.yaml is the generated space, DIR/sweep/ the sweep folder) - or, with
   `--eval-only MODEL`, no training: MODEL is evaluated at each budget;
2. evaluate: `medray eval`'s runner per length x split (DIR/eval/<length>-<split>/, run
   folders that resume), each adapter prompted by its own prompt.json (so at the length it
   was trained with);
3. report: DIR/table.md|csv|tex (F1 / EM / BLEU / METEOR with 95% CIs per length, in-domain
   and cross-domain) and DIR/f1_vs_length.png, from `medray report`'s tables.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from medray.config import ConfigError
from medray.io import atomic_file

SPACE_FILE = "space.yaml"
SWEEP_DIR = "sweep"
EVAL_DIR = "eval"


def parse_lengths(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(f"--lengths {text!r}: comma-separated token counts, e.g. "
                          "1024,2048,4096") from None
    if len(lengths) < 2 or len(set(lengths)) != len(lengths) or min(lengths) < 16:
        raise ConfigError(f"--lengths {text!r}: at least two different budgets of >= 16 "
                          "tokens")
    return sorted(lengths)


def write_space(output: Path, lengths: Sequence[int]) -> Path:
    """The study's search space: a grid over the budget, one trial at a time, no early
    stopping (every length trains to the end, as in the paper)."""
    space = {"description": f"context-length study: prompt.context_tokens in {list(lengths)}",
             "search": "grid", "num_samples": 1, "metric": "val_loss", "mode": "min",
             "scheduler": {"type": "none"}, "max_concurrent_trials": 1,
             "params": {"prompt.context_tokens": list(lengths)}}
    path = output / SPACE_FILE
    with atomic_file(path) as tmp:
        tmp.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def trained_models(sweep_dir: Path) -> dict[int, tuple[str, str]]:
    """length -> (base model, adapter) of each completed trial of the sweep."""
    import json

    import pandas as pd

    from medray.tune.outputs import TRIALS_CSV
    from medray.tune.plan import TRAIN_SUBDIR

    table = pd.read_csv(sweep_dir / TRIALS_CSV)
    out = {}
    for row in table[table["status"] == "completed"].itertuples(index=False):
        run = Path(row.trial_dir) / TRAIN_SUBDIR
        metrics = json.loads((run / "metrics.json").read_text())
        out[int(metrics["config"]["prompt"]["context_tokens"])] = (metrics["model"],
                                                                    metrics["adapter"])
    return out


def eval_config(data: str, split: str, engine: str, model: str, adapter: str | None,
                length: int | None, resamples: int, limit: int | None) -> Any:
    from medray.eval.config import EvalConfig

    raw: dict[str, Any] = {"data": data, "split": split,
                           "engine": {"kind": engine, "model": model, "adapter": adapter,
                                      "max_model_len": max(2048, (length or 0) + 64)},
                           "score": {"resamples": resamples}, "limit": limit}
    if length is not None:  # --eval-only: the budget is the study's, not the model's
        raw["prompt"] = {"context_tokens": length}
    return EvalConfig.model_validate(raw)


def evaluate_lengths(models: dict[int, tuple[str, str | None]], data: str, output: Path, *,
                     splits: Sequence[str], engine: str, eval_only: bool, resamples: int,
                     limit: int | None, log: Callable[[str], None]) -> list[Path]:
    """One eval run folder per length x split (resumed when it exists with the same config)."""
    from medray.eval.runner import run_eval

    runs = []
    for length, (model, adapter) in sorted(models.items()):
        for split in splits:
            out = output / EVAL_DIR / f"{length}-{split}"
            cfg = eval_config(data, split, engine, model, adapter,
                              length if eval_only else None, resamples, limit)
            summary = run_eval(cfg, out)
            f1 = summary["metrics"]["medqaro"]["metrics"]["f1"]["mean"]
            log(f"{length} tokens, {split}: F1 {f1:.4f} (medqaro mode, n "
                f"{summary['run']['n']}) -> {out}")
            runs.append(out)
    return runs


def write_tables(runs: Sequence[Path], output: Path) -> list[Path]:
    """DIR/table.md|csv|tex and DIR/f1_vs_length.png from the eval run folders."""
    import shutil
    import tempfile

    from medray.eval.report import main_table, plot_context, rows_from_runs, to_markdown, with_cis

    rows = rows_from_runs(runs, "medqaro")
    table = main_table(rows)
    files = []
    for name, write in (
            ("table.md", lambda p: p.write_text(
                "# Context-length study (medqaro metric mode; fractions, per-example mean "
                "[95% patient-bootstrap CI]; in = held-out patients, cross = cross-domain)"
                "\n\n" + to_markdown(with_cis(table)))),
            ("table.csv", lambda p: table.to_csv(p, index=False)),
            ("table.tex", lambda p: p.write_text(table.to_latex(
                index=False, float_format="%.4f", na_rep="--",
                caption="F1 / EM / BLEU / METEOR against the context budget",
                label="tab:context-length")))):
        with atomic_file(output / name) as tmp:
            write(tmp)
        files.append(output / name)
    with tempfile.TemporaryDirectory() as scratch:
        plot = plot_context(rows, Path(scratch))
        if plot is not None:
            with atomic_file(output / "f1_vs_length.png") as tmp:
                shutil.copyfile(plot, tmp)
            files.append(output / "f1_vs_length.png")
    return files


def sweep_plan(config: str | os.PathLike, lengths: Sequence[int], output: Path,
               overrides: list[str]) -> Any:
    from medray.tune.plan import plan_sweep

    if any(o.split("=", 1)[0].strip() == "prompt.context_tokens" for o in overrides):
        raise ConfigError("prompt.context_tokens is what the study varies (--lengths); "
                          "remove the override")
    return plan_sweep(config, write_space(output, lengths), output / SWEEP_DIR, overrides)
