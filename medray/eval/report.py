"""`medray report`: paper-style tables and plots from `medray eval` run directories.

Every run folder has the same metrics.json (medray/eval/finish.py), so generative and
multiple-choice runs of any engine go in one table (like MedQARo Tables 6-8): one row per
run x split/domain with dataset, model, fine-tuned, context tokens, prompt format, strategy
and F1 / EM / BLEU / METEOR or accuracy / conforming rate (fractions, 95% CI). Written as
Markdown, CSV and LaTeX.
Plots: metric against context length per model; F1 per question type, runs side by side.
Beside them: results_lm_eval.json (the runs in lm-evaluation-harness's results schema,
medray/eval/lm_eval_results.py) and samples.html (every item with each run's answer and
score, medray/eval/samples.py and samples_page.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from medray.io import atomic_directory, check_output, write_json_atomic, write_text_atomic

GEN = ("f1", "em", "bleu", "meteor")
MCQ = ("accuracy", "conforming_rate")
DOMAIN = {"test": "in", "val": "in", "train": "in", "test_cross": "cross"}


class ReportError(ValueError):
    pass


def load_run(run_dir: Path) -> dict:
    path = Path(run_dir) / "metrics.json"
    if not path.is_file():
        raise ReportError(f"{run_dir}: no metrics.json (run `medray eval` first)")
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("run"), dict) \
            or not isinstance(summary.get("metrics"), dict) or not summary["metrics"]:
        raise ReportError(f"{path}: not a `medray eval` metrics file (no 'run' record or "
                          "no 'metrics'); rerun `medray eval` with this medray into a new "
                          "--output")
    return summary


def _mean(block: dict, name: str) -> float | None:
    m = (block.get("metrics") or {}).get(name) or {}
    return m.get("mean")


def _ci(block: dict, name: str) -> list:
    m = (block.get("metrics") or {}).get(name) or {}
    return m.get("ci95") or [None, None]


def rows_from_runs(runs: Sequence[Path], mode: str = "medqaro") -> pd.DataFrame:
    rows = []
    for run_dir in runs:
        summary = load_run(run_dir)
        run, scores = summary["run"], summary["metrics"]
        res = scores.get(mode) or scores.get("mcq") or next(iter(scores.values()))
        kind = res.get("kind", "generative")
        split = run.get("split")
        base = {
            "run": Path(run_dir).name, "dataset": run.get("dataset"), "model": run.get("model"),
            "engine": run.get("engine"), "fine_tuned": bool(run.get("fine_tuned")),
            "context_tokens": run.get("context_tokens"),
            "prompt_format": run.get("prompt_format"), "strategy": run.get("strategy"),
            "split": split, "domain": DOMAIN.get(split, split),
            "n": res.get("n"), "mode": res.get("mode", mode), "kind": kind,
        }
        names = GEN if kind == "generative" else MCQ
        row = dict(base)
        for name in names:
            row[name] = _mean(res, name)
            lo, hi = _ci(res, name)
            row[f"{name}_lo"], row[f"{name}_hi"] = lo, hi
        rows.append(row)
        for qtype, block in ((res.get("by") or {}).get("question_type") or {}).items():
            rows.append({**base, "question_type": qtype, "n": block.get("n"),
                         **{name: _mean(block, name) for name in names}})
    if not rows:
        raise ReportError("no runs given")
    return pd.DataFrame(rows)


COUNT_COLUMNS = ("n", "context_tokens", "n_conforming", "n_hard")


def _cell(v: object, column: str = "") -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "–"
    if column in COUNT_COLUMNS and isinstance(v, int | float):
        return str(int(v))
    if column == "seconds" and isinstance(v, float):
        return f"{v:.1f}"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def with_cis(df: pd.DataFrame) -> pd.DataFrame:
    """Metric columns as 'mean [lo, hi]' (95% CI) where the run recorded a CI."""
    out = df.drop(columns=[c for c in df if c.endswith(("_lo", "_hi"))])
    for name in (*GEN, *MCQ):
        if name in out and f"{name}_lo" in df:
            out[name] = [
                _cell(m) if pd.isna(lo) or pd.isna(hi) else f"{m:.4f} [{lo:.4f}, {hi:.4f}]"
                for m, lo, hi in zip(df[name], df[f"{name}_lo"], df[f"{name}_hi"], strict=True)]
    return out


def to_markdown(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(v, c) for v, c in zip(row, cols, strict=True)) + " |"
              for row in df.itertuples(False)]
    return "\n".join(lines) + "\n"


def main_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Overall rows only, shaped like the papers: model x fine-tuned x context tokens, each
    metric with its 95% CI bounds (`<metric>_lo`, `<metric>_hi`)."""
    overall = rows[rows.get("question_type", pd.Series(index=rows.index)).isna()].copy()
    metric_cols = [c for c in (*GEN, *MCQ) if c in overall and overall[c].notna().any()]
    bounds = [b for c in metric_cols for b in (f"{c}_lo", f"{c}_hi") if b in overall]
    cols = ["model", "fine_tuned", "context_tokens", "prompt_format", "strategy", "dataset",
            "split", "domain", "n", *metric_cols, *bounds]
    sort = ["dataset", "split", "model", "fine_tuned", "context_tokens"]
    return overall[cols].sort_values(sort, kind="stable").reset_index(drop=True)


