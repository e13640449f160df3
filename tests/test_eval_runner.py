"""`medray eval`: actors against the served tiny model, resume without re-requests, scoring
identical to `medray score`, baselines through the same command, config validation.

Uses the session's Serve app (see conftest); budget ~100 s beyond its start-up.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from medray.cli import app


def _write_config(path: Path, **fields) -> Path:
    path.write_text(yaml.safe_dump(fields))
    return path


def _serve_engine(serve_app) -> dict:
    url, key, _ = serve_app
    return {"kind": "serve", "url": url, "api_key_env": "MEDRAY_TEST_KEY"}


def _same(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _qa_count(serve_app) -> int:
    """/v1/qa requests the ingress answered, once requests cut off by a cancel have settled."""
    url, key, _ = serve_app
    last = None
    for _ in range(20):
        stats = httpx.get(f"{url}/v1/stats", headers={"Authorization": f"Bearer {key}"}).json()
        count = int(stats.get("qa", 0))
        if count == last:
            return count
        last = count
        time.sleep(1.0)
    raise AssertionError("request count did not settle")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_eval_config_errors_name_the_field(tmp_path, medqaro_prepared):
    cfg = _write_config(tmp_path / "bad.yaml", data=str(medqaro_prepared),
                        engine={"kind": "serve"}, actors=0)
    result = CliRunner().invoke(app, ["eval", "--config", str(cfg), "--output",
                                      str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "bad.yaml" in result.output and "actors" in result.output
    assert "engine" in result.output  # serve engine without url
    assert not (tmp_path / "out").exists()


def test_eval_through_actors_matches_medray_score(serve_app, medqaro_prepared, tmp_path,
                                                  monkeypatch):
    from medray.eval.config import load_eval_config
    from medray.eval.runner import run_eval

    monkeypatch.setenv("MEDRAY_TEST_KEY", serve_app[1])
    cfg = load_eval_config(_write_config(
        tmp_path / "eval.yaml", data=str(medqaro_prepared), split="test",
        engine=_serve_engine(serve_app), prompt={"context_tokens": 128}, actors=2, max_in_flight=4,
        # WordNet off: loading RoWordNet costs ~16 s per scoring process.
        score={"modes": ["medqaro", "robust"], "by": ["question_type"], "resamples": 200,
               "wordnet": False}))
    out = tmp_path / "run"
    summary = run_eval(cfg, out)
    rows = _rows(out / "predictions.jsonl")
    assert len(rows) == summary["run"]["n"] == 164
    assert len({r["id"] for r in rows}) == len(rows)
    for field in ("id", "prediction", "logprob", "n_tokens", "engine", "model", "adapter",
                  "prompt_format", "context_tokens", "raw_output", "conforming"):
        assert field in rows[0]
    assert rows[0]["engine"] == "serve" and rows[0]["context_tokens"] == 128
    saved = json.loads((out / "metrics.json").read_text())
    for mode in ("medqaro", "robust"):
        result = CliRunner().invoke(app, [
            "score", "--predictions", str(out / "predictions.jsonl"), "--data",
            str(medqaro_prepared), "--split", "test", "--mode", mode, "--by", "question_type",
            "--resamples", "200", "--no-wordnet", "--json"])
        assert result.exit_code == 0, result.output
        scored = json.loads(result.stdout.strip().splitlines()[-1])
        # Compared as JSON text: NaN CIs (tiny groups) compare equal that way.
        assert _same(saved["metrics"][mode]["metrics"], scored["metrics"])
        assert _same(saved["metrics"][mode]["by"], scored["by"])
        assert set(scored["metrics"]) >= {"f1", "em", "bleu", "meteor"}


def test_cancelled_run_resumes_without_rerequesting(serve_app, medqaro_prepared, tmp_path,
                                                    monkeypatch):
    from medray.eval.config import load_eval_config
    from medray.eval.runner import run_eval

    monkeypatch.setenv("MEDRAY_TEST_KEY", serve_app[1])
    cfg = load_eval_config(_write_config(
        tmp_path / "eval.yaml", data=str(medqaro_prepared), split="test_cross",
        engine=_serve_engine(serve_app), prompt={"context_tokens": 96}, actors=2, max_in_flight=3,
        limit=30, score={"resamples": 50, "wordnet": False}))
    out = tmp_path / "run"

    class Cancel(Exception):
        pass

    seen = []

    def stop_halfway(row):
        seen.append(row["id"])
        if len(seen) == 12:
            raise Cancel

    with pytest.raises(Cancel):
        run_eval(cfg, out, on_prediction=stop_halfway)
    first = _rows(out / "predictions.jsonl")
    assert len(first) == 12 and not (out / "metrics.json").exists()
    # A crash mid-write leaves a torn last line: it is dropped, not trusted.
    with (out / "predictions.jsonl").open("a") as f:
        f.write('{"id": "test_cross:99", "predic')

    before = _qa_count(serve_app)
    summary = run_eval(cfg, out)
    requested = _qa_count(serve_app) - before
    assert requested == 30 - 12  # finished items were never requested again
    assert {k: summary["requests"][k] for k in ("selected", "resumed", "requested", "written",
                                                "reasked", "actors_replaced")} == \
        {"selected": 30, "resumed": 12, "requested": 18, "written": 18, "reasked": 0,
         "actors_replaced": 0}
    # Where each started actor ran. The resumed 18 items are a few patients, one request
    # each: the first actor up may answer them all before the second has started.
    actors = summary["requests"]["actors"]
    assert len(actors) in (1, 2) and all(a["node_id"] and a["node_ip"] for a in actors)
    rows = _rows(out / "predictions.jsonl")
    assert len(rows) == 30 and len({r["id"] for r in rows}) == 30
    assert [r["id"] for r in rows[:12]] == [r["id"] for r in first]
    assert summary["metrics"]["medqaro"]["n"] == 30

    # Rerunning a finished run requests nothing.
    before = _qa_count(serve_app)
    assert run_eval(cfg, out)["requests"]["requested"] == 0
    assert _qa_count(serve_app) == before


def test_an_actor_lost_mid_run_is_replaced_and_nothing_is_lost_or_written_twice(
        serve_app, medqaro_prepared, tmp_path, monkeypatch):
    import os
    import signal

    import psutil

    from medray.eval.config import load_eval_config
    from medray.eval.runner import run_eval

    monkeypatch.setenv("MEDRAY_TEST_KEY", serve_app[1])
    cfg = load_eval_config(_write_config(
        tmp_path / "eval.yaml", data=str(medqaro_prepared), split="test_cross",
        engine=_serve_engine(serve_app), prompt={"context_tokens": 96}, actors=2, max_in_flight=4,
        # The whole split: six patients, one request each, so calls are still running
        # after the first answer.
        score={"resamples": 50, "wordnet": False}))
    killed: list[int] = []

    def kill_one_actor(row: dict) -> None:
        if killed:
            return
        # An evaluation actor's process in the middle of a call (Ray titles it
        # ray::EvalWorker.predict then), as a crash or a lost node ends it: its call fails.
        # One still starting holds no work; if none is answering now, try at the next answer.
        pids = [p.pid for p in psutil.process_iter(["cmdline"])
                if any("ray::EvalWorker.predict" in part for part in p.info["cmdline"] or ())]
        if pids:
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])

    out = tmp_path / "run"
    summary = run_eval(cfg, out, on_prediction=kill_one_actor)
    assert killed, "no evaluation actor was ever seen answering"
    rows = _rows(out / "predictions.jsonl")
    assert len(rows) == 84 and len({r["id"] for r in rows}) == 84
    requests = summary["requests"]
    assert requests["actors_replaced"] == 1 and requests["written"] == 84
    # the lost actor's unanswered items were asked once more, and written once
    assert requests["reasked"] >= 1 and requests["requested"] == 84 + requests["reasked"]
    # the replacement is listed once it has started: the live actor may finish first
    assert len(requests["actors"]) in (2, 3) and all(a["node_id"] for a in requests["actors"])
    assert summary["metrics"]["medqaro"]["n"] == 84


def test_baselines_go_through_eval(ray_session, medqaro_prepared, tmp_path):
    """Majority and random-token baselines give the same rows as `medray baseline`."""
    out = tmp_path / "maj"
    cfg = _write_config(tmp_path / "maj.yaml", data=str(medqaro_prepared),
                        engine={"kind": "baseline", "baseline": "random-token", "seed": 3},
                        score={"resamples": 50, "wordnet": False})
    result = CliRunner().invoke(app, ["eval", "--config", str(cfg), "--output", str(out)])
    assert result.exit_code == 0, result.output
    ref = tmp_path / "ref.jsonl"
    result = CliRunner().invoke(app, ["baseline", "--data", str(medqaro_prepared), "--kind",
                                      "random-token", "--seed", "3", "--out", str(ref)])
    assert result.exit_code == 0, result.output
    by_id = {r["id"]: r["prediction"] for r in _rows(ref)}
    got = {r["id"]: r["prediction"] for r in _rows(out / "predictions.jsonl")}
    assert got == by_id
    summary = json.loads((out / "metrics.json").read_text())
    assert summary["run"]["model"] == "random-token"
    assert 0 <= summary["metrics"]["medqaro"]["metrics"]["f1"]["mean"] < 0.5


def test_patient_calls_pack_whole_patients_and_split_only_the_too_large():
    from medray.eval.plan import patient_calls

    sizes = {"a": 2, "b": 3, "c": 1, "d": 7, "e": 2, "f": 4}
    rows = [{"context_id": cid, "n": n} for cid, k in sizes.items() for n in range(k)]
    calls = patient_calls(rows, 5)
    assert [[(r["context_id"], r["n"]) for r in c] for c in calls] == [
        [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)],
        [("c", 0)],
        [("d", n) for n in range(5)],
        [("d", 5), ("d", 6), ("e", 0), ("e", 1)],
        [("f", n) for n in range(4)],
    ]


@pytest.mark.parametrize(("fmt", "kind"), [("eqa", "vllm"), ("qea", "vllm"), ("eqa", "hf")])
def test_engine_calls_keep_a_patients_items_together(medqaro_prepared, tiny_model, fmt, kind):
    """Engines get a patient's questions together (vLLM with E+Q+A: one call per patient,
    so its prefix cache computes the epicrisis once); nothing is lost or duplicated."""
    import random

    from medray.eval.config import EvalConfig
    from medray.eval.plan import CALL, PATIENT_CALL, plain_row, plan_eval

    cfg = EvalConfig.model_validate({
        "data": str(medqaro_prepared), "split": "test",
        "engine": {"kind": kind, "model": str(tiny_model)},
        "prompt": {"format": fmt, "context_tokens": 128}})
    plan = plan_eval(cfg)
    rows = [plain_row(r) for r in plan.asked.to_dict("records")]
    shuffled = random.Random(0).sample(rows, len(rows))  # e.g. what a resume leaves
    calls = plan.engine_calls(shuffled)
    flat = [r["id"] for call in calls for r in call]
    assert sorted(flat) == sorted(r["id"] for r in rows) and len(set(flat)) == len(flat)
    patients = [r["context_id"] for call in calls for r in call]
    # each patient's items are contiguous, patients in order of first appearance
    runs = [cid for i, cid in enumerate(patients) if i == 0 or cid != patients[i - 1]]
    assert len(runs) == len(set(runs))
    assert runs == list(dict.fromkeys(r["context_id"] for r in shuffled))
    if (fmt, kind) == ("eqa", "vllm"):
        # whole patients packed into calls: no patient split, fewer calls than patients
        assert all(len(call) <= PATIENT_CALL for call in calls)
        assert len(runs) == len({(i, r["context_id"]) for i, c in enumerate(calls) for r in c})
        assert len(calls) < len(runs)
    else:
        assert all(len(call) <= CALL for call in calls)
        assert sum(len(c) == CALL for c in calls) == len(rows) // CALL
