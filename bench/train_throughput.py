"""Training-input benchmark: ratios measured side by side in one run (tiny model, CPU).

1. Useful (non-padding) tokens per second of forward + backward + AdamW step with LoRA
   on the tiny Llama, for MedQARo-shaped example lengths (epicrisis lengths log-normal
   with the paper's mean 7,829 / min 207 / max 34,247 tokens, trimmed to the 2,048-token
   budget, then scaled to the bench budget N so the shape of the trimmed distribution is
   kept), comparing
     reference: every example padded to N, batch 1 (the reference notebooks);
     pad:       dynamic padding, batch B;
     group:     dynamic padding with length grouping, batch B;
     pack:      several examples per N-token row (block-diagonal attention), B rows.
   Every mode computes the loss as training does (medray.train.step.answer_loss).
2. Tokenisation time of the synthetic MedQARo data at 1x, 4x, 16x (more patients):
   each epicrisis tokenised once and examples assembled from ids (medray) vs the whole
   prompt text tokenised once per example (reference).
3. The loss: logits for every position (the model's own `labels=` path) vs only the
   positions that have a target (what training runs), same batches: step time, and the
   logit values computed per step (positions x vocabulary: the memory the projection and
   its gradient take, which on a long epicrisis with a large vocabulary is gigabytes).
4. Where epicrises are tokenised for training (medray.train.data.tokenize_contexts):
   in the driver's process vs a Ray Data actor pool on a local Ray cluster of this
   machine's CPUs, at 1x and 16x the patients, and which one medray picks.

    flock /tmp/medray-heavy.lock .venv/bin/python bench/train_throughput.py
"""

from __future__ import annotations

import argparse
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PAPER_BUDGET = 2048


def medqaro_lengths(n: int, budget: int, seed: int,
                    paper_budget: int = PAPER_BUDGET) -> list[tuple[int, int]]:
    """(prompt+context tokens, answer tokens) pairs shaped like MedQARo at `budget`."""
    from _medqaro_rows import draw_lengths

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        epicrisis, question, answer = draw_lengths(rng)
        total = min(paper_budget, epicrisis + question + 8 + answer + 1)
        scaled = max(answer + 4, round(total * budget / paper_budget))
        out.append((scaled - answer - 1, answer + 1))
    return out