def plot_context(rows: pd.DataFrame, out: Path, metric: str = "f1") -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    overall = main_table(rows)
    if metric not in overall:
        return None
    overall = overall[overall[metric].notna()]  # multiple-choice rows have no F1
    fig, ax = plt.subplots(figsize=(6, 4))
    for (model, ft, split), g in overall.groupby(["model", "fine_tuned", "split"]):
        g = g.sort_values("context_tokens")
        label = f"{Path(str(model)).name} {'FT' if ft else 'ZS'} ({split})"
        ax.plot(g["context_tokens"], g[metric], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context tokens")
    ax.set_ylabel(f"{metric.upper()} ({overall['n'].iloc[0]} items/run, mean)")
    ax.set_title(f"{metric.upper()} against context length")
    ax.legend(fontsize=7)
    path = out / f"{metric}_vs_context.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_question_types(rows: pd.DataFrame, out: Path, metric: str = "f1") -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "question_type" not in rows or rows["question_type"].isna().all():
        return None
    per = rows[rows["question_type"].notna()]
    table = per.pivot_table(index="question_type", columns="run", values=metric, aggfunc="mean")
    fig, ax = plt.subplots(figsize=(6, 4))
    table.plot.bar(ax=ax, rot=0)
    ax.set_ylabel(f"{metric.upper()} (mean per question type)")
    ax.set_title(f"{metric.upper()} per question type")
    ax.legend(fontsize=7)
    path = out / f"{metric}_by_question_type.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(runs: Sequence[Path], out: str | os.PathLike, mode: str = "medqaro",
                 force: bool = False, by: Sequence[str] = (), hard: bool = False,
                 resamples: int = 1000) -> list[Path]:
    """Write the tables and plots as the folder `out` (swapped in whole; the runs are inputs);
    `by`: breakdown tables per field, `hard`: the items every run misses."""
    out = Path(out)
    check_output(out, runs, force)  # before reading: a refused --out costs nothing
    rows = rows_from_runs(runs, mode)
    study = _study(runs, rows, mode, by, hard, resamples)
    formats = _formats(runs, mode)
    with atomic_directory(out, inputs=runs, force=force, command="report") as tmp:
        files = _write_tables(rows, tmp, mode)
        files += _write_study(study, tmp, mode)
        files += _write_formats(formats, tmp)
    return [out / f.name for f in files]


