"""Does the demo beat the majority baseline by >= 0.10 F1 on held-out patients, per seed?

Runs `medray demo` itself (medray.demo.run_demo: synthetic data, tiny model, pre-training,
Ray Train 2 workers DeepSpeed ZeRO-2 LoRA, Ray Serve + vLLM, evaluation actors, report)
for several seeds (default 0 1 2; a seed changes the synthetic data, the model init and
the training order) and prints, per seed, F1 on the in-domain TEST split (medqaro mode:
set-based token F1 after lowercasing, ASCII-punctuation removal, whitespace collapse; per
example, then averaged; 95% CI by patient bootstrap) of the majority baseline, the
zero-shot base and the fine-tuned model, the margin fine-tuned - majority, the demo's
wall time and its peak memory above the level at start.

Run alone (it starts its own local Ray unless RAY_ADDRESS is set):
    flock /tmp/medray-heavy.lock .venv/bin/python bench/demo_margin.py [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_seed(seed: int, work: Path, config: str, overrides: list[str]) -> dict:
    from rich.console import Console

    from medray.demo import run_demo

    summary = run_demo(work / "demo", seed=seed, config=Path(config), overrides=overrides,
                       console=Console(stderr=True))
    rows = {(r["system"], r["split"]): r for r in summary["rows"]}
    return {"seed": seed, "n_test": rows["majority", "test"]["n"],
            "n_test_patients": rows["majority", "test"]["n_patients"],
            **{name: rows[name, "test"]["f1"] for name in ("majority", "zero_shot",
                                                          "fine_tuned")},
            "margin": summary["margin_in_domain_f1"]["value"],
            "total_s": summary["timings_s"]["total"], "timings_s": summary["timings_s"],
            "memory_gib": summary["memory"]["peak_above_start_gib"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--json", help="also write the per-seed results here")
    ap.add_argument("--keep", help="keep each seed's demo output under KEEP/seed-S")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="override the recipe, e.g. train.optim.lr=5e-3 pretrain.steps=200")
    args = ap.parse_args()
    from medray.demo import load_demo_config

    need = load_demo_config(args.config, args.set).eval.min_margin
    rows = []
    for seed in args.seeds:
        if args.keep:
            rows.append(run_seed(seed, Path(args.keep) / f"seed-{seed}", args.config, args.set))
        else:
            with tempfile.TemporaryDirectory(prefix=f"demo-margin-s{seed}-") as tmp:
                rows.append(run_seed(seed, Path(tmp), args.config, args.set))
        print(json.dumps(rows[-1]), flush=True)

    def f1(m: dict) -> str:
        return f"{m['mean']:.3f} [{m['ci95'][0]:.3f}, {m['ci95'][1]:.3f}]"

    print(f"\nF1 medqaro mode, in-domain test split, 95% CI patient bootstrap; config "
          f"{args.config}; overrides {args.set}")
    print(f"{'seed':>4} {'n (pat.)':>9} {'majority':>21} {'zero-shot':>21} "
          f"{'fine-tuned':>21} {'margin':>7} {'total_s':>7} {'mem_GiB':>7}")
    for r in rows:
        print(f"{r['seed']:>4} {r['n_test']:>5} ({r['n_test_patients']:>2}) "
              f"{f1(r['majority']):>21} {f1(r['zero_shot']):>21} {f1(r['fine_tuned']):>21} "
              f"{r['margin']:>+7.3f} {r['total_s']:>7.0f} {r['memory_gib']:>7}")
    ok = all(r["margin"] >= need for r in rows)
    print(f"margin >= {need} on every seed: {'yes' if ok else 'NO'}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
