"""EuropeMedQA's published Parquet form: the JSON form's or the table's columns, images
embedded as Hugging Face `Image`s ({bytes, path}). It prepares to the same examples as the
equivalent JSON/CSV + image folder, its images land in the prepared folder, and bad Parquet
exits 2 naming the file, row and field."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from typer.testing import CliRunner

from medray.cli import app
from medray.data.prepared import load_prepared

runner = CliRunner()
HF_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
OPTIONS = ["uno", "due", "tre", "quattro", "cinque"]


def png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (6, 4), color).save(buf, format="PNG")
    return buf.getvalue()


IMAGES = {"case1.png": png((200, 0, 0)), "case2.png": png((0, 200, 0)),
          "case3.png": png((0, 0, 200))}


def json_records() -> list[dict]:
    def rec(qid: str, letter: str, images: list[str], nullified: bool = False) -> dict:
        return {"id": qid, "question": f"Domanda {qid}?", "language": None,
                "options": [{"letter": x, "text": f"{t} {qid}"} for x, t in
                            zip("ABCDE", OPTIONS, strict=True)],
                "correct_answer": {"letter": letter, "index": "ABCDE".index(letter[0])},
                "specialty": "cardiologia", "has_image": bool(images), "images": images,
                "metadata": {"test_year": 2021, "number_in_test": int(qid[-1]),
                             "nullified": nullified}}

    return [rec("IT0001", "B", []), rec("IT0002", "C", ["images/case1.png"]),
            rec("FR0003", "A, D", ["images/case2.png", "images/case3.png"]),
            rec("ES0004", "E", []), rec("PT0005", "A", ["images/case1.png"], nullified=True)]


def write_image_folder(raw: Path) -> None:
    (raw / "images").mkdir(parents=True)
    for name, data in IMAGES.items():
        (raw / "images" / name).write_bytes(data)


def hf_images(links: list[str]) -> list[dict]:
    return [{"bytes": IMAGES[Path(link).name], "path": Path(link).name} for link in links]


def json_parquet(path: Path, records: list[dict], *, image_type: pa.DataType | None = None
                 ) -> None:
    rows = [{**r, "images": hf_images(r["images"])} for r in records]
    table = pa.Table.from_pylist(rows)
    index = table.schema.get_field_index("images")
    table = table.set_column(index, "images", pa.array([r["images"] for r in rows],
                                                       image_type or pa.list_(HF_IMAGE)))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def prepare(raw: Path, out: Path) -> None:
    result = runner.invoke(app, ["data", "prepare", "-d", "europemedqa", "-i", str(raw),
                                 "--out", str(out)])
    assert result.exit_code == 0, (result.output, result.exception)


def comparable(out: Path) -> tuple[list[dict], dict]:
    """The examples with each image as its bytes' hash (not its path), and the manifest's
    removal and shuffle records."""
    data = load_prepared(out)
    rows = []
    for ex in data.examples.to_dict("records"):
        meta = json.loads(ex["meta"])
        assert Path(meta.pop("image_root")).is_dir()
        for image in ex["images"]:
            assert Path(image).is_file()
        images = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in ex["images"]]
        rows.append({**ex, "images": images, "meta": meta,
                     "options": [dict(o) for o in ex["options"]],
                     "answer": list(ex["answer"])})
    return rows, {k: data.manifest[k] for k in ("removed", "shuffle", "splits")}


def test_json_form_parquet_prepares_like_the_json_and_its_image_folder(tmp_path):
    records = json_records()
    raw_json = tmp_path / "json"
    write_image_folder(raw_json)
    (raw_json / "questions.json").write_text(json.dumps(records))
    prepare(raw_json, tmp_path / "from_json")
    # Two shards in a folder, images embedded (no image folder beside them).
    shards = tmp_path / "parquet"
    json_parquet(shards / "test-00000-of-00002.parquet", records[:2])
    json_parquet(shards / "test-00001-of-00002.parquet", records[2:])
    prepare(shards, tmp_path / "from_parquet")
    expected, parquet = comparable(tmp_path / "from_json"), comparable(tmp_path / "from_parquet")
    assert parquet == expected
    assert expected[1]["removed"]["no_validated_key"] == 1
    assert sum(len(r["images"]) for r in expected[0]) == 3
    # The images live in the prepared folder, once per distinct image, named by content.
    out = tmp_path / "from_parquet"
    stored = sorted(p.name for p in (out / "images").iterdir())
    assert len(stored) == 3 and load_prepared(out).manifest["embedded_images"]["n"] == 3
    for ex in load_prepared(out).examples.itertuples():
        root = Path(json.loads(ex.meta)["image_root"])
        assert root == out.resolve() and all(Path(p).parent == root / "images" for p in ex.images)


def test_table_form_parquet_with_one_image_column_prepares_like_the_csv(tmp_path):
    columns = ["questionID", "testyear", "numberintest", "picture_provided", "question_text",
               "picture_link", "option_a", "option_b", "option_c", "option_d", "option_e",
               "correct_option", "correct_fulltext"]
    rows = [["IT0001", "2020", "1", "no", "Domanda uno?", "N/A", *OPTIONS, "B", ""],
            ["IT0002", "2020", "2", "yes", "Domanda due?", "images/case1.png", *OPTIONS, "tre",
             ""],
            ["ES0003", "2020", "3", "no", "Domanda tre?", "N/A", *OPTIONS, "", ""]]
    raw_csv = tmp_path / "csv"
    write_image_folder(raw_csv)
    pd.DataFrame(rows, columns=columns).to_csv(raw_csv / "europemedqa.csv", index=False)
    prepare(raw_csv, tmp_path / "from_csv")
    frame = pd.DataFrame(rows, columns=columns).drop(columns=["picture_link"])
    table = pa.Table.from_pandas(frame, preserve_index=False).append_column(
        "image", pa.array([None, {"bytes": IMAGES["case1.png"], "path": "x.png"}, None],
                          HF_IMAGE))
    pq.write_table(table, tmp_path / "europemedqa.parquet")
    prepare(tmp_path / "europemedqa.parquet", tmp_path / "from_parquet")
    assert comparable(tmp_path / "from_parquet") == comparable(tmp_path / "from_csv")
    assert comparable(tmp_path / "from_csv")[1]["removed"]["no_validated_key"] == 1


def _not_parquet(raw: Path) -> None:
    (raw / "test.parquet").write_text("id,question\nIT0001,Domanda?\n")


def _missing_column(raw: Path) -> None:
    records = [{k: v for k, v in r.items() if k != "options"} for r in json_records()]
    json_parquet(raw / "test.parquet", records)


def _not_an_image(raw: Path) -> None:
    records = json_records()
    json_parquet(raw / "test.parquet", records)
    table = pq.read_table(raw / "test.parquet")
    images = table.column("images").to_pylist()
    images[2][1]["bytes"] = b"GIF? no: plain text"
    table = table.set_column(table.schema.get_field_index("images"), "images",
                             pa.array(images, pa.list_(HF_IMAGE)))
    pq.write_table(table, raw / "test.parquet")


def _no_bytes_no_path(raw: Path) -> None:
    records = json_records()
    json_parquet(raw / "test.parquet", records)
    table = pq.read_table(raw / "test.parquet")
    images = table.column("images").to_pylist()
    images[1][0] = {"bytes": None, "path": None}
    table = table.set_column(table.schema.get_field_index("images"), "images",
                             pa.array(images, pa.list_(HF_IMAGE)))
    pq.write_table(table, raw / "test.parquet")


BAD = {
    "not-parquet": (_not_parquet, ("test.parquet", "not a Parquet file")),
    "missing-column": (_missing_column, ("test.parquet", "'options'", "required column")),
    "not-an-image": (_not_an_image, ("test.parquet", "row 3", "'images'", "FR0003",
                                     "not a PNG")),
    "no-bytes-no-path": (_no_bytes_no_path, ("test.parquet", "row 2", "'images'", "IT0002",
                                             "no bytes and no path")),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_parquet_exits_2_naming_file_row_and_field(case, tmp_path):
    good = tmp_path / "good"
    json_parquet(good / "test.parquet", json_records())
    out = tmp_path / "out"
    prepare(good, out)
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*")
              if p.is_file() and out in p.parents}
    raw = tmp_path / "raw"
    raw.mkdir()
    mutate, fragments = BAD[case]
    mutate(raw)
    result = runner.invoke(app, ["data", "prepare", "-d", "europemedqa", "-i", str(raw),
                                 "--out", str(out)])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.output, (fragment, result.output)
    after = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*")
             if p.is_file() and out in p.parents}
    assert after == before
