"""A corpus of malformed inputs across the three loaders and the CLI.

Each case builds its raw files in a temp dir from small synthetic rows, runs
`medray data prepare` over an --out that holds a previous good output, and checks: exit
status 2, no traceback, the message names the file / data row / field, and nothing under
--out changed (no temp siblings either).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from medray.cli import app

runner = CliRunner()
EPI_A = "Pacienta A, 54 ani, fumătoare. Diagnostic: carcinom ductal invaziv. Ki-67: 30%."
EPI_B = "Pacientul B, 61 ani. Diagnostic: adenocarcinom pulmonar. ECOG 1. Tratament: șase cicluri."
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root (and its temp siblings) -> sha256."""
    files = {str(p.relative_to(root.parent)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(root.parent.rglob("*")) if p.is_file()
             and (p == root or root in p.parents or p.name.startswith(f".{root.name}."))}
    return files


# ------------------------------------------------------------------ good raw data
def medqaro_rows(split: str) -> pd.DataFrame:
    epi = EPI_A if split == "train" else EPI_B
    return pd.DataFrame({"Epicriza": [epi, epi], "Intrebare": ["Care este histologia?",
                                                              "Este fumătoare?"],
                         "Raspuns": ["carcinom ductal invaziv", "Nu"]})


def good_medqaro(raw: Path) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test"):
        frame = medqaro_rows(split)
        if split == "val":
            frame = frame.assign(Epicriza=EPI_B + " Alt pacient.")
        frame.to_csv(raw / f"{split}.csv")


def robio_item(n: int, **over: object) -> dict:
    item = {"question_number": str(n), "question": f"Celula procariotă {n}:",
            "type": "single-choice", "options": ["are perete", "nu are ADN", "are nucleu",
                                                  "are mitocondrii"],
            "grade": "IX", "stage": "locala", "year": "2019", "right_answer": "A",
            "source": "olimpiada", "id_in_source": f"t{n}", "dupe_id": None}
    item.update(over)
    return item


def good_robiology(raw: Path) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    for split, start in (("train", 1), ("validation", 10), ("test", 20)):
        items = [robio_item(start), robio_item(start + 1)]
        (raw / f"{split}.json").write_text(json.dumps(items, ensure_ascii=False))


EMQA_COLUMNS = ["questionID", "testyear", "numberintest", "picture_provided", "question_text",
                "picture_link", "option_a", "option_b", "option_c", "option_d", "option_e",
                "correct_option", "correct_fulltext"]


def emqa_row(qid: str, key: str = "A", picture: str = "no", link: str = "N/A",
             option_e: str = "cinque", text: str | None = None) -> list[str]:
    return [qid, "2020", qid[-2:], picture, text or f"[Caso] Domanda {qid}?", link, "uno", "due",
            "tre", "quattro", option_e, key, ""]


def write_emqa(raw: Path, rows: list[list[str]]) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=EMQA_COLUMNS).to_csv(raw / "europemedqa.csv", index=False)


def good_europemedqa(raw: Path) -> None:
    (raw / "images").mkdir(parents=True, exist_ok=True)
    (raw / "images" / "case.png").write_bytes(PNG)
    write_emqa(raw, [emqa_row("IT0001"), emqa_row("FR0002", key="A,C", picture="yes",
                                                  link="images/case.png")])


def emqa_json(raw: Path, records: object, name: str = "questions.json") -> None:
    raw.mkdir(parents=True, exist_ok=True)
    (raw / name).write_text(records if isinstance(records, str) else json.dumps(records))


def emqa_record(qid: str = "IT0001", **over: object) -> dict:
    rec = {"id": qid, "question": "Domanda?", "options": [{"letter": x, "text": t} for x, t in
                                                           zip("ABCDE", ["uno", "due", "tre",
                                                                         "quattro", "cinque"],
                                                               strict=True)],
           "correct_answer": {"letter": "B", "index": 1}, "specialty": "x", "has_image": False,
           "metadata": {"test_year": 2020, "number_in_test": 1, "nullified": False}}
    rec.update(over)
    return rec


