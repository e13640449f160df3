"""Training against the reference recipe, side by side in one run, on SmolLM2-135M-Instruct:
useful tokens/s, answer tokens/s and examples/s of `medray train` and of the MedQARo
notebooks' Hugging Face `Trainer` + PEFT, at context budgets N = 512 and 1,024.

    flock /tmp/medray-heavy.lock .venv/bin/python bench/train_peer.py [--model DIR]

Both sides: plain LoRA r=8, alpha=16, dropout 0.05 on q,k,v,o; float32; AdamW; one
example (reference) or one row (medray) per optimiser step (no accumulation); all the
machine's cores.
- reference: `transformers.Trainer` on the text f"Intrebare: {q} Context: {e} Raspuns:" +
  " " + answer, the epicrisis e trimmed to N-100 tokens (encode, truncate, decode), padded
  to N (`padding="max_length"`), labels = input_ids (loss on every position, pads too),
  batch 1, in this process with torch on every core.
- medray: `run_training` (what `medray train` runs) with 1 Ray Train worker holding every
  core, DeepSpeed ZeRO-2 as medray configures it on CPU, each epicrisis tokenised once,
  loss on answer+EOS only, the model's chat template; `data.batching: pack` (examples
  packed into N-token rows, Q+E+A like the reference) and `prefix` (E+Q+A: a patient's
  questions share one row, the epicrisis computed once for all of them, each example's
  loss the one it has alone; up to 64 examples searched, rows of up to 4N tokens).

Data: synthetic MedQARo (seed 0) with long epicrises (600-1,500 words, ~1,500-3,700
SmolLM2 tokens), so every example fills N: the same prepared examples for both sides.

Metric: useful tokens = each example's own non-padding tokens at budget N (its prompt and
answer as it would be alone; prefix rows count the shared epicrisis once per example),
summed over the examples trained in a window of steps after the first --warm-up ones,
divided by that window's wall time (start-up, the first steps, validation and checkpoints
left out). medray's per-step counts and times are its TensorBoard step scalars
(train/examples, train/example_tokens, train/target_tokens and their wall times); the
reference's come from a Trainer callback. Answer tokens: medray's loss targets
(answer + EOS); the reference's answer tokens (its loss covers every position). Target:
medray >= 2x the reference's useful tokens/s at N = 1,024.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lm_eval_task import OFFLINE, smollm2_checkpoint  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
TARGET_RATIO, TARGET_BUDGET = 2.0, 1024
GROUP_WINDOW = 64  # examples searched for a shared epicrisis: two or three patients


def synth_data(work: Path, train_patients: int) -> Path:
    from medray.data.prepare import prepare
    from medray.data.synth import write_medqaro

    raw = write_medqaro(work / "raw", seed=0, scale="small", words=(600, 1500),
                        n_patients={"train": train_patients, "val": 1, "test": 1,
                                    "test_cross": 1})
    prepare("medqaro", raw, work / "data")
    return work / "data"


def window(times: list[float], examples: list[int], useful: list[int], answer: list[int],
           warm: int) -> dict:
    """Throughput over the steps after the first `warm` (times: wall time at each step's
    end): the examples, tokens of steps warm+1..last over times[last] - times[warm-1]."""
    if len(times) <= warm:
        raise RuntimeError(f"{len(times)} steps: too few for {warm} warm-up steps")
    span = times[-1] - times[warm - 1]
    n, tok, ans = sum(examples[warm:]), sum(useful[warm:]), sum(answer[warm:])
    return {"steps": len(times) - warm, "seconds": span, "examples": n, "useful_tokens": tok,
            "answer_tokens": ans, "examples_s": n / span, "useful_tok_s": tok / span,
            "answer_tok_s": ans / span}


# ----------------------------------------------------------------------- reference


def reference_examples(tok: object, rows: list[dict], contexts: dict, budget: int) -> list[dict]:
    """The notebooks' examples: epicrisis trimmed to N-100 tokens, text padded to N, labels =
    input_ids (pads included). `useful`: non-padding tokens; `answer`: the answer's."""
    out = []
    for r in rows:
        trimmed = tok.decode(tok.encode(contexts[r["context_id"]], truncation=True,
                                        max_length=budget - 100), skip_special_tokens=True)
        prompt = f"Intrebare: {r['question']} Context: {trimmed} Raspuns:"
        enc = tok(prompt + " " + r["answer"], truncation=True, max_length=budget,
                  padding="max_length")
        useful = sum(enc["attention_mask"])
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                    "labels": list(enc["input_ids"]), "useful": useful,
                    "answer": useful - min(useful, len(tok(prompt)["input_ids"]))})
    return out


