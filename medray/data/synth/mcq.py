"""Deterministic synthetic multiple-choice corpora: RoBiology-like and EuropeMedQA-like.

RoBiology (``train.json``, ``validation.json``, ``test.json``): single choice (4 options at
the olympiad, 5 at admission), group choice (4 statements, key by the group code table) and
multiple choice (5 options, key = sorted letters). Keys are derived from statements marked
true/false in ``mcq_text.BIO``, so they are always consistent; each kind has a few
question stems. Single-choice keys lean towards 'A' (40%). A few duplicate groups (shared
``dupe_id``) stay inside one split.

EuropeMedQA (``europemedqa.csv`` + ``images/*.png``): IT, FR, ES, PT items with five options
and the key on 'A' for ~90% of single-answer items (the bias the loader's shuffle undoes),
shared cases in [brackets], French multi-answer items ("A,C") with up to two images, and a
few items without a validated key (empty / "N/A").

Sizes: RoBiology small 90/24/24, paper 11,347/1,374/1,388 (the paper's splits).
EuropeMedQA small 12 valid items per country + 2 without a key; paper 1,000 per country +
20 without a key (the protocol gives no totals, so this is our choice).
"""

from __future__ import annotations

import json
import random
import struct
import uuid
import zlib
from pathlib import Path

import pandas as pd

from medray.data.schema import GROUP_CODES, LETTERS
from medray.data.synth import mcq_text as T
from medray.data.synth.medqaro import check_scale
from medray.io import atomic_directory

ROBIO_FILES = {"train": "train.json", "validation": "validation.json", "test": "test.json"}
ROBIO_SIZES = {"small": {"train": 90, "validation": 24, "test": 24},
               "paper": {"train": 11_347, "validation": 1_374, "test": 1_388}}
ROBIO_DUPE_GROUPS = {"small": {"train": 3, "validation": 1, "test": 1},
                     "paper": {"train": 120, "validation": 15, "test": 15}}
EMQ_COUNTRIES = (("IT", "it"), ("FR", "fr"), ("ES", "es"), ("PT", "pt"))
EMQ_SIZES = {"small": 12, "paper": 1_000}  # valid items per country
EMQ_NO_KEY = {"small": 2, "paper": 20}
EMQ_COLUMNS = ["questionID", "testyear", "numberintest", "picture_provided", "question_text",
               "picture_link", "option_a", "option_b", "option_c", "option_d", "option_e",
               "correct_option", "correct_fulltext", "language"]
SINGLE_KEY_WEIGHTS = (0.4, 0.2, 0.2, 0.2)  # RoBiology: 'A' over-represented
# Question stems per kind. Item uniqueness is over (question, set of options), and the
# statement bank alone holds fewer distinct option sets than the paper-scale splits need
# (about 1,700 single-choice sets for about 7,000 single-choice items).
STEMS = {
    "single-choice": ("Referitor la {topic}, alegeți afirmația corectă:",
                      "Alegeți afirmația corectă referitoare la {topic}:",
                      "Care dintre următoarele afirmații despre {topic} este corectă?",
                      "Precizați afirmația adevărată despre {topic}:",
                      "Identificați enunțul corect privind {topic}:",
                      "Despre {topic} este adevărat că:"),
    "group-choice": ("Referitor la {topic}, sunt corecte afirmațiile:",
                     "Despre {topic} sunt adevărate afirmațiile:",
                     "Privind {topic}, sunt corecte enunțurile:"),
    "multiple-choice": ("Referitor la {topic}, alegeți afirmațiile corecte:",
                        "Care dintre următoarele afirmații despre {topic} sunt corecte?",
                        "Alegeți enunțurile adevărate despre {topic}:"),
}
MAX_DRAWS_PER_ITEM = 50  # a corpus the bank cannot fill fails instead of looping forever


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


# ---------------------------------------------------------------- RoBiology
def _robio_item(rng: random.Random, stem_rng: random.Random) -> dict:
    # Olympiads have single and group choice; admission books single and multiple choice.
    kind = rng.choices(("single-choice", "group-choice", "multiple-choice"), (2, 1, 1))[0]
    olympiad = kind == "group-choice" or (kind == "single-choice" and rng.random() < 0.6)
    if olympiad:
        source, grade = "olimpiada", rng.choice(("VII", "IX", "X", "XI", "XII"))
        stage = rng.choice(("locala", "judeteana", "nationala"))
    else:
        source = rng.choice(("UMF Cluj", "UMF Timișoara") if kind == "multiple-choice"
                            else ("UMF Cluj", "UMF Timișoara", "UMF Brașov"))
        grade, stage = "facultate", "admitere"
    topic = rng.choice(sorted(T.BIO))
    true, false = T.BIO[topic]
    if kind == "single-choice":
        n = 4 if olympiad else 5
        weights = SINGLE_KEY_WEIGHTS if n == 4 else (0.4, 0.15, 0.15, 0.15, 0.15)
        key = rng.choices(range(n), weights=weights)[0]
        opts = rng.sample(false, n - 1)
        opts.insert(key, rng.choice(true))
        answer = LETTERS[key]
    elif kind == "group-choice":
        answer = rng.choice(LETTERS)
        truth = [i in GROUP_CODES[answer] for i in range(1, 5)]
        ts, fs = iter(rng.sample(true, 4)), iter(rng.sample(false, 4))
        opts = [next(ts) if t else next(fs) for t in truth]
    else:
        n_true = rng.choices((1, 2, 3, 4), weights=(1, 3, 3, 2))[0]
        truth = [True] * n_true + [False] * (5 - n_true)
        rng.shuffle(truth)
        ts, fs = iter(rng.sample(true, n_true)), iter(rng.sample(false, 5 - n_true))
        opts = [next(ts) if t else next(fs) for t in truth]
        answer = "".join(LETTERS[i] for i, t in enumerate(truth) if t)
    # Stems come from their own stream: the statements and keys drawn do not depend on them.
    question = stem_rng.choice(STEMS[kind]).format(topic=topic)
    return {"question": question, "type": kind, "options": [_cap(o) for o in opts],
            "grade": grade, "stage": stage, "year": str(rng.randint(2012, 2024)),
            "right_answer": answer, "source": source, "dupe_id": None}


