"""scripts/provision_wordnet.sh: copies (no links) + lexnames, idempotent. Budget: ~2 s."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "provision_wordnet.sh"


def _run(venv: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(venv)], capture_output=True, text=True,
                          timeout=300)


def test_provision_copies_files_and_writes_lexnames(tmp_path):
    if not Path("/usr/share/wordnet/data.noun").is_file() and os.geteuid() != 0:
        pytest.skip("no /usr/share/wordnet and not root: the script would only warn")
    venv = tmp_path / "venv"
    venv.mkdir()
    first = _run(venv)
    assert first.returncode == 0, first.stderr
    dest = venv / "nltk_data" / "corpora" / "wordnet"
    if not (dest / "data.noun").exists():
        assert "WARNING" in first.stderr  # apt impossible here: warned, exit 0
        return
    files = sorted(p.name for p in dest.iterdir())
    assert {"data.noun", "index.noun", "noun.exc", "lexnames", "index.sense"} <= set(files)
    assert not any((dest / f).is_symlink() for f in files)
    lex = (dest / "lexnames").read_text().splitlines()
    assert len(lex) == 45
    assert [int(line.split()[0]) for line in lex] == list(range(45))
    assert lex[3].split()[1:] == ["noun.Tops", "1"] and lex[44].split()[1:] == ["adj.ppl", "3"]
    second = _run(venv)
    assert second.returncode == 0 and sorted(p.name for p in dest.iterdir()) == files


def test_missing_venv_warns_and_exits_0(tmp_path):
    res = _run(tmp_path / "absent")
    assert res.returncode == 0 and "WARNING" in res.stderr
