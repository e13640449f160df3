"""lm-evaluation-harness itself (`local-completions`, token-id log-likelihood requests)
against the session's Serve app: with `max_length` set to the served window (the documented
setting: lm-eval scores at most max_length - 1 tokens and asks for one new token) it
completes a multiple-choice task on the real EuropeMedQA slice; with a larger `max_length`
(lm-eval's default 2,048 against a 512-token window, say) an item over the window fails
with an error that names the limit and the prompt's length.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: query
doc_to_choice: choices
doc_to_target: gold
metric_list:
  - metric: acc
"""


def _task(folder: Path, name: str, docs: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
    (folder / f"{name}.yaml").write_text(TASK.format(name=name, data=data))
    return folder


def _slice_docs(shared_data: Path, n: int) -> list[dict]:
    items = json.loads((shared_data / "europemedqa" / "ssm_questions_text_only.json")
                       .read_text())[:n]
    return [{"query": "\n".join([it["question"], *[f"{o['letter']}. {o['text']}"
                                                   for o in it["options"]], "Risposta:"]),
             "choices": [o["letter"] for o in it["options"]],
             "gold": it["correct_answer"]["index"]} for it in items]


def _lm_eval(serve_app, tasks: Path, name: str, max_length: int, out: Path,
             concurrent: int = 2) -> subprocess.CompletedProcess:
    url, key, cfg = serve_app
    args = ",".join(["model=medray", f"base_url={url}/v1/completions",
                     f"num_concurrent={concurrent}",
                     "max_retries=1", "tokenized_requests=True",
                     "tokenizer_backend=huggingface", f"tokenizer={cfg.model}",
                     f"max_length={max_length}"])
    env = {**os.environ, "OPENAI_API_KEY": key, "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
         args, "--tasks", name, "--include_path", str(tasks), "--output_path", str(out),
         "--seed", "0"],
        capture_output=True, text=True, env=env, timeout=600)


def test_lm_eval_local_completions_runs_the_europemedqa_slice(serve_app, shared_data,
                                                              tmp_path):
    _, _, cfg = serve_app
    tasks = _task(tmp_path / "tasks", "emqa_slice", _slice_docs(shared_data, 12))
    res = _lm_eval(serve_app, tasks, "emqa_slice", cfg.max_model_len, tmp_path / "out")
    assert res.returncode == 0, res.stderr[-3000:]
    (results,) = list((tmp_path / "out").rglob("results_*.json"))
    scores = json.loads(results.read_text())
    assert scores["n-samples"]["emqa_slice"]["effective"] == 12
    assert 0.0 <= scores["results"]["emqa_slice"]["acc,none"] <= 1.0


def test_lm_eval_past_the_window_gets_an_error_naming_the_limit(serve_app, tmp_path):
    from transformers import AutoTokenizer

    _, _, cfg = serve_app
    tok = AutoTokenizer.from_pretrained(cfg.model)
    words = "Pacientul prezinta adenopatii axilare stangi si metastaze hepatice. "
    long_text = words * (2 * cfg.max_model_len // len(tok.encode(words)) + 20)
    assert len(tok.encode(long_text)) > 2 * cfg.max_model_len
    tasks = _task(tmp_path / "tasks", "too_long",
                  [{"query": long_text + "Raspuns:", "choices": ["Da", "Nu"], "gold": 0}])
    # One request at a time: lm-eval stops at its first failed request and drops any other
    # in flight (Serve's proxy logs that one as 499, the client closing it; lm-eval then
    # prints "Server disconnected" for it), which would hide what the server answered.
    res = _lm_eval(serve_app, tasks, "too_long", 2 * cfg.max_model_len, tmp_path / "out",
                   concurrent=1)
    log = res.stdout + res.stderr
    (tmp_path / "lm_eval.log").write_text(log)
    assert res.returncode != 0, log[-3000:]
    assert "invalid_request_error" in log, log[-3000:]
    assert f"{cfg.max_model_len}" in log and "Server disconnected" not in log, log[-3000:]
