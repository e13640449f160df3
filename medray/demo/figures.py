"""The demo report's plots as PNG bytes (written next to report.md, inlined in report.html)."""

from __future__ import annotations

import io
from typing import Any

SYSTEM_LABELS = {"majority": "majority baseline", "zero_shot": "zero-shot",
                 "fine_tuned": "fine-tuned (LoRA)"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, dpi=110, format="png")
    _pyplot().close(fig)
    return buf.getvalue()


def _bars(ax: Any, groups: list[str], series: dict[str, dict[str, dict]]) -> None:
    """Grouped bars with 95% CI whiskers: series[name][group] = {"mean", "ci95"}."""
    width = 0.8 / max(len(series), 1)
    for i, (name, by_group) in enumerate(series.items()):
        means, lo, hi = [], [], []
        for g in groups:
            m = by_group.get(g) or {}
            mean = m.get("mean") or 0.0
            ci = m.get("ci95") or [mean, mean]
            means.append(mean)
            lo.append(max(mean - ci[0], 0.0))
            hi.append(max(ci[1] - mean, 0.0))
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(groups))]
        ax.bar(xs, means, width, yerr=[lo, hi], capsize=3, label=SYSTEM_LABELS.get(name, name))
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)


def systems_figure(rows: list[dict[str, Any]], domains: dict[str, str]) -> bytes:
    """F1 per system, in-domain and cross-domain."""
    plt = _pyplot()
    splits = list(dict.fromkeys(r["split"] for r in rows))
    series: dict[str, dict[str, dict]] = {}
    for r in rows:
        series.setdefault(r["system"], {})[domains.get(r["split"], r["split"])] = r["f1"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    _bars(ax, [domains.get(s, s) for s in splits], series)
    ax.set_ylabel("F1 (medqaro mode), 95% CI")
    ax.set_title("F1 per system (synthetic MedQARo-like data, tiny model)")
    fig.tight_layout()
    return _png(fig)


def types_figure(by_type: dict[str, dict[str, dict]], types: list[str]) -> bytes:
    """F1 per question type per system (in-domain): by_type[system][type] = f1 block."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    _bars(ax, types, by_type)
    ax.set_ylabel("F1 (medqaro mode), 95% CI")
    ax.set_title("F1 by question type, in-domain test split")
    fig.tight_layout()
    return _png(fig)


def training_figure(curve: dict[str, list[tuple[int, float]]]) -> bytes:
    """Training loss per optimiser step (raw and running mean), validation loss and
    validation F1 at the steps where validation ran."""
    plt = _pyplot()
    fig, (ax_loss, ax_f1) = plt.subplots(1, 2, figsize=(9, 3.4))
    train = curve.get("train_loss") or []
    if train:
        steps, values = zip(*train, strict=True)
        ax_loss.plot(steps, values, color="tab:blue", alpha=0.25, linewidth=0.8,
                     label="train loss (rank 0 micro-batch)")
        window = max(1, len(values) // 20)
        smooth = [sum(values[max(0, i - window + 1):i + 1]) / len(values[max(0, i - window + 1):
                                                                          i + 1])
                  for i in range(len(values))]
        ax_loss.plot(steps, smooth, color="tab:blue", label=f"running mean ({window} steps)")
    val = curve.get("val_loss") or []
    if val:
        ax_loss.plot(*zip(*val, strict=True), "o-", color="tab:red", label="validation loss")
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("optimiser step")
    ax_loss.set_ylabel("cross-entropy (answer tokens)")
    ax_loss.legend(fontsize=7)
    f1 = curve.get("val_f1") or []
    if f1:
        ax_f1.plot(*zip(*f1, strict=True), "o-", color="tab:green", label="validation F1")
    ax_f1.set_ylim(0, 1)
    ax_f1.set_xlabel("optimiser step")
    ax_f1.set_ylabel("F1 (medqaro mode)")
    ax_f1.legend(fontsize=7)
    fig.suptitle("LoRA fine-tuning on Ray Train", fontsize=10)
    fig.tight_layout()
    return _png(fig)
