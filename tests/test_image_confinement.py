"""Image paths: confined to the input folder when prepared, re-checked by the API engines
before a file is read (a bad path never reaches a request)."""

from __future__ import annotations

import json

import pytest
from fakes import FakeAnthropic, FakeOpenAI

from medray.data.images import MAX_IMAGE_BYTES, ImageError, confined_image
from medray.engines.api import ChatRequest, image_b64
from medray.engines.registry import build_engine

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8
SIGNATURES = {"png": PNG, "jpg": b"\xff\xd8\xff\xe0" + b"\x00" * 8, "gif": b"GIF89a" + b"\x00" * 8,
              "webp": b"RIFF\x00\x00\x00\x00WEBPVP8 "}


@pytest.mark.parametrize("kind", sorted(SIGNATURES))
def test_real_images_pass_by_magic_bytes(kind, tmp_path):
    (tmp_path / f"x.{kind}").write_bytes(SIGNATURES[kind])
    assert confined_image(f"x.{kind}", tmp_path) == (tmp_path / f"x.{kind}").resolve()


@pytest.mark.parametrize("link,message", [("../outside.png", "outside"),
                                          ("/etc/hostname", "outside"),
                                          ("link.png", "outside"),
                                          ("text.png", "not a PNG"),
                                          ("big.png", "at most"),
                                          ("missing.png", "not found")])
def test_bad_images_are_refused(link, message, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "outside.png").write_bytes(PNG)
    (root / "link.png").symlink_to(tmp_path / "outside.png")
    (root / "text.png").write_text("hello")
    with (root / "big.png").open("wb") as f:
        f.write(PNG)
        f.truncate(MAX_IMAGE_BYTES + 1)
    with pytest.raises(ImageError, match=message):
        confined_image(link, root)


def test_image_b64_rechecks_without_a_root(tmp_path):
    (tmp_path / "secret").write_text("root:x:0:0")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "case.png").symlink_to(tmp_path / "secret")
    with pytest.raises(ImageError, match="outside"):
        image_b64(str(tmp_path / "d" / "case.png"))
    (tmp_path / "d" / "ok.png").write_bytes(PNG)
    assert image_b64(str(tmp_path / "d" / "ok.png"))[0] == "image/png"


@pytest.mark.parametrize("engine", ["anthropic:claude-3-5-haiku-20241022", "openai:gpt-4o-mini"])
def test_engines_refuse_an_image_outside_the_dataset_root_before_any_request(
        engine, tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    root = tmp_path / "dataset"
    root.mkdir()
    elsewhere = tmp_path / "elsewhere.png"
    elsewhere.write_bytes(PNG)
    fake = FakeAnthropic if engine.startswith("anthropic") else FakeOpenAI
    with fake(responder=lambda body: "IT0001: C") as server:
        eng = build_engine(engine, base_url=server.url, cache=tmp_path / "c.sqlite")
        req = ChatRequest("s", "QuestionID: IT0001\nQ?", (str(elsewhere),), str(root))
        with pytest.raises(ImageError, match="outside"):
            eng.chat([req], max_new_tokens=4)
        assert server.bodies == []


def test_prepared_items_carry_their_image_root(tmp_path, synthetic_europemedqa_raw):
    from medray.data.prepare import prepare

    data = prepare("europemedqa", synthetic_europemedqa_raw, tmp_path / "out")
    with_images = data.examples[data.examples["images"].map(len) > 0]
    assert len(with_images)
    for meta, images in zip(with_images["meta"], with_images["images"], strict=True):
        root = json.loads(meta)["image_root"]
        assert root == str(synthetic_europemedqa_raw.resolve())
        assert all(str(confined_image(p, root)) == p for p in images)
