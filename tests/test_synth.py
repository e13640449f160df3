"""Synthetic generators: determinism, raw formats, answer types, key biases (fast, no Ray).

Budget: ~10 s on 2 cores (three small MedQARo corpora, the MCQ corpora, a few paper-scale
epicrises generated in memory; the paper-scale files are never written here).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import statistics
import struct
import zlib
from datetime import date
from pathlib import Path

import pandas as pd
import pytest

from medray.data.schema import GROUP_CODES
from medray.data.synth import SCALES, write_europemedqa, write_medqaro, write_robiology
from medray.data.synth.medqaro import (
    PAPER_MEAN_WORDS,
    draw_target_words,
    patient_rng,
    patient_rows,
    split_plan,
)
from medray.data.synth.medqaro_families import FAMILIES_PAPER, families_for
from medray.data.synth.medqaro_patient import make_patient, stage_from_tnm
from medray.io import MARKER
from medray.text import normalize

MEDQARO_FILES = ("train.csv", "val.csv", "test.csv", "test_cross.csv")


def _digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def medqaro(tmp_path_factory) -> Path:
    return write_medqaro(tmp_path_factory.mktemp("mq") / "raw", seed=0)


@pytest.fixture(scope="module")
def medqaro_frames(medqaro) -> dict[str, pd.DataFrame]:
    return {f[:-4]: pd.read_csv(medqaro / f, index_col=0, dtype=str, keep_default_na=False)
            for f in MEDQARO_FILES}


def test_medqaro_format_and_determinism(medqaro, medqaro_frames, tmp_path):
    # No temp files; the marker says medray wrote the folder.
    assert sorted(p.name for p in medqaro.iterdir()) == sorted([*MEDQARO_FILES, MARKER])
    for df in medqaro_frames.values():
        assert list(df.columns) == ["Epicriza", "Intrebare", "Raspuns", "cancer_type",
                                    "question_type"]
        assert list(df.index) == [str(i) for i in range(len(df))]
        assert (df != "").all().all()
    assert _digest(write_medqaro(tmp_path / "again", seed=0)) == _digest(medqaro)
    other = _digest(write_medqaro(tmp_path / "other", seed=1))
    assert all(other[f] != h for f, h in _digest(medqaro).items() if f != MARKER)


def test_medqaro_splits_by_patient(medqaro_frames):
    patients = {s: set(df["Epicriza"]) for s, df in medqaro_frames.items()}
    assert {s: len(p) for s, p in patients.items()} == {"train": 24, "val": 6, "test": 6,
                                                       "test_cross": 6}
    splits = list(patients)
    for i, a in enumerate(splits):
        for b in splits[i + 1:]:
            assert not patients[a] & patients[b], f"patient shared by {a} and {b}"
    assert set(medqaro_frames["train"]["cancer_type"]) == {"breast", "lung"}
    assert set(medqaro_frames["test_cross"]["cancer_type"]) == {
        "head_neck", "melanoma", "renal", "bladder", "liver"}
    # every (patient, family) pair comes with two distinct paraphrases
    for df in medqaro_frames.values():
        assert df.groupby("Epicriza")["Intrebare"].apply(lambda q: q.is_unique).all()


def test_medqaro_answer_types_and_majority(medqaro_frames):
    df = pd.concat(medqaro_frames.values())
    share = df["question_type"].value_counts(normalize=True)
    assert set(share.index) == {"binary", "extractive", "reasoning"}
    assert 0.25 < share["binary"] < 0.5 and share["extractive"] > 0.25
    assert share["reasoning"] > 0.1
    binary = df[df["question_type"] == "binary"]
    assert set(binary["Raspuns"]) == {"Da", "Nu"}
    assert ((df["Raspuns"].isin(["Da", "Nu"])) == (df["question_type"] == "binary")).all()
    nu_of_binary = (binary["Raspuns"] == "Nu").mean()
    assert 0.55 < nu_of_binary < 0.8  # paper: about 2/3 "Nu"
    counts = df["Raspuns"].value_counts(normalize=True)
    assert counts.index[0] == "Nu" and counts.iloc[0] < 0.35  # majority, but a minority
    assert df["Raspuns"].str.split().str.len().mean() < 4  # short answers


def test_medqaro_extractive_answers_are_spans(medqaro_frames):
    df = pd.concat(medqaro_frames.values())
    ext = df[df["question_type"] == "extractive"]
    assert len(ext) > 100
    for ctx, ans in zip(ext["Epicriza"], ext["Raspuns"], strict=True):
        assert normalize(ans) in normalize(ctx)
    # the normaliser has real work: some legacy patients (cedilla letters, CRLF)
    contexts = set(df["Epicriza"])
    legacy = [c for c in contexts if "\r\n" in c]
    assert legacy and all(("ş" in c or "ţ" in c) for c in legacy)
    assert all(normalize(c) != c for c in legacy)
    assert any("ș" in c for c in contexts)


def _months(a: date, b: date) -> int:
    return (b.year - a.year) * 12 + b.month - a.month - (b.day < a.day)


def _date(s: str) -> date:
    d, m, y = (int(x) for x in s.split("."))
    return date(y, m, d)


def test_medqaro_reasoning_answers_recomputed(medqaro_frames):
    df = pd.concat([medqaro_frames[s] for s in ("train", "val", "test")])
    fam = {f.key: f for f in FAMILIES_PAPER["breast"]}
    checked = {"months": 0, "stage": 0, "cycles": 0}
    for ctx, q, ans in zip(df["Epicriza"], df["Intrebare"], df["Raspuns"], strict=True):
        text = normalize(ctx)
        if q in fam["months_surgery_rt"].paraphrases:
            surg = re.search(r"Intervenție chirurgicală: [^.]* la (\d\d\.\d\d\.\d{4})", text)
            rt = re.search(r"Radioterapie: \d+ Gy [^.]*început la (\d\d\.\d\d\.\d{4})", text)
            want = str(_months(_date(surg[1]), _date(rt[1]))) if surg and rt else "NK"
            assert ans == want
            checked["months"] += want != "NK"
        elif q in fam["stage"].paraphrases:
            t, n, m = (int(x) for x in re.search(r"TNM: cT(\d)N(\d)M(\d)", text).groups())
            assert ans == stage_from_tnm("breast" if "mamar" in text else "lung", t, n, m)
            checked["stage"] += 1
        elif q in fam["cycles"].paraphrases:
            assert ans == str(sum(int(k) for k in re.findall(r"schema [^,]+, (\d+) cicluri", text)))
            checked["cycles"] += 1
    assert all(v > 3 for v in checked.values()), checked


@pytest.mark.parametrize(("cancer", "tnm", "stage"), [
    ("breast", (1, 0, 0), "IA"), ("breast", (2, 1, 0), "IIB"), ("breast", (3, 1, 0), "IIIA"),
    ("breast", (4, 0, 0), "IIIB"), ("breast", (1, 3, 0), "IIIC"), ("lung", (2, 0, 0), "IB"),
    ("lung", (1, 2, 0), "IIIA"), ("lung", (3, 3, 0), "IIIC"), ("renal", (2, 2, 1), "IV"),
])
def test_stage_table(cancer, tnm, stage):
    assert stage_from_tnm(cancer, *tnm) == stage


def test_medqaro_options_and_errors(tmp_path):
    with pytest.raises(ValueError, match="small, paper"):
        write_medqaro(tmp_path, scale="huge")
    with pytest.raises(ValueError, match="unknown split"):
        write_medqaro(tmp_path, n_patients={"dev": 3})
    assert SCALES == ("small", "paper")
    out = write_medqaro(tmp_path / "big", seed=3, n_patients={"train": 9, "val": 0,
                                                               "test": 2, "test_cross": 1},
                        words=(220, 260))
    train = pd.read_csv(out / "train.csv", index_col=0)
    assert train["Epicriza"].nunique() == 9
    assert train["Epicriza"].str.split().str.len().max() < 400
    assert len(pd.read_csv(out / "val.csv", index_col=0)) == 0


def test_medqaro_paper_scale_sizes_without_writing():
    plan = split_plan("paper")
    n_fam = {c: len(families_for(c, "paper")) for c in ("breast", "lung", "melanoma")}
    assert n_fam == {"breast": 48, "lung": 61, "melanoma": 7}
    qa = {s: sum(2 * n_fam.get(c, 7) for c in cancers) for s, cancers in plan.items()}
    assert qa == {"train": 71_772, "val": 15_328, "test": 15_546, "test_cross": 3_234}
    assert sum(len(c) for c in plan.values()) == 1_242 and sum(qa.values()) == 105_880


def test_medqaro_paper_scale_lengths():
    rng = random.Random(7)
    lengths = [draw_target_words(rng, "paper") for _ in range(200)]
    assert abs(statistics.mean(lengths) - PAPER_MEAN_WORDS) < 0.15 * PAPER_MEAN_WORDS
    assert max(lengths) > 20_000 and min(lengths) >= 207
    for pid, cancer in ((0, "breast"), (1, "lung")):  # real epicrises hit their target length
        rng = patient_rng(11, pid)
        p = make_patient(rng, pid, cancer)
        target = draw_target_words(random.Random(pid), "paper")
        rows = patient_rows(p, patient_rng(11, pid), "paper", words=(target, target))
        assert len(rows) == 2 * (48 if cancer == "breast" else 61)
        assert target <= len(rows[0][0].split()) < target + 200


# ---------------------------------------------------------------- RoBiology
@pytest.fixture(scope="module")
def robiology(tmp_path_factory) -> Path:
    return write_robiology(tmp_path_factory.mktemp("rb") / "raw", seed=0)


def test_robiology_format_determinism_and_truth(robiology, tmp_path):
    from medray.data.synth.mcq_text import BIO

    truth = {s[:1].upper() + s[1:]: v for t, f in BIO.values() for v, ss in ((True, t), (False, f))
             for s in ss}
    assert _digest(write_robiology(tmp_path / "a", seed=0)) == _digest(robiology)
    assert _digest(write_robiology(tmp_path / "b", seed=5)) != _digest(robiology)
    splits = {f: json.loads((robiology / f"{f}.json").read_text("utf-8"))
              for f in ("train", "validation", "test")}
    assert [len(v) for v in splits.values()] == [90, 24, 24]
    fields = ["question_number", "question", "type", "options", "grade", "stage", "year",
              "right_answer", "source", "id_in_source", "dupe_id"]
    kinds = set()
    for items in splits.values():
        for it in items:
            assert list(it) == fields
            assert isinstance(it["question_number"], str) and isinstance(it["year"], str)
            kinds.add(it["type"])
            flags = [truth[o] for o in it["options"]]
            if it["type"] == "group-choice":
                assert len(flags) == 4
                assert {i + 1 for i, f in enumerate(flags) if f} == GROUP_CODES[it["right_answer"]]
            elif it["type"] == "multiple-choice":
                assert len(flags) == 5
                assert it["right_answer"] == "".join("ABCDE"[i] for i, f in enumerate(flags) if f)
            else:
                assert len(flags) == (5 if it["grade"] == "facultate" else 4)
                assert flags.count(True) == 1 and flags["ABCDE".index(it["right_answer"])]
    assert kinds == {"single-choice", "group-choice", "multiple-choice"}
    # duplicate groups stay inside one split and are real duplicates
    groups: dict[str, set] = {}
    for split, items in splits.items():
        for it in items:
            if it["dupe_id"]:
                groups.setdefault(it["dupe_id"], set()).add(
                    (split, it["question"], tuple(it["options"])))
    assert len(groups) == 5
    assert all(len(g) == 1 for g in groups.values())
    # positional bias of single-choice keys
    keys = [it["right_answer"] for v in splits.values() for it in v
            if it["type"] == "single-choice"]
    assert keys.count("A") / len(keys) > 0.3


def test_robiology_paper_scale_fills_its_splits_with_distinct_items(monkeypatch):
    from medray.data.synth import mcq as synth_mcq
    from medray.data.synth.mcq import ROBIO_SIZES, robiology_items

    splits = robiology_items(0, "paper")  # in memory: ~2 s
    assert {k: len(v) for k, v in splits.items()} == ROBIO_SIZES["paper"]
    signature = {split: {(it["question"], tuple(sorted(it["options"]))) for it in items}
                 for split, items in splits.items()}
    for split, items in splits.items():  # only the planted duplicates repeat inside a split
        dupes = sum(1 for it in items if it["dupe_id"]) // 2
        assert len(signature[split]) == len(items) - dupes
    assert not signature["train"] & signature["test"]
    assert not signature["train"] & signature["validation"]
    # a corpus the statement bank cannot fill is an error, never an endless loop
    true, false = synth_mcq.T.BIO["celula"]
    monkeypatch.setattr(synth_mcq.T, "BIO", {"celula": (true[:4], false[:4])})
    monkeypatch.setattr(synth_mcq, "MAX_DRAWS_PER_ITEM", 2)
    with pytest.raises(RuntimeError, match="distinct train items"):
        robiology_items(0, "paper")


# ---------------------------------------------------------------- EuropeMedQA
def _png_ok(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, size, idat = 8, None, b""
    while pos < len(data):
        (n,), tag = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(tag + body)
        if tag == b"IHDR":
            size = struct.unpack(">II", body[:8])
        idat += body if tag == b"IDAT" else b""
        pos += 12 + n
    w, h = size
    assert len(zlib.decompress(idat)) == h * (1 + 3 * w)
    return size


def test_europemedqa(tmp_path):
    out = write_europemedqa(tmp_path / "emq", seed=0)
    assert _digest(write_europemedqa(tmp_path / "again", seed=0)) == _digest(out)
    df = pd.read_csv(out / "europemedqa.csv", dtype=str, keep_default_na=False)
    assert list(df.columns[:13]) == [
        "questionID", "testyear", "numberintest", "picture_provided", "question_text",
        "picture_link", "option_a", "option_b", "option_c", "option_d", "option_e",
        "correct_option", "correct_fulltext"]
    assert df["questionID"].is_unique
    assert set(df["questionID"].str[:2]) == {"IT", "FR", "ES", "PT"}
    key = df["correct_option"]
    valid = key.str.fullmatch(r"[A-E](,[A-E])*")
    assert (~valid).sum() == 2  # no validated key: the loader removes and counts them
    single = key[valid & (key.str.len() == 1)]
    assert (single == "A").mean() > 0.8
    multi = df[valid & key.str.contains(",")]
    assert len(multi) and set(multi["questionID"].str[:2]) == {"FR"}
    assert df["question_text"].str.startswith("[").sum() >= 2
    with_pic = df[df["picture_provided"] == "yes"]
    assert (df.loc[df["picture_provided"] == "no", "picture_link"] == "N/A").all()
    assert any(";" in link for link in with_pic["picture_link"])
    for link in with_pic["picture_link"]:
        for rel in link.split(";"):
            assert _png_ok((out / rel).read_bytes())[0] > 0
    for _, row in df[valid].iterrows():  # full text agrees with the key
        texts = [row[f"option_{x.lower()}"] for x in row["correct_option"].split(",")]
        assert row["correct_fulltext"] == "; ".join(texts)
