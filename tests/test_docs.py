"""The docs match the tree: every repository path that docs/*.md or the README's layout
section names exists, and the code cites only documents inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("medray/", "jobs/", "tune/", "serve/", "configs/", "bench/", "tests/", "docs/")


def _missing(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if not any(ROOT.glob(p.rstrip("/"))))


def test_paths_named_in_docs_exist():
    named: set[str] = set()
    for doc in sorted((ROOT / "docs").glob("*.md")):
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
                 and not p.name.startswith(".") and p.name not in ("scripts", "runs")
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