def robiology_items(seed: int, scale: str) -> dict[str, list[dict]]:
    """Items per split, unique across the corpus except the planted duplicate groups."""
    check_scale(scale)
    rng, stem_rng = random.Random(f"robiology:{seed}"), random.Random(f"robiology-stem:{seed}")
    seen: set[tuple] = set()
    out: dict[str, list[dict]] = {}
    for split, size in ROBIO_SIZES[scale].items():
        n_groups = ROBIO_DUPE_GROUPS[scale][split]
        items: list[dict] = []
        draws = 0
        while len(items) < size - n_groups:
            draws += 1
            if draws > MAX_DRAWS_PER_ITEM * size:
                raise RuntimeError(f"synthetic RoBiology {scale!r}: the statement bank gave only "
                                   f"{len(items)} distinct {split} items of {size}")
            item = _robio_item(rng, stem_rng)
            sig = (item["question"], tuple(sorted(item["options"])))
            if sig not in seen:  # no accidental duplicate, in particular none across splits
                seen.add(sig)
                items.append(item)
        for src in rng.sample(items, n_groups):  # duplicate = same text and options
            src["dupe_id"] = str(uuid.UUID(int=rng.getrandbits(128), version=4))
            copy = dict(src, year=str(rng.randint(2012, 2024)),
                        stage=src["stage"] if src["stage"] == "admitere" else rng.choice(
                            ("locala", "judeteana", "nationala")))
            items.insert(rng.randrange(len(items) + 1), copy)
        counters: dict[tuple, int] = {}
        for item in items:  # numbering per test (source, year, stage, grade)
            test = (item["source"], item["year"], item["stage"], item["grade"])
            counters[test] = counters.get(test, 0) + 1
            item["question_number"] = str(counters[test])
            slug = item["source"].split()[-1].lower()
            item["id_in_source"] = f"{slug}-{item['year']}-{item['stage']}-{item['grade']}-" \
                                   f"{counters[test]}"
        order = ("question_number", "question", "type", "options", "grade", "stage", "year",
                 "right_answer", "source", "id_in_source", "dupe_id")
        out[split] = [{k: it[k] for k in order} for it in items]
    return out


def write_robiology(out_dir: Path | str, seed: int = 0, scale: str = "small",
                    force: bool = False) -> Path:
    """Write ``train.json``, ``validation.json``, ``test.json`` as the folder ``out_dir``."""
    check_scale(scale)
    out = Path(out_dir)
    with atomic_directory(out, force=force, command="data synth robiology") as tmp:
        for split, items in robiology_items(seed, scale).items():
            data = json.dumps(items, ensure_ascii=False, indent=1) + "\n"
            (tmp / ROBIO_FILES[split]).write_text(data, encoding="utf-8")
    return out


