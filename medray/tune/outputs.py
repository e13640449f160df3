"""Sweep outputs from a Tune ResultGrid: trials.csv, best.yaml and the F1-vs-hyperparameter plot.

All files are written to a temporary name and renamed, so an interrupted write leaves the
previous version (or nothing), never half a file.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from medray.io import atomic_file
from medray.tune.space import clean_value

TRIALS_CSV = "trials.csv"
BEST_YAML = "best.yaml"
PLOT = "val_f1_vs_hparams.png"
VAL_METRICS = ("val_loss", "val_f1", "val_em")
# How the training loop computes what it reports (medray.train.trainer.MEDQARO_METRIC_NOTE).
HOW = ("val_f1/val_em: 'medqaro' metric mode, greedy answers to the first "
       "data.val_generate_examples validation examples; val_loss: token-weighted "
       "cross-entropy over answer+EOS tokens of the validation split")


@dataclass
class Summary:
    trials: pd.DataFrame
    best_trial: str | None
    files: dict[str, Path]
    interrupted: bool = False


def _atomic_write(path: Path, write: Any) -> Path:
    with atomic_file(path) as tmp:
        write(tmp)
    return path


class SweepFailed(RuntimeError):
    """Every trial failed: carries the first trial's root cause."""


def root_cause(error: BaseException) -> str:
    """The innermost error of a trial failure (Tune wraps Train's, which wraps the worker's),
    as one line: `Type: message`."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        failures = getattr(error, "worker_failures", None)
        if isinstance(failures, dict) and failures:
            error = next(iter(failures.values()))
            continue
        inner = getattr(error, "cause", None) or error.__cause__
        if isinstance(inner, BaseException):
            error = inner
            continue
        break
    lines = [ln for ln in str(error).splitlines() if ln.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


def _epoch_rows(df: pd.DataFrame | None) -> pd.DataFrame:
    """Epoch-end reports (mid-epoch checkpoint reports repeat the last validation values)."""
    if df is None or df.empty:
        return pd.DataFrame()
    if "tokens_per_s" in df.columns:
        return df[df["tokens_per_s"].notna()]
    return df


def trial_row(result: Any, params: list[str], metric: str, mode: str,
              tune_status: str | None = None) -> dict:
    """One trials.csv row. `tune_status` (Tune's own, from its experiment snapshot) tells an
    ASHA stop (TERMINATED) from a trial the sweep's interruption cut off (RUNNING, PENDING)."""
    from medray.tune.plan import read_events

    path = Path(result.path)
    metrics = result.metrics or {}
    trial_id = metrics.get("trial_id") or path.name.removeprefix("trial_")
    events = read_events(path)
    finished = any(e["event"] in ("end", "skip") for e in events)
    if result.error is not None:
        status = "error"
    elif finished:
        status = "completed"
    elif tune_status in (None, "TERMINATED"):
        status = "stopped_early"
    else:
        status = "interrupted"
    row: dict[str, Any] = {"trial_id": trial_id, "status": status,
                           "stopped_early": status == "stopped_early"}
    for p in params:
        row[p] = clean_value((result.config or {}).get(p))
    rows = _epoch_rows(result.metrics_dataframe)
    row["epochs"] = int(rows["epoch"].max()) if "epoch" in rows and len(rows) else 0
    for m in dict.fromkeys([metric, *VAL_METRICS]):
        col = rows[m].dropna() if m in rows else pd.Series(dtype=float)
        row[f"final_{m}"] = float(col.iloc[-1]) if len(col) else math.nan
        higher = mode == "max" if m == metric else m != "val_loss"
        best = col.max() if higher else col.min()
        row[f"best_{m}"] = float(best) if len(col) else math.nan
    if "train_loss" in rows and len(rows):
        row["final_train_loss"] = float(rows["train_loss"].dropna().iloc[-1])
    row["starts"] = sum(e["event"] == "start" for e in events)
    row["time_s"] = round(float(metrics.get("time_total_s", math.nan)), 1)
    row["trial_dir"] = str(path)
    row["error"] = root_cause(result.error) if result.error is not None else ""
    return row


def trials_table(results: Any, params: list[str], metric: str, mode: str,
                 statuses: dict[str, str] | None = None) -> pd.DataFrame:
    statuses = statuses or {}
    rows = [trial_row(r, params, metric, mode,
                      statuses.get(Path(r.path).name.removeprefix("trial_"))) for r in results]
    return pd.DataFrame(rows).sort_values("trial_id", kind="stable").reset_index(drop=True)


def pick_best(table: pd.DataFrame, metric: str, mode: str) -> pd.Series | None:
    """Best completed trial by its best `metric`; stopped trials only if none completed."""
    col = f"best_{metric}"
    for pool in (table[table["status"] == "completed"], table[table["status"] != "error"]):
        pool = pool[pool[col].notna()]
        if len(pool):
            idx = pool[col].idxmax() if mode == "max" else pool[col].idxmin()
            return table.loc[idx]
    return None


def write_best_yaml(path: Path, plan: Any, best: pd.Series, results: Any, n: int) -> Path:
    from medray.tune.plan import trial_config

    config = next(r.config for r in results
                  if Path(r.path).name.removeprefix("trial_") == best["trial_id"]
                  or (r.metrics or {}).get("trial_id") == best["trial_id"])
    full = trial_config(plan.base, config)
    header = (f"# Best of {n} trials of the sweep in {plan.output} (trial {best['trial_id']}),\n"
              f"# by best {plan.metric} ({plan.mode}) over its epoch-end validation reports:\n"
              f"# {plan.metric} = {best[f'best_{plan.metric}']:.6g}. ({HOW}.)\n"
              f"# Hyperparameters: "
              + ", ".join(f"{k}={clean_value(config[k])!r}" for k in plan.space.params) + "\n"
              f"# A complete config: medray train --config {path.name} --output DIR\n")
    body = yaml.safe_dump(full, sort_keys=False, allow_unicode=True)
    return _atomic_write(path, lambda tmp: tmp.write_text(header + body))


def plot_metric_vs_params(path: Path, table: pd.DataFrame, space: Any, metric: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    params = list(space.params)
    ys = list(dict.fromkeys(["val_f1", metric]))
    ys = [m for m in ys if f"final_{m}" in table and table[f"final_{m}"].notna().any()] or [metric]
    fig, axes = plt.subplots(len(ys), len(params), squeeze=False,
                             figsize=(3.2 * len(params), 2.8 * len(ys)))
    ok = table[table["status"] != "error"]
    for i, m in enumerate(ys):
        for j, p in enumerate(params):
            ax = axes[i][j]
            xs = ok[p]
            numeric = pd.api.types.is_numeric_dtype(xs)
            if not numeric:  # categorical values: positions in the order of the space file
                order = [str(v) for v in space.params[p].grid_values() or sorted(set(xs))]
                xs = xs.map(lambda v, o=order: o.index(str(v)) if str(v) in o else len(o))
                ax.set_xticks(range(len(order)), order, rotation=30)
            for status, marker, label in (("completed", "o", "completed"),
                                          ("stopped_early", "x", "stopped early (ASHA)")):
                sel = ok["status"] == status
                ax.scatter(xs[sel], ok.loc[sel, f"final_{m}"], marker=marker, label=label)
            if numeric and space.params[p].log_scale:
                ax.set_xscale("log")
            ax.set_xlabel(p)
            if j == 0:
                ax.set_ylabel(f"final {m}")
    axes[0][0].legend(fontsize=7)
    width = max(60, int(22 * len(params)))
    fig.suptitle(textwrap.fill(f"Validation metrics at each trial's last reported epoch vs "
                               f"hyperparameters (n={len(ok)} trials). {HOW}", width),
                 fontsize=7)
    fig.tight_layout()

    def save(tmp: Path) -> None:
        fig.savefig(tmp, format="png", dpi=110)

    try:
        return _atomic_write(path, save)
    finally:
        plt.close(fig)


def write_outputs(plan: Any, results: Any, *, log: Any = print,
                  statuses: dict[str, str] | None = None, best_if_partial: bool = False
                  ) -> Summary:
    """trials.csv, the plot, best.yaml. A sweep cut off by Ctrl-C (trials `interrupted`)
    gets no best.yaml unless `best_if_partial`: its best is only the best so far."""
    out = Path(plan.output)
    params = list(plan.space.params)
    table = trials_table(results, params, plan.metric, plan.mode, statuses)
    partial = bool((table["status"] == "interrupted").any()) if len(table) else False
    files = {"trials": _atomic_write(out / TRIALS_CSV,
                                     lambda tmp: table.to_csv(tmp, index=False))}
    if len(table) and (table["status"] == "error").all():
        first = table.iloc[0]
        raise SweepFailed(f"all {len(table)} trials failed (see {files['trials']}); first "
                          f"trial {first['trial_id']}: {first['error']}")
    plotted = [f"final_{m}" for m in dict.fromkeys(["val_f1", plan.metric])]
    ok = table[table["status"] != "error"] if len(table) else table
    if len(ok) and any(c in ok and ok[c].notna().any() for c in plotted):
        files["plot"] = plot_metric_vs_params(out / PLOT, table, plan.space, plan.metric)
    else:
        log("no trial reported a validation metric; no plot written")
    best = pick_best(table, plan.metric, plan.mode)
    if partial and not best_if_partial:
        best = None
    if best is not None:
        files["best"] = write_best_yaml(out / BEST_YAML, plan, best, results, len(table))
    counts = table["status"].value_counts().to_dict()
    log(f"{len(table)} trials: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    if best is not None:
        log(f"best trial {best['trial_id']}: best {plan.metric} "
            f"{best[f'best_{plan.metric}']:.4f} ({plan.mode}; epoch-end validation reports; "
            f"{HOW}); " + ", ".join(f"{p}={best[p]}" for p in params))
    elif partial:
        log("the sweep was interrupted: no best.yaml written (resume it with --resume, or "
            "pass --best-if-partial for the best trial so far)")
    else:
        log("no trial reported the metric; no best.yaml written")
    for name, path in files.items():
        log(f"{name}: {path}")
    log(f"tensorboard: tensorboard --logdir {out}")
    return Summary(trials=table, best_trial=None if best is None else str(best["trial_id"]),
                   files=files, interrupted=partial)