def run_reference(model: str, rows: list[dict], contexts: dict, budget: int, steps: int,
                  warm: int, work: Path) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    torch.set_num_threads(os.cpu_count() or 1)
    tok = AutoTokenizer.from_pretrained(model)
    examples = reference_examples(tok, rows[:steps], contexts, budget)
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    peft = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05,
                                           target_modules=TARGETS, task_type="CAUSAL_LM"))
    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
            stamps.append(time.perf_counter())

    args = TrainingArguments(
        output_dir=str(work / f"reference-{budget}"), per_device_train_batch_size=1,
        gradient_accumulation_steps=1, learning_rate=2e-5, lr_scheduler_type="cosine",
        warmup_steps=0, max_steps=steps, use_cpu=True, report_to="none",
        save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0,
        dataloader_num_workers=0, remove_unused_columns=False)
    data = [{k: e[k] for k in ("input_ids", "attention_mask", "labels")} for e in examples]
    Trainer(model=peft, args=args, train_dataset=data, callbacks=[Stamp()]).train()
    out = window(stamps, [1] * len(stamps), [e["useful"] for e in examples],
                 [e["answer"] for e in examples], warm)
    out["padding"] = 1 - sum(e["useful"] for e in examples) / (budget * len(examples))
    return out


# -------------------------------------------------------------------------- medray


