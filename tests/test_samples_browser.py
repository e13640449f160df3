"""samples.html in a real headless Chromium (Debian's /usr/bin/chromium, driven by
playwright): rows, filters, sort, search, the epicrisis, a screenshot, no request leaves
the page, `</script>` in clinical text, and 20,000 items filtered within seconds (~20 s)."""

from __future__ import annotations

import json
import re
import shutil
import struct
import time
from pathlib import Path

import pytest

from medray.eval.samples_page import PAGE_SIZE, render_page

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (scripts/install.sh installs Debian's "
                    "chromium where apt-get is available)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the dev extra)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Page:
    """One opened samples.html; every request the page makes is recorded."""

    def __init__(self, browser, path: Path) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready='1']", timeout=10_000)

    def shown(self) -> int:
        return int(self.page.get_attribute("#count", "data-shown"))

    def rows(self) -> int:
        return self.page.locator("#rows tr.item").count()

    def select(self, selector: str, value: str) -> None:
        self.page.select_option(selector, value)

    def search(self, text: str, expect: int) -> None:
        self.page.fill("#search", text)
        # polled from here: the page's CSP forbids the eval that wait_for_function uses
        deadline = time.monotonic() + 5
        while self.page.get_attribute("#count", "data-query") != text:
            assert time.monotonic() < deadline, f"search {text!r} not applied in 5 s"
            self.page.wait_for_timeout(20)
        assert self.shown() == expect, (text, self.shown(), expect)


def _data(path: Path) -> dict:
    html = path.read_text()
    raw = re.search(r'<script type="application/json" id="medray-data">(.*?)</script>',
                    html, re.S).group(1)
    return json.loads(raw)


def test_samples_page_of_a_real_report(browser, baseline_report, tmp_path):
    path = baseline_report["out"] / "samples.html"
    data = _data(path)
    items = data["items"]
    p = Page(browser, path)
    assert p.errors == []
    assert p.shown() == len(items) == 212
    assert p.rows() == PAGE_SIZE  # a page at a time
    p.page.click("#next")
    p.page.click("#next")
    assert p.rows() == len(items) - 2 * PAGE_SIZE
    assert "page 3 of 3" in p.page.inner_text("#page")

    # one dataset: all its rows on one page
    p.select("#filter-dataset", "europemedqa")
    assert p.shown() == p.rows() == 48
    # wrong only, for the multiple-choice run: the count from its own files
    runs = baseline_report["runs"]
    gold = {r["id"]: sorted(r["answer"]) for r in
            map(json.loads, (runs["emq-random"] / "references.jsonl").open())}
    wrong = sum(sorted(r["prediction"]) != gold[r["id"]] for r in
                map(json.loads, (runs["emq-random"] / "predictions.jsonl").open()))
    p.select("#run", "0")
    p.select("#outcome", "wrong")
    assert p.shown() == p.rows() == wrong and 0 < wrong < 48
    assert set(p.page.locator("#rows tr.item td:nth-child(4) .score").all_inner_texts()) \
        == {"wrong 0"}
    p.select("#outcome", "")
    p.select("#filter-dataset", "")

    # a question type of MedQARo, then its items sorted by the generative run's F1
    binary = sum(it["f"].get("question_type") == "binary" for it in items)
    p.select("#filter-question_type", "binary")
    assert p.shown() == binary > 0
    p.select("#filter-question_type", "")
    p.select("#filter-dataset", "medqaro")
    p.select("#run", "1")
    p.select("#sort", "desc")
    best = max(it["r"][1][1] for it in items if it["r"][1])
    first = p.page.locator("#rows tr.item").first.locator("td").nth(4)
    assert first.locator(".score").inner_text().endswith(f" {best:g}") and best > 0

    # the epicrisis is collapsed, and opens on a click
    details = p.page.locator("#rows tr.item details").first
    assert not details.evaluate("d => d.open")
    details.locator("summary").click()
    ctx_id = details.locator("summary").inner_text().split("(")[1].rstrip(")")
    assert details.locator(".ctx").inner_text() == data["contexts"][ctx_id].strip()
    p.select("#sort", "")
    p.select("#filter-dataset", "")

    # search over id, question, reference and answers (case-insensitive)
    target = items[3]
    needle = target["q"][5:30].upper()
    expect = sum(needle.lower() in "\n".join(
        [it["id"], it["q"], it["ref"], " ".join(it.get("opts", [])),
         " ".join(a[0] for a in it["r"] if a)]).lower() for it in items)
    p.search(needle, expect)
    assert 1 <= p.rows() <= expect
    assert target["id"] in p.page.locator("#rows tr.item").all_inner_texts()[0] or expect > 1
    p.search("no such text anywhere 12345", 0)
    p.search("", len(items))

    shot = tmp_path / "samples.png"
    p.page.screenshot(path=str(shot), full_page=False)
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert struct.unpack(">II", png[16:24]) == (1400, 900)
    assert p.requests == [p.url] and p.errors == []  # nothing but the file itself


