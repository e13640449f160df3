"""The tiny CPU recipe of docs/getting-started.md, command by command, as a new user types it
(placeholders filled with this session's tiny model and synthetic data), on the session's
Ray cluster. A light test checks that every command that page's recipe shows is one walked
here, so the page and the walk cannot drift apart.

Walked here: data synth / prepare / stats / prompt, model tiny, train (in a subprocess, so
its console is the real one: a few dozen lines, no Ray/DeepSpeed log lines, logs in
OUTPUT/logs/), export (adapter and --merge), baseline, score, eval --config (the documented
example config, in-process vLLM actors) and report, eval --engine (dry run, and the
documented refusal for a local engine on generative data). Covered by their own tests
through the same CLI: tune (test_tune_sweep), serve (test_serve_app), demo (test_demo),
ensemble (test_ensemble), translate (test_mcq_run). Budget: ~4 min on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from medray.cli import app

ROOT = Path(__file__).resolve().parents[1]
# What must never reach the console of a quiet command.
NOISE = re.compile(r"\(pid=|RayTrainWorker|\bINFO\b|\bWARNING\b|\[WARNING\]|Traceback|"
                   r"DeprecationWarning|deepspeed|vllm", re.IGNORECASE)


GUIDE = ROOT / "docs" / "getting-started.md"
# The commands the walk below runs, as (command, subcommand) words.
WALKED = {("data", "synth"), ("data", "prepare"), ("data", "stats"), ("data", "prompt"),
          ("model", "tiny"), ("train",), ("export",), ("baseline",), ("score",), ("eval",),
          ("report",)}


def _documented_recipe() -> list[list[str]]:
    section = GUIDE.read_text().split("## The tiny recipe", 1)[1].split("\n## ", 1)[0]
    lines = re.sub(r"\\\n\s*", " ", "\n".join(re.findall(r"```bash\n(.*?)```", section,
                                                         flags=re.DOTALL))).splitlines()
    return [ln.split("#", 1)[0].split() for ln in lines if ln.startswith("medray ")]


def test_the_documented_recipe_is_the_walked_one():
    commands = _documented_recipe()
    assert len(commands) >= 8, commands
    for words in commands:
        path = tuple(words[1:3]) if words[1] in ("data", "model") else (words[1],)
        assert path in WALKED, f"{GUIDE.name} shows `{' '.join(words)}`, which the walk skips"
    assert any("configs/tiny-cpu.yaml" in words for words in commands)  # the config walked
    assert "configs/eval-demo-vllm.yaml" in (ROOT / "docs" / "evaluation.md").read_text()


def _run(args: list[str], code: int = 0) -> str:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == code, f"medray {' '.join(args)} -> {res.exit_code}\n{res.output}"
    return res.output


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_tiny_recipe_walk(ray_session, tmp_path):
    runs = tmp_path / "runs"
    # the tiny CPU training recipe, from scratch
    assert "wrote synthetic medqaro" in _run(
        ["data", "synth", "--dataset", "medqaro", "--out", str(runs / "raw")])
    assert "prepared medqaro" in _run(["data", "prepare", "--dataset", "medqaro", "--input",
                                       str(runs / "raw"), "--out", str(runs / "data")])
    assert "tiny model in" in _run(["model", "tiny", "--out", str(runs / "tiny-model"),
                                    "--corpus", str(runs / "data")])
    stats = json.loads(_run(["data", "stats", str(runs / "data"), "--json"]))
    assert stats["dataset"] == "medqaro"
    prompt = _run(["data", "prompt", str(runs / "data"), "--id", "test:0"])
    assert prompt.startswith("Intrebare: ") and "Raspuns:" in prompt

    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address,
           "COLUMNS": "120"}
    train = subprocess.run(
        [sys.executable, "-m", "medray", "train", "--config", "configs/tiny-cpu.yaml",
         "--output", str(runs / "tiny-train"), f"model.name_or_path={runs / 'tiny-model'}",
         f"data.path={runs / 'data'}",
         # smaller than the documented run, same command: the suite's time budget
         "data.max_train_examples=64", "data.max_val_examples=16",
         "data.val_generate_examples=4", "optim.epochs=1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    console = train.stdout + train.stderr
    assert train.returncode == 0, console[-3000:]
    lines = [ln for ln in console.splitlines() if ln.strip()]
    assert len(lines) <= 40, console
    assert not [ln for ln in lines if NOISE.search(ln)], console
    assert any(ln.startswith("adapter: ") for ln in lines), console
    assert any(ln.startswith("epoch 1: train_loss") for ln in lines), console
    log = (runs / "tiny-train" / "logs" / "train.log").read_text()
    # the log is the complete record: the person's lines and the Ray/DeepSpeed lines hidden
    assert "medray train" in log and "[medray] preflight ok" in log, log
    assert [ln for ln in log.splitlines() if NOISE.search(ln)], log

    # export: the newest checkpoint's adapter (Ray's snapshot file beside it is skipped)
    assert "adapter from" in _run(["export", str(runs / "tiny-train"),
                                   "--out", str(runs / "tiny-adapter")])
    assert (runs / "tiny-adapter" / "adapter_config.json").is_file()
    assert "merged model" in _run(["export", str(runs / "tiny-train"), "--merge"])
    merged = runs / "tiny-train" / "merged"
    assert (merged / "config.json").is_file()

    # metrics and baselines
    _run(["baseline", "--data", str(runs / "data"), "--kind", "majority",
          "--out", str(runs / "majority.jsonl")])
    scored = _run(["score", "--predictions", str(runs / "majority.jsonl"),
                   "--data", str(runs / "data"), "--mode", "medqaro", "--resamples", "50"])
    assert "dataset=medqaro" in scored and "None" not in scored.splitlines()[0]

    # eval --config: the documented example config (2 vLLM actors, 4 requests in flight: the
    # defaults, which used to abort both actors), pointed at this run's outputs
    ev = yaml.safe_load((ROOT / "configs/eval-demo-vllm.yaml").read_text())
    ev.update(data=str(runs / "data"), limit=6, prompt={"context_tokens": 256})
    ev["engine"]["model"] = str(merged)
    ev["score"]["resamples"] = 50
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(ev))
    out = _run(["eval", "--config", str(tmp_path / "eval.yaml"), "--output",
                str(runs / "eval-ft")])
    assert "mean [95% CI]" in out
    metrics = json.loads((runs / "eval-ft" / "metrics.json").read_text())
    assert metrics["requests"]["written"] == 6 and metrics["run"]["engine"] == "vllm"
    # Two actors share this machine's cores: each runs torch and vLLM on its half.
    half = max(1, min(os.cpu_count() // 2, len(os.sched_getaffinity(0))))
    assert [a["torch_threads"] for a in metrics["requests"]["actors"]] == [half, half]

    report = _run(["report", str(runs / "eval-ft"), "--out", str(runs / "report")])
    assert "| model |" in report and "written:" in report
    assert (runs / "report" / "results.md").is_file()

    # eval --engine: a dry run sends nothing and says the flag a real run needs ...
    dry = _run(["eval", "--engine", "openai:gpt-4o-mini", "--data", str(runs / "data"),
                "--output", str(runs / "api"), "--dry-run", "--sample", "3"])
    assert "a real run would need --allow-external-api" in dry
    assert not (runs / "api").exists()
    # ... and a local engine on generative data says where to go instead (exit 2)
    refused = _run(["eval", "--engine", f"hf:{runs / 'tiny-model'}", "--data",
                    str(runs / "data"), "--output", str(runs / "hf")], code=2)
    assert "multiple-choice" in refused and "--config" in refused