GOOD = {"medqaro": good_medqaro, "robiology": good_robiology, "europemedqa": good_europemedqa}


# ------------------------------------------------------------------ mutations
def csv_bytes(raw: Path, name: str, data: bytes) -> None:
    (raw / name).write_bytes(data)


def mq_text(rows: list[tuple[str, str, str]], header: str = ",Epicriza,Intrebare,Raspuns"
            ) -> str:
    body = "".join(f'{i},"{e}","{q}","{a}"\n' for i, (e, q, a) in enumerate(rows))
    return header + "\n" + body


def _mq(rows: list[tuple[str, str, str]], name: str = "train.csv", **kw: str
        ) -> Callable[[Path], None]:
    return lambda raw: (raw / name).write_text(mq_text(rows, **kw), encoding="utf-8")


def _bad_symlink(raw: Path) -> None:
    secret = raw.parent / "secret.png"
    secret.write_bytes(PNG)
    (raw / "images" / "link.png").symlink_to(secret)
    write_emqa(raw, [emqa_row("FR0001", picture="yes", link="images/link.png")])


def _oversize(raw: Path) -> None:
    with (raw / "images" / "big.png").open("wb") as f:
        f.write(PNG)
        f.truncate(21 * 1024 * 1024)  # sparse: cheap to write
    write_emqa(raw, [emqa_row("FR0001", picture="yes", link="images/big.png")])


def _two_val(raw: Path) -> None:
    medqaro_rows("val").assign(Epicriza=EPI_B + " x").to_csv(raw / "validation.csv")