# ---------------------------------------------------------------- EuropeMedQA
def png_bytes(width: int, height: int, rng: random.Random) -> bytes:
    """A small valid RGB PNG (gradient + a random block), built with zlib only."""
    base = [rng.randrange(256) for _ in range(3)]
    x0, y0 = rng.randrange(width // 2), rng.randrange(height // 2)
    rows = []
    for y in range(height):
        row = bytearray([0])  # filter type 0
        for x in range(width):
            inside = x0 <= x < x0 + width // 3 and y0 <= y < y0 + height // 3
            row += bytes(255 - c if inside else (c + 3 * x + 2 * y) % 256 for c in base)
        rows.append(bytes(row))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(
            ">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"".join(rows), 9)) + chunk(b"IEND", b""))


def _emq_options(rng: random.Random, correct: str, pool: list[str]) -> tuple[list[str], str]:
    """Five options with the key on 'A' for ~90% of items."""
    opts = rng.sample([p for p in pool if p != correct], 4)
    pos = 0 if rng.random() < 0.9 else rng.randrange(1, 5)
    opts.insert(pos, correct)
    return opts, LETTERS[pos]


def _emq_country_items(rng: random.Random, cc: str, lang: str, n: int) -> list[dict]:
    stem_t, q_dx, q_tx, case_label = T.EMQ_TEMPLATES[lang]
    conds = sorted(T.CLINICAL)
    dx_pool = [T.CLINICAL[c][lang][1] for c in conds]
    tx_pool = [T.CLINICAL[c][lang][2] for c in conds]
    items: list[dict] = []
    while len(items) < n:
        c = rng.choice(conds)
        pres, dx, tx = T.CLINICAL[c][lang]
        stem = stem_t.format(age=rng.randint(18, 85), pres=pres)
        year = rng.randint(2019, 2024)
        images: list[str] = []
        if rng.random() < 0.25:  # shared case: context repeated in brackets before each question
            ctx = f"[{case_label}: {stem}]"
            for q, correct, pool in ((q_dx, dx, dx_pool), (q_tx, tx, tx_pool)):
                opts, key = _emq_options(rng, correct, pool)
                items.append(dict(text=f"{ctx} {q}", opts=opts, key=key, year=year, images=[]))
            continue
        k = len(items)  # fixed patterns so that even the small corpus has every case
        if cc == "FR" and k % 3 == 1:  # ECN: several exact propositions
            n_true = rng.choices((1, 2), weights=(1, 3))[0]
            true = [T.FR_DX.format(x=dx), T.FR_TX.format(x=tx)][:n_true]
            false = [T.FR_DX.format(x=x) for x in rng.sample([d for d in dx_pool if d != dx], 2)]
            false += [T.FR_TX.format(x=x) for x in rng.sample([t for t in tx_pool if t != tx],
                                                             5 - n_true - 2)]
            if rng.random() < 0.9:  # keys biased to the first positions too
                opts, pos = true + rng.sample(false, len(false)), list(range(n_true))
            else:
                opts = true + false
                rng.shuffle(opts)
                pos = [i for i, o in enumerate(opts) if o in true]
            key = ",".join(LETTERS[i] for i in pos)
            text = f"{stem} {T.FR_MULTI_QUESTION}"
        else:
            use_tx = rng.random() < 0.4
            opts, key = _emq_options(rng, tx if use_tx else dx, tx_pool if use_tx else dx_pool)
            text = f"{stem} {q_tx if use_tx else q_dx}"
        if cc == "FR" and k % 4 == 2:  # case image and/or sub-question image
            images = (["case", "q"], ["case"], ["case", "q"], ["q"])[(k // 4) % 4]
        elif cc != "FR" and k % 8 == 3:
            images = ["img"]
        items.append(dict(text=text, opts=opts, key=key, year=year, images=images))
    return items[:n]


def europemedqa_table(seed: int, scale: str) -> tuple[pd.DataFrame, dict[str, bytes]]:
    """The table and the PNG files (relative path -> bytes)."""
    check_scale(scale)
    rng = random.Random(f"europemedqa:{seed}")
    rows, pngs = [], {}
    n_no_key = EMQ_NO_KEY[scale]
    for ci, (cc, lang) in enumerate(EMQ_COUNTRIES):
        extra = n_no_key // len(EMQ_COUNTRIES) + (ci < n_no_key % len(EMQ_COUNTRIES))
        items = _emq_country_items(rng, cc, lang, EMQ_SIZES[scale] + extra)
        plain = [i for i, it in enumerate(items) if not it["images"] and "," not in it["key"]]
        for i in rng.sample(plain, extra):  # no validated key (keep the rarer cases intact)
            items[i]["key"] = rng.choice(("", "N/A"))
        per_year: dict[int, int] = {}
        for k, it in enumerate(items, start=1):
            qid = f"{cc}{k:04d}"
            per_year[it["year"]] = per_year.get(it["year"], 0) + 1
            links = []
            for tag in it["images"]:
                rel = f"images/{qid}_{tag}.png"
                pngs[rel] = png_bytes(32, 24, rng)
                links.append(rel)
            letters = [x for x in it["key"].split(",") if x in LETTERS]
            rows.append({
                "questionID": qid, "testyear": it["year"], "numberintest": per_year[it["year"]],
                "picture_provided": "yes" if links else "no", "question_text": it["text"],
                "picture_link": ";".join(links) if links else "N/A",
                **{f"option_{x.lower()}": o for x, o in zip(LETTERS, it["opts"], strict=True)},
                "correct_option": it["key"],
                "correct_fulltext": "; ".join(it["opts"][LETTERS.index(x)] for x in letters),
                "language": lang,
            })
    return pd.DataFrame(rows, columns=EMQ_COLUMNS), pngs


def write_europemedqa(out_dir: Path | str, seed: int = 0, scale: str = "small",
                      force: bool = False) -> Path:
    """Write ``europemedqa.csv`` and ``images/*.png`` as the folder ``out_dir``."""
    df, pngs = europemedqa_table(seed, scale)
    out = Path(out_dir)
    with atomic_directory(out, force=force, command="data synth europemedqa") as tmp:
        (tmp / "images").mkdir()
        for rel, data in pngs.items():
            (tmp / rel).write_bytes(data)
        (tmp / "europemedqa.csv").write_bytes(
            df.to_csv(index=False, lineterminator="\n").encode("utf-8"))
    return out