def rows_from_lengths(lengths: list[tuple[int, int]], vocab: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for prompt, target in lengths:
        ids = [rng.randrange(4, vocab) for _ in range(prompt + target)]
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


def throughput(model_dir: str, rows: list[dict], mode: str, budget: int, batch: int,
               threads: int, loss_mode: str = "answer") -> dict:
    import torch
    from peft import LoraConfig, get_peft_model

    from medray.models import load_model_and_tokenizer
    from medray.train.collate import micro_batches, model_inputs, pad_batch
    from medray.train.step import answer_loss

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer(model_dir, "fp32")
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05,
                                             target_modules=["q_proj", "k_proj", "v_proj",
                                                             "o_proj"], task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    if mode == "reference":  # pad every example to the budget, batch 1
        batches = []
        for r in rows:
            b = pad_batch([r], tok.pad_token_id)
            extra = budget - b["input_ids"].shape[1]
            for k, v in (("input_ids", tok.pad_token_id), ("labels", -100),
                         ("attention_mask", 0)):
                b[k] = torch.nn.functional.pad(b[k], (0, extra), value=v)
            batches.append(b)
    else:
        batches = list(micro_batches(rows, batch_size=batch, pad_id=tok.pad_token_id,
                                     mode=mode, max_len=budget, window=16))
    useful = sum(b["num_tokens"] for b in batches)
    computed = sum(b["input_ids"].numel() for b in batches)
    model.train()
    t0 = time.perf_counter()
    logits = 0
    for b in batches:
        inputs = model_inputs(b)
        if loss_mode == "full":
            loss = model(**inputs, use_cache=False).loss
            logits += inputs["input_ids"].numel()
        else:
            summed, n = answer_loss(model, b, torch.device("cpu"))
            loss = summed / n
            kept = int((inputs["labels"][:, 1:] != -100).any(dim=0).sum())
            logits += inputs["input_ids"].shape[0] * kept
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dt = time.perf_counter() - t0
    return {"mode": mode, "batches": len(batches), "useful_tokens": useful,
            "computed_tokens": computed, "seconds": dt, "useful_tok_s": useful / dt,
            "logit_values": logits * len(tok)}


def tokenisation(model_dir: str, data_dir: str, factors: list[int]) -> list[dict]:
    from medray.data.prepared import load_prepared
    from medray.models import load_tokenizer
    from medray.prompts.spec import PromptSpec
    from medray.prompts.text import medqaro_prompt, medqaro_target
    from medray.prompts.tokens import build_example, encode_context

    tok = load_tokenizer(model_dir)
    untrimmed = PromptSpec(context_tokens=100_000, reserve=0)
    data = load_prepared(data_dir)
    ex = data.examples
    contexts = dict(zip(data.contexts["context_id"], data.contexts["text"], strict=True))
    out = []
    for k in factors:
        # k times the patients: every epicrisis (and its questions) k times, distinct ids.
        t0 = time.perf_counter()
        for rep in range(k):
            ids = {f"{c}#{rep}": encode_context(tok, t) for c, t in contexts.items()}
            for q, a, c in zip(ex["question"], ex["answer"], ex["context_id"], strict=True):
                build_example(tok, q, a, ids[f"{c}#{rep}"], untrimmed)
        once = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(k):
            for q, a, c in zip(ex["question"], ex["answer"], ex["context_id"], strict=True):
                tok(medqaro_target(medqaro_prompt(q, contexts[c], "qea"), a))
        per_example = time.perf_counter() - t0
        out.append({"factor": k, "contexts": len(contexts) * k, "examples": len(ex) * k,
                    "once_per_epicrisis_s": once, "once_per_example_s": per_example,
                    "speedup": per_example / once})
    return out


def scaled_dataset(data_dir: Path, out: Path, k: int) -> Path:
    """A prepared dataset with k times the patients (every epicrisis and its questions k
    times, distinct ids), written with medray's own table names."""
    import shutil

    import pandas as pd

    from medray.data.prepared import CONTEXTS, EXAMPLES

    out.mkdir(parents=True, exist_ok=True)
    ex, ctx = pd.read_parquet(data_dir / EXAMPLES), pd.read_parquet(data_dir / CONTEXTS)
    copies = lambda df, cols: pd.concat(  # noqa: E731
        [df.assign(**{c: df[c] + f"#{r}" for c in cols}) for r in range(k)], ignore_index=True)
    copies(ex, ["id", "context_id"]).to_parquet(out / EXAMPLES)
    copies(ctx, ["context_id"]).to_parquet(out / CONTEXTS)
    shutil.copy(data_dir / "manifest.json", out / "manifest.json")
    return out


def tokenisation_placement(model_dir: str, data_dir: Path, work: Path,
                           factors: list[int]) -> list[dict]:
    import os

    import ray

    from medray.train.data import split_contexts, tokenise_in_process, tokenize_contexts

    cpus = os.cpu_count() or 1
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    splits = ["train", "val"]
    out = []
    try:
        for k in factors:
            data = scaled_dataset(data_dir, work / f"data-x{k}", k) if k > 1 else data_dir
            chars = int(split_contexts(data, splits)["text"].str.len().sum())
            times = {}
            for where, kwargs in (("in-process", {"cluster_cpus": 0}),
                                  ("pool", {"cluster_cpus": 1e9, "in_process_max_chars": 0})):
                t0 = time.perf_counter()
                table, _how = tokenize_contexts(data, model_dir, splits, concurrency=2, **kwargs)
                times[where] = time.perf_counter() - t0
            picked = "in-process" if tokenise_in_process(chars, cpus) else "pool"
            out.append({"factor": k, "contexts": len(table), "chars": chars, **times,
                        "picked": picked})
    finally:
        ray.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=96)
    ap.add_argument("--budget", type=int, default=256, help="bench context budget N")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--factors", default="1,4,16")
    args = ap.parse_args()

    from medray.data.prepare import prepare
    from medray.data.synth import write_medqaro
    from medray.models import build_tiny_model, corpus_from_prepared

    work = Path(tempfile.mkdtemp(prefix="medray-bench-"))
    data = prepare("medqaro", write_medqaro(work / "raw", seed=0, scale="small"), work / "data")
    del data
    model = str(build_tiny_model(work / "tiny", corpus_from_prepared(work / "data")))
    from medray.models import load_tokenizer

    vocab = len(load_tokenizer(model))
    tables: list[dict] = []
    for paper_budget in (2048, 8192):  # the paper's Phi-4 budgets: most vs fewer at N
        lengths = medqaro_lengths(args.examples, args.budget, 0, paper_budget)
        rows = rows_from_lengths(lengths, vocab, seed=0)
        at_budget = sum(1 for p, t in lengths if p + t >= args.budget) / len(lengths)
        print(f"# 1. training throughput: tiny Llama (hidden 128, 2 layers) + LoRA r=8, CPU "
              f"{args.threads} threads, {args.examples} MedQARo-shaped examples (trimmed at "
              f"{paper_budget:,} tokens, scaled to N={args.budget}; {at_budget:.0%} fill N), "
              f"batch {args.batch}; one pass each over the same examples")
        results = [throughput(model, rows, m, args.budget, args.batch, args.threads)
                   for m in ("reference", "pad", "group", "pack")]
        ref = results[0]["useful_tok_s"]
        print(f"{'mode':<10} {'batches':>7} {'useful tok':>10} {'computed':>9} {'pad %':>6} "
              f"{'s':>7} {'useful tok/s':>12} {'x reference':>11}")
        for r in results:
            pad = 1 - r["useful_tokens"] / r["computed_tokens"]
            print(f"{r['mode']:<10} {r['batches']:>7} {r['useful_tokens']:>10} "
                  f"{r['computed_tokens']:>9} {pad:>6.1%} {r['seconds']:>7.2f} "
                  f"{r['useful_tok_s']:>12.0f} {r['useful_tok_s'] / ref:>11.2f}")
        print()
        tables.append({"title": f"1. training throughput, {at_budget:.0%} of the examples fill "
                                f"N={args.budget} (trimmed at {paper_budget:,})",
                       "columns": ["mode", "useful tokens", "computed", "padding", "s",
                                   "useful tok/s", "x reference"],
                       "rows": [[r["mode"], r["useful_tokens"], r["computed_tokens"],
                                 f"{1 - r['useful_tokens'] / r['computed_tokens']:.1%}",
                                 r["seconds"], r["useful_tok_s"], r["useful_tok_s"] / ref]
                                for r in results]})

    factors = [int(x) for x in args.factors.split(",")]
    print("# 2. tokenisation: synthetic MedQARo (small), k x the patients, tiny BPE tokenizer,"
          " one process; medray = each epicrisis once + assembly from ids, reference = "
          "whole prompt text per example")
    print(f"{'factor':>6} {'epicrises':>9} {'examples':>8} {'once/epicrisis s':>16} "
          f"{'once/example s':>14} {'speed-up':>8}")
    tok_rows = tokenisation(model, str(work / "data"), factors)
    tables.append({"title": "2. tokenisation: each epicrisis once (medray) vs each prompt "
                            "(reference)",
                   "columns": ["factor", "epicrises", "examples", "once per epicrisis s",
                               "once per example s", "speed-up"],
                   "rows": [[r["factor"], r["contexts"], r["examples"],
                             r["once_per_epicrisis_s"], r["once_per_example_s"], r["speedup"]]
                            for r in tok_rows]})
    for r in tok_rows:
        print(f"{r['factor']:>6} {r['contexts']:>9} {r['examples']:>8} "
              f"{r['once_per_epicrisis_s']:>16.2f} {r['once_per_example_s']:>14.2f} "
              f"{r['speedup']:>8.1f}")

    print()
    print(f"# 3. the loss: logits at every position vs only where there is a target (what "
          f"training runs); group batching, batch {args.batch}, N={args.budget}, the same "
          f"examples as 1. (trimmed at {PAPER_BUDGET:,}), vocabulary {vocab:,}")
    lengths = medqaro_lengths(args.examples, args.budget, 0, PAPER_BUDGET)
    rows = rows_from_lengths(lengths, vocab, seed=0)
    full, answer = (throughput(model, rows, "group", args.budget, args.batch, args.threads,
                               loss_mode=m) for m in ("full", "answer"))
    print(f"{'loss':<18} {'s':>7} {'useful tok/s':>12} {'logit values':>14} {'x full':>7}")
    for name, r in (("every position", full), ("target positions", answer)):
        print(f"{name:<18} {r['seconds']:>7.2f} {r['useful_tok_s']:>12.0f} "
              f"{r['logit_values']:>14,} {r['useful_tok_s'] / full['useful_tok_s']:>7.2f}")
    print(f"logit values computed: {answer['logit_values'] / full['logit_values']:.1%} of the "
          "full projection's")
    tables.append({"title": "3. the loss: logits at every position vs target positions only",
                   "columns": ["loss", "s", "useful tok/s", "logit values", "x full"],
                   "rows": [[name, r["seconds"], r["useful_tok_s"], r["logit_values"],
                             r["useful_tok_s"] / full["useful_tok_s"]]
                            for name, r in (("every position", full),
                                            ("target positions", answer))]})

    print()
    print("# 4. where training tokenises the epicrises of train+val (each once): in the "
          "driver's process vs a Ray Data actor pool (2 actors) on a local Ray cluster of "
          f"this machine's {__import__('os').cpu_count()} CPUs; start-up included")
    print(f"{'factor':>6} {'epicrises':>9} {'characters':>11} {'in-process s':>12} "
          f"{'pool s':>7} {'pool/in-process':>15} {'medray picks':>12}")
    placement = tokenisation_placement(model, work / "data", work, [1, 16])
    for r in placement:
        print(f"{r['factor']:>6} {r['contexts']:>9} {r['chars']:>11,} {r['in-process']:>12.2f} "
              f"{r['pool']:>7.2f} {r['pool'] / r['in-process']:>15.2f} {r['picked']:>12}")
    tables.append({"title": "4. where training tokenises: in-process vs a 2-actor Ray Data pool "
                            "(start-up included)",
                   "columns": ["factor", "epicrises", "characters", "in-process s", "pool s",
                               "medray picks"],
                   "rows": [[r["factor"], r["contexts"], r["chars"], r["in-process"], r["pool"],
                             r["picked"]] for r in placement]})
    ratios = [row[-1] for t in tables[:2] for row in t["rows"][1:]]
    from _results import write_results

    write_results("train_throughput", {
        "headline": f"batched training input gives {min(ratios):.2f}-{max(ratios):.2f}x the "
                    "useful tokens/s of the reference's padded batch of 1, and tokenising each "
                    f"epicrisis once is {min(r['speedup'] for r in tok_rows):.1f}-"
                    f"{max(r['speedup'] for r in tok_rows):.1f}x faster than each prompt",
        "tables": tables,
        "notes": ["each mode's pass over the examples takes about a second, so these ratios "
                  "move by a tenth or so between runs"],
    }, command=shlex.join(["bench/train_throughput.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