A, B = EPI_A, EPI_B
CASES: dict[str, tuple[str, Callable[[Path], None], tuple[str, ...]]] = {
    # --- MedQARo CSV
    "mq-cp1250": ("medqaro", lambda r: csv_bytes(r, "train.csv", mq_text(
        [(A, "Câte cicluri?", "şase")]).encode("cp1250")), ("train.csv", "byte offset",
                                                            "--encoding")),
    "mq-invalid-utf8": ("medqaro", lambda r: csv_bytes(r, "train.csv", mq_text(
        [(A, "Q?", "Da")]).encode() + b'1,"x\xff\xfe","Q?","Nu"\n'),
        ("train.csv", "byte offset", "--encoding")),
    "mq-empty-file": ("medqaro", lambda r: csv_bytes(r, "train.csv", b""),
                      ("train.csv", "0 bytes")),
    "mq-header-only": ("medqaro", _mq([]), ("train.csv", "no data rows")),
    "mq-ragged-row": ("medqaro", lambda r: csv_bytes(r, "train.csv", (mq_text(
        [(A, "Q1?", "Da")]) + '1,"x","Q2?","Nu","extra"\n').encode()),
        ("train.csv", "row 2", "ragged")),
    "mq-unterminated-quote": ("medqaro", lambda r: csv_bytes(r, "train.csv", (mq_text(
        [(A, "Q1?", "Da")]) + '1,"x,"Q2?,Nu\n2,y,Q3?,Da\n').encode()),
        ("train.csv", "row 2", "unterminated quote")),
    "mq-semicolon": ("medqaro", lambda r: csv_bytes(r, "train.csv",
                                                    b";Epicriza;Intrebare;Raspuns\n0;a;b;c\n"),
                     ("train.csv", "delimiter", "';'")),
    "mq-text-after-quote": ("medqaro", lambda r: csv_bytes(r, "train.csv", (mq_text(
        [(A, "Q1?", "Da")]) + '1,"ab"c,"Q2?","Nu"\n').encode()), ("train.csv", "row 2",
                                                                 "CSV parse error")),
    "mq-nan-answer": ("medqaro", _mq([(A, "Q1?", "Da"), (A, "Q2?", "NaN")]),
                      ("train.csv", "row 2", "'Raspuns'", "missing-value")),
    "mq-none-question": ("medqaro", _mq([(A, "None", "Da")]),
                         ("train.csv", "row 1", "'Intrebare'", "missing-value")),
    "mq-nan-context": ("medqaro", _mq([(A, "Q?", "Da"), ("nan", "Q?", "Da")]),
                       ("train.csv", "row 2", "'Epicriza'")),
    "mq-empty-answer": ("medqaro", _mq([(A, "Q?", " ")]), ("train.csv", "row 1", "'Raspuns'",
                                                            "empty")),
    "mq-missing-column": ("medqaro", _mq([(A, "Q?", "Da")], header=",Epicriza,Intrebare,Answer"),
                          ("train.csv", "'Raspuns'", "missing")),
    "mq-missing-test": ("medqaro", lambda r: (r / "test.csv").unlink(),
                        ("required split 'test'", "test.csv")),
    "mq-missing-train": ("medqaro", lambda r: (r / "train.csv").unlink(),
                         ("required split 'train'",)),
    "mq-split-like-name": ("medqaro", lambda r: medqaro_rows("train").to_csv(r / "train_old.csv"),
                           ("train_old.csv", "looks like a split", "val.csv")),
    "mq-two-val-files": ("medqaro", _two_val, ("validation.csv", "second file", "'val'")),
    "mq-bad-question-type": ("medqaro", lambda r: medqaro_rows("train").assign(
        question_type=["binary", "opinion"]).to_csv(r / "train.csv"),
        ("train.csv", "row 2", "'question_type'")),
    "mq-patient-two-splits": ("medqaro", lambda r: medqaro_rows("train").assign(
        Epicriza=EPI_B).to_csv(r / "train.csv"), ("row 1", "'Epicriza'", "splits must be")),
    # --- RoBiology JSON
    "rb-jsonl-bad-line": ("robiology", lambda r: (r / "train.json").write_text(
        json.dumps(robio_item(1)) + "\n" + json.dumps(robio_item(2)) + "\n{oops\n"),
        ("train.json", "row 3", "line 3")),
    "rb-broken-json": ("robiology", lambda r: (r / "train.json").write_text(
        '[\n {"question": "x"},\n]\n'), ("train.json", "line 3", "invalid JSON")),
    "rb-entry-not-object": ("robiology", lambda r: (r / "train.json").write_text(
        json.dumps([robio_item(1), ["not", "an", "object"]])),
        ("train.json", "row 2", "JSON object")),
    "rb-top-level-number": ("robiology", lambda r: (r / "test.json").write_text("42"),
                            ("test.json", "JSON list")),
    "rb-nan-answer": ("robiology", lambda r: (r / "train.json").write_text(json.dumps(
        [robio_item(1, right_answer="nan")])), ("train.json", "row 1", "'right_answer'")),
    "rb-none-question": ("robiology", lambda r: (r / "train.json").write_text(json.dumps(
        [robio_item(1, question="None")])), ("train.json", "row 1", "'question'")),
    "rb-invalid-utf8": ("robiology", lambda r: (r / "train.json").write_bytes(
        b'[{"question": "\xff"}]'), ("train.json", "byte offset", "--encoding")),
    "rb-empty-file": ("robiology", lambda r: (r / "test.json").write_bytes(b""),
                      ("test.json", "0 bytes")),
    "rb-missing-test": ("robiology", lambda r: (r / "test.json").unlink(),
                        ("required split 'test'",)),
    "rb-unknown-name": ("robiology", lambda r: (r / "validare.json").write_text(
        json.dumps([robio_item(40)])), ("validare.json", "split")),
    "rb-key-E-on-four": ("robiology", lambda r: (r / "train.json").write_text(json.dumps(
        [robio_item(1, right_answer="E")])), ("train.json", "row 1", "'right_answer'",
                                              "not among the options")),
    "rb-key-F-on-five": ("robiology", lambda r: (r / "train.json").write_text(json.dumps(
        [robio_item(1, options=list("vwxyz"), right_answer="F")])),
        ("train.json", "row 1", "'right_answer'", "not among the options")),
    "rb-multi-letter-single": ("robiology", lambda r: (r / "train.json").write_text(json.dumps(
        [robio_item(1, right_answer="AB")])), ("train.json", "row 1", "exactly one letter")),
    # --- EuropeMedQA table
    "emq-image-traversal": ("europemedqa", lambda r: write_emqa(r, [emqa_row(
        "FR0001", picture="yes", link="../../../../etc/passwd")]),
        ("europemedqa.csv", "row 1", "'picture_link'", "FR0001", "outside")),
    "emq-image-absolute": ("europemedqa", lambda r: write_emqa(r, [emqa_row(
        "FR0001", picture="yes", link="/etc/hostname")]), ("row 1", "FR0001", "outside")),
    "emq-image-symlink-out": ("europemedqa", _bad_symlink, ("row 1", "FR0001", "outside")),
    "emq-image-not-image": ("europemedqa", lambda r: ((r / "images" / "fake.png").write_text(
        "not an image"), write_emqa(r, [emqa_row("FR0001", picture="yes",
                                                 link="images/fake.png")])),
        ("row 1", "FR0001", "not a PNG")),
    "emq-image-too-large": ("europemedqa", _oversize, ("row 1", "FR0001", "bytes; at most")),
    "emq-key-F-on-five": ("europemedqa", lambda r: write_emqa(r, [emqa_row("IT0001", key="F")]),
                          ("row 1", "'correct_option'", "IT0001", "not among the options")),
    "emq-key-E-on-four": ("europemedqa", lambda r: write_emqa(r, [emqa_row(
        "IT0001", key="E", option_e="")]), ("row 1", "'correct_option'", "IT0001",
                                            "not among the options")),
    "emq-multi-letter-italy": ("europemedqa", lambda r: write_emqa(r, [emqa_row(
        "IT0001", key="A,C")]), ("row 1", "'correct_option'", "IT0001", "several letters")),
    "emq-nan-question": ("europemedqa", lambda r: write_emqa(r, [emqa_row("IT0001", text="nan")]),
                         ("row 1", "'question_text'")),
    "emq-not-xlsx": ("europemedqa", lambda r: ((r / "europemedqa.csv").rename(
        r / "europemedqa.xlsx")), ("europemedqa.xlsx", "not an XLSX")),
    "emq-ragged-row": ("europemedqa", lambda r: (r / "europemedqa.csv").write_text(
        (r / "europemedqa.csv").read_text() + "IT0009,2020,9\n"),
        ("europemedqa.csv", "row 3", "ragged")),
    "emq-cp1252": ("europemedqa", lambda r: (r / "europemedqa.csv").write_bytes(
        (r / "europemedqa.csv").read_text().replace("Domanda", "Perché").encode("cp1252")),
        ("europemedqa.csv", "byte offset", "--encoding")),
    # --- EuropeMedQA JSON
    "emq-json-not-object": ("europemedqa", lambda r: emqa_json(r, [emqa_record(), "text"]),
                            ("questions.json", "row 2", "JSON object")),
    "emq-json-option-no-text": ("europemedqa", lambda r: emqa_json(r, [emqa_record(options=[
        {"letter": "A", "text": "uno"}, {"letter": "B"}])]),
        ("questions.json", "row 1", "'options'", "option 2 has no 'text'")),
    "emq-json-image-traversal": ("europemedqa", lambda r: emqa_json(r, [emqa_record(
        "FR0001", has_image=True, images=["../../../etc/passwd"])]),
        ("questions.json", "row 1", "'images'", "outside")),
    "emq-jsonl-in-json-bad-line": ("europemedqa", lambda r: emqa_json(
        r, json.dumps(emqa_record()) + "\n" + '{"id": "IT0002", \n'),
        ("questions.json", "line 2")),
    "emq-json-answer-not-object": ("europemedqa", lambda r: emqa_json(r, [emqa_record(
        correct_answer="B")]), ("questions.json", "row 1", "'correct_answer'")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_input_exits_2_and_leaves_out_untouched(case, tmp_path):
    dataset, mutate, fragments = CASES[case]
    good = tmp_path / "good"
    GOOD[dataset](good)
    out = tmp_path / "out"
    first = runner.invoke(app, ["data", "prepare", "-d", dataset, "-i", str(good),
                                "--out", str(out)])
    assert first.exit_code == 0, first.output
    before = snapshot(out)
    raw = tmp_path / "raw"
    GOOD[dataset](raw)
    mutate(raw)
    result = runner.invoke(app, ["data", "prepare", "-d", dataset, "-i", str(raw),
                                 "--out", str(out)])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output, (fragment, result.output)
    assert snapshot(out) == before


def test_corpus_is_large_enough():
    assert len(CASES) >= 40


# ------------------------------------------------------------------ accepted variants
def test_bom_and_declared_encoding_are_read(tmp_path):
    raw = tmp_path / "raw"
    good_medqaro(raw)
    text = (raw / "train.csv").read_text(encoding="utf-8")
    (raw / "train.csv").write_bytes(codecs.BOM_UTF8 + text.encode())  # BOM: accepted
    out = tmp_path / "out"
    assert runner.invoke(app, ["data", "prepare", "-d", "medqaro", "-i", str(raw),
                               "--out", str(out)]).exit_code == 0
    for path in raw.glob("*.csv"):  # a Windows-1250 export (cedilla forms: cp1250 has no ș)
        cedilla = path.read_text(encoding="utf-8-sig").replace("ș", "ş").replace("ț", "ţ")
        path.write_bytes(cedilla.encode("cp1250"))
    result = runner.invoke(app, ["data", "prepare", "-d", "medqaro", "-i", str(raw),
                                 "--out", str(out), "--encoding", "cp1250"])
    assert result.exit_code == 0, result.output
    examples = pd.read_parquet(out / "examples.parquet")
    assert "Este fumătoare?" in set(examples["question"])
    bad = runner.invoke(app, ["data", "prepare", "-d", "medqaro", "-i", str(raw),
                              "--out", str(out), "--encoding", "no-such-codec"])
    assert bad.exit_code == 2 and "unknown encoding" in bad.output


def test_json_bom_and_json_lines_in_a_json_file(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    lines = "\n".join(json.dumps(emqa_record(f"IT000{i}")) for i in (1, 2))
    (raw / "q.json").write_bytes(codecs.BOM_UTF8 + lines.encode())
    result = runner.invoke(app, ["data", "prepare", "-d", "europemedqa", "-i", str(raw),
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert len(pd.read_parquet(tmp_path / "out" / "examples.parquet")) == 2


def test_prepare_reports_split_mapping_and_ignored_files(tmp_path):
    raw = tmp_path / "raw"
    good_medqaro(raw)
    (raw / "val.csv").rename(raw / "VAL.CSV")  # case only: mapped explicitly
    (raw / "README.md").write_text("notes")
    result = runner.invoke(app, ["data", "prepare", "-d", "medqaro", "-i", str(raw),
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "VAL.CSV -> val" in result.output and "train.csv -> train" in result.output
    assert "ignored: README.md" in result.output
    (raw / "VAL.CSV").unlink()
    result = runner.invoke(app, ["data", "prepare", "-d", "medqaro", "-i", str(raw),
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 0 and "no val split" in result.output


def test_france_may_have_several_letters(tmp_path):
    raw = tmp_path / "raw"
    good_europemedqa(raw)
    result = runner.invoke(app, ["data", "prepare", "-d", "europemedqa", "-i", str(raw),
                                 "--out", str(tmp_path / "out"), "--no-shuffle"])
    assert result.exit_code == 0, result.output
    rows = pd.read_parquet(tmp_path / "out" / "examples.parquet").set_index("id")
    assert list(rows.loc["FR0002", "answer"]) == ["A", "C"]
    assert rows.loc["FR0002", "kind"] == "multiple" and rows.loc["IT0001", "kind"] == "single"


# ------------------------------------------------------------------ the CLI
@pytest.mark.parametrize("args", [
    ["data", "prepare", "-d", "medqaro", "-i", "{tmp}", "--out", "{tmp}/o", "--compat", "bogus"],
    ["data", "prepare", "-d", "nosuch", "-i", "{tmp}", "--out", "{tmp}/o"],
    ["data", "synth", "-d", "medqaro", "--out", "{tmp}/o", "--scale", "huge"],
    ["data", "prompt", "{tmp}", "--id", "test:0", "--format", "aqe"],
    ["export", "{tmp}", "--merge", "--dtype", "fp8"],
    ["score", "--predictions", "{tmp}/p.jsonl", "--data", "{tmp}", "--mode", "exact"],
    ["baseline", "--data", "{tmp}", "--kind", "oracle", "--out", "{tmp}/o"],
    ["tune", "--config", "{tmp}/c.yaml", "--space", "{tmp}/s.yaml", "--output", "{tmp}/o",
     "--search", "bayes"],
    ["report", "{tmp}", "--out", "{tmp}/o", "--mode", "exact"],
])
def test_enumerated_options_are_choices(args, tmp_path):
    result = runner.invoke(app, [a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "Invalid value" in result.output, result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("where", ["same", "parent", "inside"])
def test_out_overlapping_the_input_is_refused_and_the_input_is_byte_identical(where, tmp_path):
    raw = tmp_path / "raw"
    good_medqaro(raw)
    out = {"same": raw, "parent": tmp_path, "inside": raw / "prepared"}[where]
    before = snapshot(raw)
    for extra in ([], ["--force"]):
        result = runner.invoke(app, ["data", "prepare", "-d", "medqaro", "-i", str(raw),
                                     "--out", str(out), *extra])
        assert result.exit_code == 2, result.output
        assert str(raw) in result.output and str(out) in result.output
        assert {"same": " is the input", "parent": "contains the input",
                "inside": "is inside the input"}[where] in result.output
        assert snapshot(raw) == before


def test_foreign_non_empty_out_needs_force(tmp_path):
    raw = tmp_path / "raw"
    good_medqaro(raw)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    result = runner.invoke(app, ["data", "prepare", "-d", "medqaro", "-i", str(raw),
                                 "--out", str(out)])
    assert result.exit_code == 2 and "did not create" in result.output and "--force" in \
        result.output
    assert (out / "thesis.tex").read_text() == "years of work"
    result = runner.invoke(app, ["data", "prepare", "-d", "medqaro", "-i", str(raw),
                                 "--out", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert (out / "examples.parquet").is_file() and not (out / "thesis.tex").exists()
    # Now medray's own: replaced again without --force.
    assert runner.invoke(app, ["data", "prepare", "-d", "medqaro", "-i", str(raw),
                               "--out", str(out)]).exit_code == 0


def test_report_refuses_an_out_inside_a_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text("{}")
    result = runner.invoke(app, ["report", str(run), "--out", str(run / "report")])
    assert result.exit_code == 2 and "is inside the input" in result.output
    assert sorted(os.listdir(run)) == ["metrics.json"]


def test_synth_refuses_a_foreign_folder(tmp_path):
    out = tmp_path / "raw"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    result = runner.invoke(app, ["data", "synth", "-d", "robiology", "--out", str(out)])
    assert result.exit_code == 2 and "did not create" in result.output
    assert sorted(os.listdir(out)) == ["keep.txt"]