def medray_config(model: str, data: Path, budget: int, batching: str,
                  max_examples: int | None) -> object:
    from medray.train.config import TrainConfig

    return TrainConfig.model_validate({
        "name": f"peer-{batching}-{budget}",
        "model": {"name_or_path": model, "dtype": "fp32"},
        "lora": {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": TARGETS},
        "data": {"path": str(data), "batching": batching, "group_window": GROUP_WINDOW,
                 "max_train_examples": max_examples, "max_val_examples": 1,
                 "val_generate_examples": 0, "tokenize_actors": 1},
        "prompt": {"format": "eqa" if batching == "prefix" else "qea",
                   "context_tokens": budget, "max_new_tokens": 10},
        "optim": {"lr": 2e-5, "warmup_steps": 0, "micro_batch_size": 1, "grad_accum": 1,
                  "epochs": 1},
        "deepspeed": {"stage": 2},
        "scaling": {"num_workers": 1, "use_gpu": False, "cpus_per_worker": os.cpu_count() or 1},
        "checkpoint": {"num_to_keep": 1, "export": "last"}})


def step_history(tensorboard: Path) -> dict[str, list]:
    """Per optimiser step, from the run's TensorBoard events: wall time and counts."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tensorboard), size_guidance={"scalars": 0})
    acc.Reload()
    out: dict[str, list] = {}
    for tag in ("train/examples", "train/example_tokens", "train/target_tokens"):
        events = sorted(acc.Scalars(tag), key=lambda e: e.step)
        out[tag] = [int(e.value) for e in events]
        out["times"] = [e.wall_time for e in events]
    return out


def run_medray(model: str, data: Path, budget: int, batching: str, max_examples: int | None,
               warm: int, work: Path) -> dict:
    from medray.train.trainer import run_training

    out = work / f"medray-{batching}-{budget}"
    t0 = time.perf_counter()
    metrics = run_training(medray_config(model, data, budget, batching, max_examples), out,
                           log=lambda *a, **k: None, track=False)
    wall = time.perf_counter() - t0
    h = step_history(out / "tensorboard")
    res = window(h["times"], h["train/examples"], h["train/example_tokens"],
                 h["train/target_tokens"], warm)
    res.update(wall_s=wall, epoch_s=metrics["epochs"][0]["seconds"],
               total_steps=len(h["times"]))
    return res


# ---------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None,
                    help="SmolLM2 checkpoint (default: `medray model smollm2` into --work)")
    ap.add_argument("--work", default=None, help="folder kept between runs (default: temp)")
    ap.add_argument("--budgets", default="512,1024")
    ap.add_argument("--steps", type=int, default=8,
                    help="reference steps and medray pack examples per budget (the first "
                         "train examples by id)")
    ap.add_argument("--patients", type=int, default=5,
                    help="train patients; prefix batching trains all their questions")
    ap.add_argument("--warm-up", type=int, default=2, help="first steps left out of the window")
    args = ap.parse_args()
    for key in OFFLINE:
        os.environ.setdefault(key, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work = Path(args.work or tempfile.mkdtemp(prefix="medray-train-peer-"))
    work.mkdir(parents=True, exist_ok=True)
    model = smollm2_checkpoint(args.model, work / "smollm2")
    budgets = [int(b) for b in args.budgets.split(",")]

    from medray.data.prepared import load_prepared

    runs = work / f"runs-{int(time.time())}"
    data = synth_data(runs, args.patients)
    prepared = load_prepared(data)
    rows = prepared.split("train").sort_values("id").to_dict("records")
    contexts = dict(zip(prepared.contexts["context_id"], prepared.contexts["text"],
                        strict=True))
    if len(rows) < args.steps:
        raise SystemExit(f"{len(rows)} train examples: fewer than --steps {args.steps}")

    results: dict[int, dict[str, dict]] = {}
    for n in budgets:  # the reference first, before any Ray process shares the cores
        results[n] = {"reference": run_reference(model, rows, contexts, n, args.steps,
                                                 args.warm_up, runs)}
        print(f"N={n} reference: {results[n]['reference']}", flush=True)

    from medray.cluster import connect

    connect(None, min_cpus=medray_config(model, data, 8, "pack", 1).scaling.local_cpus(),
            log_to_driver=False)
    try:
        for n in budgets:
            results[n]["medray pack"] = run_medray(model, data, n, "pack", args.steps,
                                                   args.warm_up, runs)
            print(f"N={n} medray pack: {results[n]['medray pack']}", flush=True)
            results[n]["medray prefix"] = run_medray(model, data, n, "prefix", None,
                                                     args.warm_up, runs)
            print(f"N={n} medray prefix: {results[n]['medray prefix']}", flush=True)
    finally:
        import ray

        ray.shutdown()
    report(results, args, model)


def report(results: dict[int, dict[str, dict]], args: argparse.Namespace, model: str) -> None:
    cols = ["N", "system", "steps timed", "examples", "s", "examples/s", "useful tok/s",
            "answer tok/s", "x ref (useful)", "x ref (answer)", "x ref (examples)"]
    table = []
    print(f"\ntraining vs the reference recipe: {Path(model).name}, LoRA r=8 q,k,v,o, fp32, "
          f"{os.cpu_count()} CPUs; steady state: steps after the first {args.warm_up}")
    print(f"{'N':>5} {'system':<14} {'steps':>5} {'ex':>4} {'s':>6} {'ex/s':>6} "
          f"{'useful/s':>8} {'answer/s':>8} {'x useful':>8} {'x answer':>8} {'x ex':>6}")
    verdicts = []
    for n, by in results.items():
        ref = by["reference"]
        for name, r in by.items():
            x = [r[k] / ref[k] for k in ("useful_tok_s", "answer_tok_s", "examples_s")]
            table.append([n, name, r["steps"], r["examples"], r["seconds"], r["examples_s"],
                          r["useful_tok_s"], r["answer_tok_s"], *x])
            print(f"{n:>5} {name:<14} {r['steps']:>5} {r['examples']:>4} {r['seconds']:>6.1f} "
                  f"{r['examples_s']:>6.2f} {r['useful_tok_s']:>8.0f} {r['answer_tok_s']:>8.1f} "
                  f"{x[0]:>8.2f} {x[1]:>8.2f} {x[2]:>6.2f}")
            if n == TARGET_BUDGET and name != "reference":
                verdicts.append((name, x[0]))
    lines = []
    for name, x in verdicts:
        short = TARGET_RATIO - x
        miss = "" if short <= 0 else (f": misses the {TARGET_RATIO:.0f}x target by {short:.2f}x "
                                      f"({short / TARGET_RATIO:.0%})")
        lines.append(f"{name} at N={TARGET_BUDGET:,}: {x:.2f}x the reference's useful "
                     f"tokens/s{miss}")
    print("\n".join(lines))
    from _results import write_results

    best = max(verdicts, key=lambda v: v[1]) if verdicts else ("-", float("nan"))
    write_results("train_peer", {
        "headline": f"`medray train` ({best[0].removeprefix('medray ')} batching) trains "
                    f"{best[1]:.2f}x the useful tokens/s of the MedQARo notebooks' Trainer + "
                    f"PEFT recipe at N = {TARGET_BUDGET:,} (target {TARGET_RATIO:.0f}x)",
        "tables": [{"title": f"{Path(model).name}, LoRA r=8 alpha=16 on q,k,v,o, float32, "
                             f"{os.cpu_count()} CPUs, steady state (steps after the first "
                             f"{args.warm_up})",
                    "columns": cols, "rows": table}],
        "notes": lines + [
            "useful tokens: each example's own non-padding tokens at N (prefix rows count "
            "the shared epicrisis once per example); answer tokens: medray's answer+EOS "
            "targets, the reference's answer tokens",
            "reference: transformers Trainer + PEFT, text padded to N, loss on every "
            "position; medray: 1 Ray Train worker, DeepSpeed ZeRO-2, answer-only loss, chat "
            f"template, pack = Q+E+A rows of N, prefix = E+Q+A rows of up to 4N tokens "
            f"sharing the epicrisis ({GROUP_WINDOW} examples searched)",
            "few steps per system: read the ratios to about a tenth"],
        "raw": {str(n): by for n, by in results.items()},
    }, command=shlex.join(["bench/train_peer.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
