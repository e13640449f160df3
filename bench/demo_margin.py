"""Does the demo beat the majority baseline by the required F1 margin on held-out patients,
and stay above it cross-domain, per seed? With its wall time and peak memory.

Runs `medray demo` itself (medray.demo.run_demo: synthetic data, tiny model, pre-training,
Ray Train 2 workers DeepSpeed ZeRO-2 LoRA, Ray Serve + vLLM, evaluation actors, report)
for each seed (a seed changes the synthetic data, the model init and the training order)
and prints, per seed: F1 on the in-domain TEST split (medqaro mode: set-based token F1
after lowercasing, ASCII-punctuation removal, whitespace collapse; per example, then
averaged; 95% CI by patient bootstrap) of the majority baseline, the zero-shot base and
the fine-tuned model; the margin fine-tuned - majority; the cross-domain F1 of fine-tuned
and majority; the demo's wall time (run_demo, Ray start included); its peak memory: the
summed PSS of the demo's own processes, and system memory in use above the start.

Run alone. Each seed runs like `medray demo`: a local Ray of its own unless RAY_ADDRESS is
set, the stages on the console, the logs under the demo's folder (kept with --keep).
One seed per lock hold:
    flock /tmp/medray-heavy.lock .venv/bin/python bench/demo_margin.py --seeds 0 --json s0.json
    .venv/bin/python bench/demo_margin.py --from-json s0.json s1.json ...   # the table
or all at once: .venv/bin/python bench/demo_margin.py --seeds 0 1 2 3 4
Every form also writes docs/results/demo.json (bench/_results.py), e.g. from a finished
`make demo`: .venv/bin/python bench/demo_margin.py --from-demo runs/demo
The real-model demo (`medray demo --model smollm2`, configs/demo-smollm2.yaml) writes
docs/results/demo_smollm2.json instead:
    .venv/bin/python bench/demo_margin.py --from-demo runs/demo-smollm2
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_seed(seed: int, work: Path, config: str, overrides: list[str]) -> dict:
    """One `medray demo` as the command runs it: its own local Ray (unless RAY_ADDRESS is
    set), its stages on the console, Ray/DeepSpeed/vLLM logs in WORK/demo/logs."""
    from medray.console import command_console
    from medray.demo import run_demo
    from medray.io import claim_directory

    out = work / "demo"
    claim_directory(out, command="demo")
    t0 = time.time()
    with command_console("demo", out / "logs") as display:
        summary = run_demo(out, seed=seed, config=Path(config), overrides=overrides,
                           console=display.console)
    return row_from_summary(summary, time.time() - t0)


def row_from_summary(summary: dict, wall: float) -> dict:
    """One seed's line from a demo's metrics.json (or run_demo's return value)."""
    rows = {(r["system"], r["split"]): r for r in summary["rows"]}
    memory = summary["memory"]
    return {"seed": summary["seed"], "n_test": rows["majority", "test"]["n"],
            "n_test_patients": rows["majority", "test"]["n_patients"],
            **{name: rows[name, "test"]["f1"] if (name, "test") in rows else None
               for name in ("majority", "zero_shot", "fine_tuned")},
            "margin": summary["margin_in_domain_f1"]["value"],
            # demos before the per-reference margins and the real-model recipe: absent
            "margins": summary.get("margins_in_domain_f1"),
            "question_prior": ((summary.get("question_prior_f1") or {}).get("test")
                               or {}).get("f1"),
            "base": (summary.get("model") or {}).get("base", "tiny"),
            "fine_tuned_served_as": (summary.get("model") or {}).get("fine_tuned_served_as"),
            "cross": {name: rows[name, "test_cross"]["f1"] for name in ("majority",
                                                                         "fine_tuned")},
            "n_cross": rows["majority", "test_cross"]["n"],
            "wall_s": round(wall, 1), "timings_s": summary["timings_s"],
            # metrics.json of demos before per-stage memory had the system view only
            "memory_gib": memory.get("peak_gib") or {
                "processes": float("nan"), "system": memory["peak_above_start_gib"]},
            "memory_by_stage_gib": memory.get("by_stage_gib"),
            "memory_top_by_stage": memory.get("top_by_stage"),
            # metrics.json of demos before the machine was recorded: None
            "machine": summary.get("machine")}


def peak_processes(rows: list[dict]) -> list[str]:
    """A note per seed: the largest processes at its highest stage peak."""
    from medray.demo.memory import largest_at_peak

    notes = []
    for r in rows:
        found = largest_at_peak({"by_stage_gib": r.get("memory_by_stage_gib") or {},
                                 "top_by_stage": r.get("memory_top_by_stage") or {}})
        if found:
            stage, top = found
            notes.append(f"seed {r['seed']}: at the peak of '{stage}' the largest processes "
                         "were " + ", ".join(f"{p['process']} {p['pss_gib']:.2f} GiB"
                                              for p in top) + " (PSS)")
    return notes


def print_table(rows: list[dict], need: float, label: str) -> bool:
    def f1(m: dict | None) -> str:
        if m is None:  # a run with eval.zero_shot=false
            return "not run"
        return f"{m['mean']:.3f} [{m['ci95'][0]:.3f}, {m['ci95'][1]:.3f}]"

    print(f"\nF1 medqaro mode, 95% CI patient bootstrap; {label}")
    print(f"{'seed':>4} {'n (pat.)':>9} {'majority':>21} {'zero-shot':>21} "
          f"{'fine-tuned':>21} {'margin':>7} {'cross ft vs maj':>15} {'wall':>7} "
          f"{'mem GiB (procs/sys)':>19}")
    for r in rows:
        cross = f"{r['cross']['fine_tuned']['mean']:.3f} vs {r['cross']['majority']['mean']:.3f}"
        mem = f"{r['memory_gib']['processes']:.2f} / {r['memory_gib']['system']:.2f}"
        print(f"{r['seed']:>4} {r['n_test']:>5} ({r['n_test_patients']:>2}) "
              f"{f1(r['majority']):>21} {f1(r['zero_shot']):>21} {f1(r['fine_tuned']):>21} "
              f"{r['margin']:>+7.3f} {cross:>15} {r['wall_s'] / 60:>5.1f}min {mem:>19}")
    from medray.demo.machine import machine_line

    for line in dict.fromkeys(machine_line(r["machine"]) if r.get("machine")
                              else "Machine: not recorded" for r in rows):
        print(line)
    ok = all(r["margin"] >= need and r["cross"]["fine_tuned"]["mean"]
             > r["cross"]["majority"]["mean"] for r in rows)
    print(f"margin >= {need} and fine-tuned above majority cross-domain on every seed: "
          f"{'yes' if ok else 'NO'}")
    return ok


def write_demo_results(rows: list[dict], need: float) -> None:
    """docs/results/demo.json (demo_smollm2.json for the real-model recipe): the table above,
    rendered by bench/render_results.py."""
    from _results import write_results

    def wall(r: dict) -> str:
        return f"{r['wall_s'] / 60:.1f} min"

    def minutes(rows: list[dict]) -> str:
        walls = sorted(r["wall_s"] / 60 for r in rows)
        return (f"{walls[0]:.0f} min" if len(walls) == 1 or round(walls[0]) == round(walls[-1])
                else f"{walls[0]:.0f}-{walls[-1]:.0f} min")

    def spread(values: list[float]) -> str:
        return (f"{values[0]:+.3f}" if len(values) == 1
                else f"{min(values):+.3f} to {max(values):+.3f}")

    cross = [r["cross"]["fine_tuned"]["mean"] - r["cross"]["majority"]["mean"] for r in rows]
    above = [str(r["seed"]) for r, c in zip(rows, cross, strict=True) if c > 0]
    seeds = ", ".join(str(r["seed"]) for r in rows)
    base = rows[0].get("base", "tiny")
    real = base != "tiny"
    prior = [r["fine_tuned"]["mean"] - r["question_prior"] for r in rows
             if r.get("question_prior") is not None and r["fine_tuned"]]
    zero = [r["fine_tuned"]["mean"] - r["zero_shot"]["mean"] for r in rows
            if r["zero_shot"] and r["fine_tuned"]]
    versus = (f", {spread(zero)} over zero-shot and {spread(prior)} over the question-text "
              "prior" if real and zero and prior else "")
    write_results("demo_smollm2" if real else "demo", {
        "headline": ("`medray demo --model smollm2` fine-tunes SmolLM2-135M-Instruct"
                     if real else "`make demo` fine-tunes the tiny model") + " to "
                    f"{spread([r['margin'] for r in rows])} F1 over the majority baseline "
                    f"on held-out patients{versus} (required: {need}) "
                    f"and {spread(cross)} cross-domain (seed{'s' if len(rows) > 1 else ''} "
                    f"{seeds}), in {minutes(rows)} end to end, at most "
                    f"{max(r['memory_gib']['processes'] for r in rows):.1f} GiB of memory",
        "tables": [{"title": "F1 (medqaro mode) with 95% patient-bootstrap CIs: in-domain "
                             f"test ({rows[0]['n_test']} questions of "
                             f"{rows[0]['n_test_patients']} patients) and cross-domain "
                             f"({rows[0]['n_cross']} questions)",
                    "columns": ["seed", "majority", "zero-shot", "fine-tuned", "margin",
                                "question-text prior", "cross-domain fine-tuned",
                                "cross-domain majority", "wall",
                                "peak GiB (demo processes / system)"],
                    "rows": [[r["seed"], r["majority"], r["zero_shot"], r["fine_tuned"],
                              f"{r['margin']:+.3f}",
                              "–" if r.get("question_prior") is None
                              else f"{r['question_prior']:.3f}", r["cross"]["fine_tuned"],
                              r["cross"]["majority"], wall(r),
                              f"{r['memory_gib']['processes']:.2f} / "
                              f"{r['memory_gib']['system']:.2f}"] for r in rows]}],
        "notes": [f"fine-tuned above majority cross-domain on {len(above)} of {len(rows)} "
                  f"seed(s) ({', '.join(above) or 'none'})",
                  "wall time is the demo's own total; memory is the peak summed PSS of the "
                  "demo's processes and system memory in use above the start",
                  *[f"seed {r['seed']}: the fine-tuned row served "
                    + ("merged into the base" if r["fine_tuned_served_as"] == "merged" else
                       "as a LoRA adapter on the base") for r in rows
                    if r.get("fine_tuned_served_as")],
                  *peak_processes(rows)],
        "rows": rows,
    }, command=shlex.join(["bench/demo_margin.py", *sys.argv[1:]]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--json", help="also write the per-seed results here")
    ap.add_argument("--from-json", nargs="+", metavar="FILE",
                    help="print the table of earlier --json results (runs nothing)")
    ap.add_argument("--from-demo", nargs="+", metavar="DIR",
                    help="print the table of finished `medray demo --output DIR` runs (their "
                         "metrics.json; wall time = the demo's own total)")
    ap.add_argument("--keep", help="keep each seed's demo output under KEEP/seed-S")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="override the recipe, e.g. train.optim.lr=5e-3 pretrain.steps=200")
    args = ap.parse_args()
    from medray.demo import load_demo_config

    need = load_demo_config(args.config, args.set).eval.min_margin
    if args.from_json or args.from_demo:
        rows = [r for f in args.from_json or [] for r in json.loads(Path(f).read_text())]
        for d in args.from_demo or []:
            summary = json.loads((Path(d) / "metrics.json").read_text())
            rows.append(row_from_summary(summary, summary["timings_s"]["total"]))
        rows = sorted(rows, key=lambda r: r["seed"])
        print_table(rows, need, f"from {[*(args.from_json or []), *(args.from_demo or [])]}")
        write_demo_results(rows, need)
        return
    rows = []
    for seed in args.seeds:
        if args.keep:
            rows.append(run_seed(seed, Path(args.keep) / f"seed-{seed}", args.config, args.set))
        else:
            with tempfile.TemporaryDirectory(prefix=f"demo-margin-s{seed}-") as tmp:
                rows.append(run_seed(seed, Path(tmp), args.config, args.set))
        print(json.dumps(rows[-1]), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))
    print_table(rows, need, f"config {args.config}; overrides {args.set}")
    write_demo_results(rows, need)


if __name__ == "__main__":
    main()