def _formats(runs: Sequence[Path], mode: str) -> dict:
    """The lm-eval results dict and the samples page, read before anything is written."""
    from medray.eval.breakdown import BreakdownError
    from medray.eval.lm_eval_results import lm_eval_results
    from medray.eval.samples import samples_data
    from medray.eval.samples_page import render_page
    from medray.eval.score import ScoreInputError

    try:
        lm_eval = lm_eval_results(runs, [load_run(r) for r in runs])
        names = ", ".join(Path(r).name for r in runs)
        page = render_page(samples_data(runs, mode), title=f"medray samples: {names}")
    except (BreakdownError, ScoreInputError, ValueError) as err:
        raise ReportError(str(err)) from None
    return {"lm_eval": lm_eval, "samples": page}


def _write_formats(formats: dict, out: Path) -> list[Path]:
    from medray.eval.lm_eval_results import FILENAME

    return [write_json_atomic(out / FILENAME, formats["lm_eval"]),
            write_text_atomic(out / "samples.html", formats["samples"])]


def _study(runs: Sequence[Path], rows: pd.DataFrame, mode: str, by: Sequence[str],
           hard: bool, resamples: int) -> dict:
    from medray.eval.breakdown import BreakdownError, breakdown_rows, hard_items
    from medray.eval.score import ScoreInputError

    study: dict = {}
    try:
        if by:
            study["by"] = breakdown_rows(runs, by, mode, n_resamples=resamples)
        if hard:
            fields = list(by) or (["kind"] if (rows["kind"] == "mcq").all()
                                  else ["question_type"])
            study["hard"] = hard_items(runs, fields, mode)
    except (BreakdownError, ScoreInputError) as err:
        raise ReportError(str(err)) from None
    return study


def _write_study(study: dict, out: Path, mode: str) -> list[Path]:
    files = []
    if "by" in study:
        table = study["by"]
        parts = [f"# Breakdowns ({mode} metric mode for generative runs; multiple choice: "
                 "accuracy over conforming outputs, conforming share over all items; "
                 "fractions, mean [95% bootstrap CI])\n"]
        for field, group in table.groupby("field", sort=False):
            shown = with_cis(group.drop(columns="field").reset_index(drop=True))
            parts.append(f"## By {field}\n\n" + to_markdown(shown.dropna(axis=1, how="all")))
        (out / "breakdown.md").write_text("\n".join(parts))
        table.to_csv(out / "breakdown.csv", index=False)
        files += [out / "breakdown.md", out / "breakdown.csv"]
    if "hard" in study:
        items, counts, how = study["hard"]
        head = (f"# Items every run misses: {how['n_hard']} of {how['n_common_items']} "
                f"items common to {len(how['runs'])} runs ({', '.join(how['runs'])})\n\n"
                f"Missed: {how['miss_rule']}.\n\n")
        (out / "hard_items.md").write_text(
            head + "## Per field value\n\n" + to_markdown(counts)
            + "\n## The items\n\n" + (to_markdown(items) if len(items) else "none\n"))
        items.to_csv(out / "hard_items.csv", index=False)
        files += [out / "hard_items.md", out / "hard_items.csv"]
    return files


def _write_tables(rows: pd.DataFrame, out: Path, mode: str) -> list[Path]:
    table = main_table(rows)
    files = []
    md = out / "results.md"
    md.write_text(f"# Results ({mode} metric mode; fractions, per-example mean "
                  "[95% bootstrap CI])\n\n"
                  + to_markdown(with_cis(table)) + "\n## Per question type\n\n"
                  + (to_markdown(rows[rows["question_type"].notna()][
                      ["run", "question_type", "n", *[c for c in GEN if c in rows]]])
                     if "question_type" in rows else "none\n"))
    files.append(md)
    csv = out / "results.csv"
    rows.to_csv(csv, index=False)
    files.append(csv)
    tex = out / "results.tex"
    tex.write_text(table.to_latex(index=False, float_format="%.4f", na_rep="--",
                                  caption=f"Results ({mode} metrics)", label="tab:results"))
    files.append(tex)
    files += [p for p in (plot_context(rows, out), plot_question_types(rows, out)) if p]
    return files
