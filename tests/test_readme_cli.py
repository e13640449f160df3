"""The written commands and the CLI agree. Both ways for the two references (the README's
command overview and docs/commands.md): every command and option they show exists and every
command the CLI has is shown. One way for every other `medray ...` line of a bash block in
the README and docs/: its command and options exist. The example configs the README names
load with their own validators. (No Ray: this reads help metadata and YAML only.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from medray.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
COMMANDS_PAGE = (ROOT / "docs" / "commands.md").read_text()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _reference_block(text: str = README, heading: str = "## Command line") -> str:
    section = text.split(heading, 1)[1]
    return section.split("```bash", 1)[1].split("```", 1)[0]


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)


def _commands(block: str) -> list[str]:
    """One string per `medray ...` command, continuation lines (trailing \\) joined."""
    out, current = [], ""
    for line in block.splitlines():
        code = line.split("#", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
        if not code.strip():
            continue
        current = f"{current} {code.rstrip(chr(92))}" if current else code.rstrip(chr(92))
        if not code.endswith("\\"):
            out.append(current.strip())
            current = ""
    # `VAR=value medray ...`: the environment a command needs, then the command
    out = [re.sub(r"^(?:[A-Z_]+=\S+\s+)+", "", c) for c in out]
    return [c for c in out if c.startswith("medray ")]


def _is_group(cmd: Any) -> bool:
    return hasattr(cmd, "commands")  # typer's group class (its own click under the hood)


def _resolve(words: list[str]) -> tuple[list[str], Any]:
    cmd: Any = typer.main.get_command(app)
    path = []
    for word in words[1:]:
        if _is_group(cmd) and word in cmd.commands:
            cmd = cmd.commands[word]
            path.append(word)
        else:
            break
    return path, cmd


def _leaves(cmd: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    if _is_group(cmd):
        return {leaf for name, sub in cmd.commands.items()
                for leaf in _leaves(sub, (*prefix, name))}
    return {prefix}


def _flags(cmd: Any) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}


REFERENCES = {"README.md": _commands(_reference_block()),
              "docs/commands.md": _commands(_reference_block(COMMANDS_PAGE, "# Command reference"))}
WRITTEN = sorted({(path.relative_to(ROOT).as_posix(), line) for path in DOCS
                  for block in _bash_blocks(path.read_text()) for line in _commands(block)})


def test_references_list_commands():
    for where, reference in REFERENCES.items():
        assert len(reference) >= 15, (where, reference)
    assert {where for where, _ in WRITTEN} >= {"README.md", "docs/commands.md",
                                               "docs/training.md", "docs/evaluation.md"}


@pytest.mark.parametrize(("where", "line"), WRITTEN)
def test_every_written_command_and_option_exists(where, line):
    words = shlex.split(line.replace("|", " ").replace("[", " ").replace("]", " "))
    path, cmd = _resolve(words)
    assert path and not _is_group(cmd), f"not a command: {line} ({where})"
    unknown = sorted(set(OPTION.findall(line)) - _flags(cmd))
    assert not unknown, f"`medray {' '.join(path)}` has no option {unknown} ({where}: {line})"


@pytest.mark.parametrize("where", sorted(REFERENCES))
def test_every_cli_command_is_in_each_reference(where):
    shown = {tuple(_resolve(shlex.split(line.replace("|", " ")))[0])
             for line in REFERENCES[where]}
    missing = _leaves(typer.main.get_command(app)) - shown
    assert not missing, f"commands missing from {where}'s reference: {sorted(missing)}"


def test_example_configs_named_in_the_readme_load():
    from medray.eval.config import load_eval_config
    from medray.train.config import load_config
    from medray.tune.space import load_space

    for rel in ("configs/tiny-cpu.yaml", "configs/eval-demo-vllm.yaml",
                "serve/medqaro-cpu.yaml", "tune/spaces/tiny_cpu.yaml"):
        assert rel in README, rel
    assert load_config(ROOT / "configs/tiny-cpu.yaml",
                       ["model.name_or_path=m", "data.path=d"]).scaling.num_workers == 2
    ev = load_eval_config(ROOT / "configs/eval-demo-vllm.yaml")
    assert ev.engine.kind == "vllm" and (ev.actors, ev.max_in_flight) == (2, 4)  # defaults
    # the Serve file checks its model paths when loaded (after `make demo`): YAML here
    assert yaml.safe_load((ROOT / "serve/medqaro-cpu.yaml").read_text())
    assert load_space(ROOT / "tune/spaces/tiny_cpu.yaml").grid_size() == 4


def test_help_shows_whole_option_names():
    """Plain help: option names are never cut (rich panels cut them at 80 columns)."""
    from typer.testing import CliRunner

    res = CliRunner().invoke(app, ["score", "--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0 and "--no-fold-diacritics" in res.output
    assert "…" not in res.output
    res = CliRunner().invoke(app, ["eval", "--help"], env={"COLUMNS": "80"})
    # (help text may wrap after a hyphen: "multiple-" / "choice")
    assert "multiple-choice data only" in " ".join(res.output.split()).replace("- ", "-")
    assert "--chat-template / --no-chat-template" in res.output
