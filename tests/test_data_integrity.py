"""Every integrity error names the file, the data row (1-based) and the field, exits with
status 2 through the CLI, and leaves no partial output behind."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from medray.cli import app
from medray.data.prepare import prepare
from medray.data.schema import DataError

runner = CliRunner()
EPI_A = "Pacienta A, 54 ani. Diagnostic: carcinom ductal invaziv. Ki-67: 30%."
EPI_B = "Pacientul B, 61 ani. Diagnostic: adenocarcinom pulmonar. ECOG 1."


def write_medqaro(root: Path, splits: dict[str, list[tuple[str, str, str]]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        frame = pd.DataFrame(rows, columns=["Epicriza", "Intrebare", "Raspuns"])
        frame.to_csv(root / f"{split}.csv")
    return root


def good_medqaro(root: Path) -> Path:
    return write_medqaro(root, {
        "train": [(EPI_A, "Care este histologia?", "carcinom ductal invaziv"),
                  (EPI_A, "Este fumătoare?", "Nu")],
        "val": [(EPI_B, "Care este scorul ECOG?", "1")],
        "test": [(EPI_B + " Alt pacient.", "Are metastaze?", "Da")],
    })


def run_prepare(dataset: str, raw: Path, out: Path):
    return runner.invoke(app, ["data", "prepare", "--dataset", dataset, "--input", str(raw),
                               "--out", str(out)])


def assert_cli_error(result, out: Path, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    for fragment in fragments:
        assert fragment in result.output, (fragment, result.output)
    assert not out.exists(), "no partial output may be left behind"
    assert not list(out.parent.glob(f".{out.name}.*")), "temporary files left behind"


def test_good_medqaro_prepares_and_stores_each_epicrisis_once(tmp_path):
    data = prepare("medqaro", good_medqaro(tmp_path / "raw"), tmp_path / "out")
    assert len(data.examples) == 4 and len(data.contexts) == 3
    train = data.split("train")
    assert train["context_id"].nunique() == 1
    assert list(train["question_type"]) == ["extractive", "binary"]
    assert data.split("val")["question_type"].iloc[0] == "extractive"
    assert set(data.examples["id"]) == {"train:0", "train:1", "val:0", "test:0"}


def test_medqaro_patient_in_two_splits(tmp_path):
    raw = write_medqaro(tmp_path / "raw", {
        "train": [(EPI_A, "Q1?", "Nu")],
        "test": [(EPI_B, "Q2?", "Da"), (EPI_A, "Q3?", "Da")],
    })
    out = tmp_path / "out"
    result = run_prepare("medqaro", raw, out)
    assert_cli_error(result, out, "test.csv", "row 2", "'Epicriza'", "split 'train'")


def test_medqaro_empty_field(tmp_path):
    raw = write_medqaro(tmp_path / "raw", {"train": [(EPI_A, "Q1?", "Nu"), (EPI_A, "Q2?", " ")]})
    out = tmp_path / "out"
    assert_cli_error(run_prepare("medqaro", raw, out), out, "train.csv", "row 2",
                     "'Raspuns'", "empty")


def test_medqaro_missing_column(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    pd.DataFrame({"Epicriza": [EPI_A], "Intrebare": ["Q?"]}).to_csv(raw / "train.csv")
    out = tmp_path / "out"
    assert_cli_error(run_prepare("medqaro", raw, out), out, "train.csv", "'Raspuns'", "missing")


def test_medqaro_duplicate_ids(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    frame = pd.DataFrame({"Epicriza": [EPI_A, EPI_A], "Intrebare": ["Q1?", "Q2?"],
                          "Raspuns": ["Da", "Nu"]}, index=[7, 7])
    frame.to_csv(raw / "train.csv")
    out = tmp_path / "out"
    assert_cli_error(run_prepare("medqaro", raw, out), out, "train.csv", "row 2", "'index'",
                     "duplicate id 'train:7'")


def test_failed_prepare_keeps_the_previous_output_intact(tmp_path):
    out = tmp_path / "out"
    prepare("medqaro", good_medqaro(tmp_path / "good"), out)
    before = (out / "examples.parquet").read_bytes()
    bad = write_medqaro(tmp_path / "bad", {"train": [(EPI_A, "", "Nu")]})
    with pytest.raises(DataError, match="Intrebare"):
        prepare("medqaro", bad, out)
    assert (out / "examples.parquet").read_bytes() == before


def robiology_item(**overrides) -> dict:
    item = {"question_number": "1", "question": "Celula procariotă:", "type": "single-choice",
            "options": ["are perete", "nu are ADN", "are nucleu", "are mitocondrii"],
            "grade": "IX", "stage": "locala", "year": "2019", "right_answer": "A",
            "source": "olimpiada", "id_in_source": "t1", "dupe_id": None}
    item.update(overrides)
    return item


def write_robiology(root: Path, splits: dict[str, list[dict]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, items in splits.items():
        (root / f"{name}.json").write_text(json.dumps(items, ensure_ascii=False))
    return root


def test_robiology_kinds_parse(tmp_path):
    raw = write_robiology(tmp_path / "raw", {
        "train": [robiology_item(),
                  robiology_item(question_number="2", type="group-choice", right_answer="C"),
                  robiology_item(question_number="3", type="multiple-choice",
                                 options=list("vwxyz"), right_answer="ACD")],
        "test": [robiology_item(question_number="4")],
    })
    data = prepare("robiology", raw, tmp_path / "out")
    by_kind = {r["kind"]: r for r in data.examples.to_dict("records")}
    assert [o["label"] for o in by_kind["group"]["options"]] == ["1", "2", "3", "4"]
    assert list(by_kind["group"]["answer"]) == ["C"]
    assert list(by_kind["multiple"]["answer"]) == ["A", "C", "D"]
    assert json.loads(by_kind["single"]["meta"])["grade"] == "IX"


def test_robiology_dupe_id_in_two_splits(tmp_path):
    raw = write_robiology(tmp_path / "raw", {
        "train": [robiology_item(dupe_id="u-1")],
        "test": [robiology_item(question_number="9"), robiology_item(question_number="2",
                                                                     dupe_id="u-1")],
    })
    out = tmp_path / "out"
    assert_cli_error(run_prepare("robiology", raw, out), out, "test.json", "row 2",
                     "'dupe_id'", "u-1")


def test_robiology_answer_key_not_among_options(tmp_path):
    raw = write_robiology(tmp_path / "raw", {"train": [robiology_item(),
                                                       robiology_item(question_number="2",
                                                                      right_answer="E")]})
    out = tmp_path / "out"
    assert_cli_error(run_prepare("robiology", raw, out), out, "train.json", "row 2",
                     "'right_answer'", "not among the options")


def test_robiology_missing_field(tmp_path):
    item = robiology_item()
    del item["question"]
    raw = write_robiology(tmp_path / "raw", {"train": [item]})
    out = tmp_path / "out"
    assert_cli_error(run_prepare("robiology", raw, out), out, "train.json", "row 1",
                     "'question'", "missing")


def test_robiology_duplicate_ids(tmp_path):
    raw = write_robiology(tmp_path / "raw", {"train": [robiology_item(), robiology_item()]})
    out = tmp_path / "out"
    assert_cli_error(run_prepare("robiology", raw, out), out, "train.json", "row 2",
                     "duplicate item id")


EMQA_COLUMNS = ["questionID", "testyear", "numberintest", "picture_provided", "question_text",
                "picture_link", "option_a", "option_b", "option_c", "option_d", "option_e",
                "correct_option", "correct_fulltext"]


def emqa_row(qid: str, key: str = "A", picture: str = "no", link: str = "N/A") -> list[str]:
    return [qid, "2020", qid[-2:], picture, f"[Caso] Domanda {qid}?", link, "uno", "due", "tre",
            "quattro", "cinque", key, ""]


def write_emqa(root: Path, rows: list[list[str]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=EMQA_COLUMNS).to_csv(root / "europemedqa.csv", index=False)
    return root


def test_europemedqa_table_keys_and_removal(tmp_path):
    raw = write_emqa(tmp_path / "raw", [emqa_row("IT0001"), emqa_row("FR0002", key="A,C"),
                                        emqa_row("ES0003", key="N/A"),
                                        emqa_row("PT0004", key="tre")])
    data = prepare("europemedqa", raw, tmp_path / "out", shuffle=False)
    assert data.manifest["removed"] == {"no_validated_key": 1, "ids": ["ES0003"]}
    rows = {r["id"]: r for r in data.examples.to_dict("records")}
    assert list(rows["FR0002"]["answer"]) == ["A", "C"] and rows["FR0002"]["kind"] == "multiple"
    assert list(rows["PT0004"]["answer"]) == ["C"] and rows["PT0004"]["language"] == "pt"


def test_europemedqa_answer_key_not_among_options(tmp_path):
    row = emqa_row("IT0002", key="E")
    row[10] = ""  # no option E
    raw = write_emqa(tmp_path / "raw", [emqa_row("IT0001"), row])
    out = tmp_path / "out"
    assert_cli_error(run_prepare("europemedqa", raw, out), out, "europemedqa.csv", "row 2",
                     "'correct_option'", "IT0002", "not among the options")


def test_europemedqa_missing_image_names_the_item(tmp_path):
    raw = write_emqa(tmp_path / "raw", [emqa_row("FR0001", picture="yes",
                                                 link="images/missing.png")])
    out = tmp_path / "out"
    assert_cli_error(run_prepare("europemedqa", raw, out), out, "europemedqa.csv", "row 1",
                     "'picture_link'", "FR0001", "missing.png")


def test_europemedqa_images_resolve_relative_to_the_input(tmp_path):
    raw = tmp_path / "raw"
    (raw / "images").mkdir(parents=True)
    (raw / "images" / "case.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (raw / "images" / "sub.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    write_emqa(raw, [emqa_row("FR0001", picture="yes", link="images/case.png;images/sub.png")])
    data = prepare("europemedqa", raw, tmp_path / "out")
    images = list(data.examples["images"].iloc[0])
    assert [Path(p).name for p in images] == ["case.png", "sub.png"]


def test_europemedqa_duplicate_ids_and_empty_question(tmp_path):
    raw = write_emqa(tmp_path / "raw", [emqa_row("IT0001"), emqa_row("it0001")])
    out = tmp_path / "out"
    assert_cli_error(run_prepare("europemedqa", raw, out), out, "row 2", "'questionID'",
                     "duplicate id 'IT0001'")
    empty = emqa_row("IT0003")
    empty[4] = ""
    raw2 = write_emqa(tmp_path / "raw2", [empty])
    assert_cli_error(run_prepare("europemedqa", raw2, out), out, "row 1", "'question_text'")