def _synthetic(n: int) -> dict:
    types = ("binary", "extractive", "reasoning")
    items = []
    for i in range(n):
        ok = i % 3 == 0
        items.append({"id": f"test:{i}", "q": f"Question {i} about item {i % 97}?",
                      "ref": "Da" if i % 2 else "Nu", "ctx": f"c{i % 50}",
                      "f": {"split": "test", "question_type": types[i % 3]},
                      "r": [["Da", 1.0 if ok else 0.0, "right" if ok else "wrong", False],
                            [f"answer {i}", 0.5, "partial", False]]})
    return {"runs": [{"name": "a", "kind": "generative", "metric": "token F1", "model": "m"},
                     {"name": "b", "kind": "generative", "metric": "token F1", "model": "m"}],
            "fields": ["split", "question_type"],
            "contexts": {f"c{j}": "EPICRIZĂ " * 200 for j in range(50)}, "items": items}


def test_twenty_thousand_items_load_and_filter_quickly(browser, tmp_path):
    n = 20_000
    path = tmp_path / "samples.html"
    path.write_text(render_page(_synthetic(n)))
    start = time.monotonic()
    p = Page(browser, path)
    loaded = time.monotonic() - start
    assert p.shown() == n and p.rows() == PAGE_SIZE and loaded < 5, loaded
    start = time.monotonic()
    p.select("#filter-question_type", "reasoning")
    p.select("#outcome", "right")  # run a: i % 3 == 0, never a reasoning item (i % 3 == 2)
    assert p.shown() == 0
    p.select("#filter-question_type", "binary")
    assert p.shown() == n // 3 + 1
    p.select("#sort", "asc")
    p.search("item 96?", len([i for i in range(0, n, 3) if i % 97 == 96]))
    assert time.monotonic() - start < 5
    assert p.errors == [] and p.requests == [p.url]


def test_script_tags_in_clinical_text_stay_text(browser, tmp_path):
    evil = "</script><script>window.pwned = 1</script><!-- <img src=x onerror=alert(1)>"
    data = _synthetic(3)
    data["items"][1]["q"] = evil
    data["contexts"]["c1"] = evil
    data["unread"] = [{"run": "gone", "why": "no predictions.jsonl"}]
    path = tmp_path / "samples.html"
    path.write_text(render_page(data, title="</title><script>window.pwned = 2</script>"))
    p = Page(browser, path)
    assert p.shown() == p.rows() == 3
    assert p.page.evaluate("window.pwned === undefined")
    assert p.page.inner_text("#unread") == "not shown: gone (no predictions.jsonl)"
    row = p.page.locator("#rows tr.item").nth(1)
    assert row.locator(".q").inner_text() == evil
    row.locator("summary").click()
    assert row.locator(".ctx").inner_text() == evil
    assert p.page.locator("img").count() == 0 and p.errors == [] and p.requests == [p.url]
