"""Scoring speed: `medray score` machinery vs the reference's per-example loop, in one run.

    .venv/bin/python bench/score_speed.py [--n 20000] [--naive-sample 300] [--warm-cache]

OURS: the full `score_generative` path on N synthetic MedQARo-like pairs (F1, EM, BLEU,
METEOR per example + sacrebleu BLEU/chrF + 1,000-resample patient bootstrap CIs), with the
WordNet synonym disk cache COLD (a fresh $MEDRAY_CACHE) unless --warm-cache.

NAIVE: the reference notebook's loop, scoring one example at a time and rebuilding the
METEOR scorer for every item, as `evaluate.load("meteor")` + `.compute()` do per call:
re-import the metric module (fresh Porter stemmer), write the (prediction, reference) batch
to an Arrow cache file under a file lock, read it back, tokenise without caching, score,
delete the file; plus a fresh SmoothingFunction for BLEU and the reference F1/EM code.
No network is touched (the real `evaluate.load` would also query the Hub). WordNet itself
is loaded once per process, as in the reference. NAIVE runs on a sample and is scaled to N
(per-item cost is flat), so both numbers come from this one run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import re
import shlex
import string
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VOCAB = ("pacientul cancer mamar stâng drept stadiul pT2N1M0 IIB luni ciclul radioterapie "
         "chimioterapie tumoră ductal invaziv carcinom operat mastectomie ianuarie martie "
         "ganglioni metastaze hepatice pulmonare docetaxel trastuzumab HER2 pozitiv negativ "
         "Ki67 grad histologic ecografie biopsie").split()


def synthetic_pairs(n: int, seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """~2/3 binary Da/Nu answers, the rest short spans; ~50% exactly right; 130 per patient."""
    rng = random.Random(seed)
    vocab = VOCAB + ["".join(rng.choices("abcdefgilmnoprstuăîșț", k=rng.randint(4, 10)))
                     for _ in range(4000)]
    preds, refs, patients = [], [], []
    for i in range(n):
        if rng.random() < 0.6:
            ref = rng.choice(["Nu", "Nu", "Da"])
        else:
            ref = " ".join(rng.choices(vocab, k=rng.choice([1, 1, 2, 3, 4, 6, 9])))
        r = rng.random()
        pred = ref if r < 0.5 else (
            " ".join(rng.choices(vocab, k=rng.randint(1, 5))) if r < 0.8 else rng.choice(
                ["Nu", "Da", ref.upper(), ref + " luni"]))
        preds.append(pred)
        refs.append(ref)
        patients.append(f"p{i // 130}")
    return preds, refs, patients


def ours(preds: list[str], refs: list[str], patients: list[str], workers: int | None) -> dict:
    import pandas as pd

    from medray.eval.metrics.aggregate import score_generative

    table = pd.DataFrame({"prediction": preds, "answers": [[r] for r in refs],
                          "patient_id": patients})
    return score_generative(table, mode="medqaro", workers=workers)


def naive(preds: list[str], refs: list[str]) -> list[dict]:
    import pyarrow as pa
    from filelock import FileLock
    from nltk.tokenize import word_tokenize
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    def normalize_text(text):
        text = text.lower()
        text = re.sub(f"[{re.escape(string.punctuation)}]", "", text)
        return " ".join(text.split())

    def compute_f1(prediction, ground_truth):
        pred_tokens = normalize_text(prediction).split()
        truth_tokens = normalize_text(ground_truth).split()
        num_same = len(set(pred_tokens) & set(truth_tokens))
        if num_same == 0:
            return 0.0
        precision, recall = num_same / len(pred_tokens), num_same / len(truth_tokens)
        return 2 * (precision * recall) / (precision + recall)

    cache = Path(tempfile.mkdtemp(prefix="naive-meteor-"))
    out = []
    for pred, ref in zip(preds, refs, strict=True):
        # evaluate.load("meteor"): import the metric module afresh, build a new scorer.
        import nltk.translate.meteor_score as ms

        ms = importlib.reload(ms)
        with FileLock(str(cache / "meteor.lock")):
            table = pa.table({"predictions": [pred], "references": [ref]})
            path = cache / f"{uuid.uuid4().hex}.arrow"
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
            back = pa.ipc.open_stream(pa.memory_map(str(path))).read_all()
            path.unlink()
        p, r = back["predictions"][0].as_py(), back["references"][0].as_py()
        meteor = ms.single_meteor_score(word_tokenize(r, preserve_line=True),
                                        word_tokenize(p, preserve_line=True),
                                        alpha=0.9, beta=3, gamma=0.5)
        bleu = sentence_bleu([word_tokenize(ref, preserve_line=True)],
                             word_tokenize(pred, preserve_line=True),
                             smoothing_function=SmoothingFunction().method4)
        out.append({"f1": compute_f1(pred, ref),
                    "em": int(normalize_text(pred) == normalize_text(ref)),
                    "bleu": bleu, "meteor": meteor})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--naive-sample", type=int, default=300)
    ap.add_argument("--workers", type=int, default=0, help="0 = auto")
    ap.add_argument("--warm-cache", action="store_true")
    args = ap.parse_args()
    if not args.warm_cache:
        os.environ["MEDRAY_CACHE"] = tempfile.mkdtemp(prefix="medray-cache-")
    preds, refs, patients = synthetic_pairs(args.n)

    t0 = time.perf_counter()
    result = ours(preds, refs, patients, args.workers or None)
    t_ours = time.perf_counter() - t0

    from nltk.corpus import wordnet

    if result["meteor_wordnet"]:
        wordnet.ensure_loaded()  # the reference process has WordNet loaded once, too
    k = min(args.naive_sample, args.n)
    idx = random.Random(1).sample(range(args.n), k)
    t0 = time.perf_counter()
    rows = naive([preds[i] for i in idx], [refs[i] for i in idx])
    t_naive_item = (time.perf_counter() - t0) / k
    t_naive = t_naive_item * args.n

    # Same numbers on the sample (sanity: the fast path is the reference arithmetic).
    from medray.eval.metrics.generative import GenerativeScorer

    check = GenerativeScorer("medqaro")
    worst = max(abs(check.score(preds[i], refs[i])[m] - row[m])
                for i, row in zip(idx, rows, strict=True) for m in ("f1", "em", "bleu", "meteor"))
    cpus = len(os.sched_getaffinity(0))
    print(f"n={args.n} pairs, mode medqaro, {cpus} CPUs, WordNet "
          f"{'on' if result['meteor_wordnet'] else 'absent'}, synonym cache "
          f"{'warm' if args.warm_cache else 'cold'}")
    print(f"ours : {t_ours:8.1f} s  (F1/EM/BLEU/METEOR + sacrebleu BLEU/chrF + 1000-resample "
          f"patient-bootstrap CIs)")
    print(f"naive: {t_naive:8.1f} s  ({t_naive_item * 1000:.2f} ms/item measured on {k} items, "
          f"scaled to {args.n}; per-item scorer rebuild)")
    print(f"ratio naive/ours: {t_naive / t_ours:.1f}x   "
          f"max |difference| on the sample: {worst:.2e}")
    print("means: " + ", ".join(f"{m}={v['mean']:.4f}" for m, v in result["metrics"].items()))
    from _results import write_results

    write_results("score_speed", {
        "headline": f"scoring {args.n:,} generated answers (F1, EM, BLEU, METEOR, sacrebleu, "
                    f"bootstrap CIs) takes {t_ours:.1f} s, {t_naive / t_ours:.1f}x faster than "
                    "the reference's per-example loop, "
                    + ("with the same numbers" if worst < 1e-9
                       else f"largest difference {worst:.1e}"),
        "tables": [{"title": f"{args.n:,} synthetic MedQARo-like pairs, medqaro mode, {cpus} "
                             f"CPUs, synonym cache {'warm' if args.warm_cache else 'cold'}",
                    "columns": ["path", "seconds", "ms per item", "x medray"],
                    "rows": [["medray (`medray score`)", t_ours, t_ours / args.n * 1000, 1.0],
                             [f"reference loop (measured on {k} items, scaled)", t_naive,
                              t_naive_item * 1000, t_naive / t_ours]]}],
        "notes": [f"largest difference between the two on the sample: {worst:.2e}",
                  "WordNet " + ("on" if result["meteor_wordnet"] else "absent")],
        "n": args.n, "ours_s": t_ours, "naive_s": t_naive, "ratio": t_naive / t_ours,
        "max_difference": worst, "means": {m: v["mean"] for m, v in result["metrics"].items()},
    }, command=shlex.join(["bench/score_speed.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
