"""The docs match the tree: every repository path that docs/ or the README's layout section
names exists, the manual builds with `mkdocs build --strict` (no broken link, no page
missing), the measured numbers on docs/results.md and in the README are what
bench/render_results.py makes of docs/results/*.json now, and the README and docs speak
about medray and its users' machines, not about the one they were written on."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("medray/", "jobs/", "tune/", "serve/", "configs/", "bench/", "tests/", "docs/")
DOCS = sorted((ROOT / "docs").rglob("*.md"))


def _missing(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if not any(ROOT.glob(p.rstrip("/"))))


def test_paths_named_in_docs_exist():
    named: set[str] = set()
    for doc in DOCS:
        for token in re.findall(r"`([^`\s]+)`", doc.read_text()):
            if token.startswith(TOP):
                named.add(token)
    assert named, "docs/ names no repository path"
    assert not _missing(named), f"docs/ names paths that do not exist: {_missing(named)}"


def test_readme_layout_matches_the_tree():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```")[1]
    named: set[str] = set()
    parent = ""
    for line in block.splitlines():
        if not line.strip():
            continue
        nested = line.startswith("  ")
        names = line.strip().split("  ")[0].split()  # the path column, then the note
        if not nested:
            parent = names[0] if names[0] == "medray/" else ""
        for name in names:
            named.add(f"{parent}{name}" if nested else name)
    assert "medray/cli/" in named and "docs/" in named
    assert not _missing(named), f"README layout names paths that do not exist: {_missing(named)}"
    top_level = {p.name + "/" for p in ROOT.iterdir() if p.is_dir()
                 and not p.name.startswith(".") and p.name not in ("scripts", "runs", "site")
                 and not p.name.endswith(".egg-info")}
    unlisted = sorted(top_level - named)
    assert not unlisted, f"folders missing from the README layout: {unlisted}"


def test_code_cites_only_documents_in_the_repository():
    pattern = re.compile(r"DESIGN\.md|\.\./shared|(?<!docs/)benchmarks\.md|\bissue \d|"
                         r"\bticket\b", re.IGNORECASE)
    offenders = []
    for folder in ("medray", "jobs", "tune", "serve", "bench", "configs", "tests"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".yaml", ".yml") or path.name == "test_docs.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), start=1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def _renderer():
    spec = importlib.util.spec_from_file_location("render_results",
                                                  ROOT / "bench" / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mkdocs_builds_strict(tmp_path):
    """Every page is in the nav and every link and anchor resolves (strict: warnings fail)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                          "--config-file", str(ROOT / "mkdocs.yml"),
                          "--site-dir", str(tmp_path / "site")],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    # --quiet would hide the warnings that --strict counts, so the log is read too
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "WARNING" not in res.stderr, res.stderr[-3000:]
    assert (tmp_path / "site" / "results" / "index.html").is_file()
    assert (tmp_path / "site" / "getting-started" / "index.html").is_file()


@pytest.mark.parametrize("path", sorted((ROOT / "docs" / "results").glob("*.json")),
                         ids=lambda p: p.name)
def test_every_results_file_names_its_commit_date_and_machine(path):
    record = json.loads(path.read_text())
    for key in ("bench", "command", "commit", "date", "machine", "results"):
        assert record.get(key), f"{path.name}: no {key}"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", record["date"]), record["date"]
    assert record["machine"].get("cpu") and record["machine"].get("logical_cpus"), path.name
    assert record["command"].startswith("bench/"), record["command"]


def test_renderer_refuses_a_results_file_without_its_commit(tmp_path):
    render = _renderer()
    good = {"bench": "x", "command": "bench/x.py", "commit": "abc1234", "date": "2030-01-01",
            "machine": {"cpu": "some CPU", "logical_cpus": 4}, "results": {"headline": "h"}}
    (tmp_path / "x.json").write_text(json.dumps(good))
    assert [r["bench"] for r in render.load_records(tmp_path)] == ["x"]
    for key in ("commit", "date", "machine"):
        (tmp_path / "x.json").write_text(json.dumps({**good, key: None}))
        with pytest.raises(render.ResultsError, match=key):
            render.load_records(tmp_path)


def test_results_page_and_readme_are_rendered_from_the_json_now_in_docs_results():
    """Hand edits and a results file added without rendering both fail here."""
    render = _renderer()
    records = render.load_records()
    assert (ROOT / "docs" / "results.md").read_text() == render.render_page(records), (
        "docs/results.md is stale: run bench/render_results.py")
    readme = (ROOT / "README.md").read_text()
    assert render.readme_with(readme, render.render_headlines(records)) == readme, (
        "the README's measured numbers are stale: run bench/render_results.py")
    page = (ROOT / "docs" / "results.md").read_text()
    for record in records:
        assert f"commit `{record['commit']}`" in page and record["date"] in page


def _prose(path: Path) -> str:
    """What a person wrote: the README without its generated block, a page of docs/."""
    text = path.read_text()
    render = _renderer()
    if render.BEGIN in text:
        head, rest = text.split(render.BEGIN, 1)
        text = head + rest.split(render.END, 1)[1]
    return text


# Phrases about the machine the text was written on, not about medray or a user's machine.
ENVIRONMENT = re.compile(r"\bworkplace\b|\bthis machine\b|\bthis environment\b|/opt/pypi|"
                         r"\bhere \(\d+ (?:cores?|CPUs?)\)|\bour (?:machine|box)\b",
                         re.IGNORECASE)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


@pytest.mark.parametrize("path", [ROOT / "README.md", *DOCS],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs_speak_to_users_without_run_histories(path):
    text = _prose(path)
    hits = [m.group(0) for m in ENVIRONMENT.finditer(text)]
    assert not hits, f"{path.name} talks about the machine it was written on: {hits}"
    if path.name != "results.md":  # generated: every section has its date
        dates = DATE.findall(text)
        assert not dates, (f"{path.name}: dated measurements belong in docs/results/ "
                           f"(bench/_results.py), not in prose: {dates}")


def test_readme_is_a_landing_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200 and len(text.split()) <= 2000
    assert "make demo" in text and "make test" in text
    links = re.findall(r"\]\(((?!https?://|#)[^)#\s]+)", text)
    assert any(link.endswith(".png") for link in links), "the README shows the demo's report"
    missing = sorted({link for link in links if not (ROOT / link).exists()})
    assert not missing, f"README links to files that do not exist: {missing}"
    cells = [c for line in text.splitlines() if line.startswith("|")
             for c in line.strip("|").split("|")]
    assert max(len(c) for c in cells) <= 200, "table cells stay short; details go to docs/"
