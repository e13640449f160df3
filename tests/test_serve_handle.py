"""The serve engine in-cluster (engine.app: a DeploymentHandle to the QA ingress) against the
same session Serve app over HTTP: the same predictions, the same errors, the same request
counts, one run folder that resumes across the two. Budget ~40 s beyond the app's start."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

APP = "medray"  # the session app's name (tests/conftest.py serve_app)


def _cfg(data: Path, engine: dict, **fields):
    from medray.eval.config import EvalConfig

    return EvalConfig.model_validate({
        "data": str(data), "engine": engine, "actors": 1, "max_in_flight": 3,
        "score": {"resamples": 0, "wordnet": False}, **fields})


def _rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return sorted(rows, key=lambda r: r["id"])


def _stats(serve_app) -> dict[str, int]:
    """The ingress's request counts, once requests still in flight have settled."""
    url, key, _ = serve_app
    last = None
    for _ in range(20):
        now = httpx.get(f"{url}/v1/stats", headers={"Authorization": f"Bearer {key}"}).json()
        if now == last:
            return now
        last = now
        time.sleep(0.5)
    raise AssertionError("request counts did not settle")


def test_the_handle_routes_are_the_ingress_routes():
    from medray.engines.serve_handle import IN_CLUSTER_ROUTES
    from medray.serve.incluster import ROUTES

    assert IN_CLUSTER_ROUTES == tuple(ROUTES)


def test_handle_and_http_give_the_same_run_and_resume_across_them(
        serve_app, medqaro_prepared, tmp_path, monkeypatch):
    from medray.eval.runner import run_eval

    url, key, _ = serve_app
    monkeypatch.setenv("MEDRAY_TEST_KEY", key)
    monkeypatch.delenv("MEDRAY_NO_KEY", raising=False)
    common = {"split": "test_cross", "limit": 6, "prompt": {"context_tokens": 96}}
    http = {"kind": "serve", "url": url, "api_key_env": "MEDRAY_TEST_KEY"}
    # No key at all: in the cluster, the handle path is trusted without one.
    handle = {"kind": "serve", "app": APP, "api_key_env": "MEDRAY_NO_KEY"}
    over_http = run_eval(_cfg(medqaro_prepared, http, **common), tmp_path / "http")
    before = _stats(serve_app)
    in_cluster = run_eval(_cfg(medqaro_prepared, handle, **common), tmp_path / "handle")
    after = _stats(serve_app)
    assert after.get("qa", 0) - before.get("qa", 0) == 6  # counted as the route counts
    assert _rows(tmp_path / "handle") == _rows(tmp_path / "http")
    # as JSON text: NaN (tiny groups) compares equal that way
    assert json.dumps(in_cluster["metrics"]["medqaro"]["metrics"], sort_keys=True) == \
        json.dumps(over_http["metrics"]["medqaro"]["metrics"], sort_keys=True)
    assert in_cluster["run"]["engine_spec"] == f"serve:app:{APP}"

    # One run folder: started over HTTP, cancelled, resumed in-cluster (engine.app only
    # changes how the same endpoint is reached).
    class Cancel(Exception):
        pass

    seen: list[dict] = []

    def stop(row: dict) -> None:
        seen.append(row)
        if len(seen) == 2:
            raise Cancel

    out = tmp_path / "mixed"
    with pytest.raises(Cancel):
        run_eval(_cfg(medqaro_prepared, http, **common), out, on_prediction=stop)
    resumed = run_eval(_cfg(medqaro_prepared, {**http, "app": APP}, **common), out)
    assert {k: resumed["requests"][k] for k in ("selected", "resumed", "requested")} == \
        {"selected": 6, "resumed": 2, "requested": 4}
    assert _rows(out) == _rows(tmp_path / "http")


def test_handle_and_http_give_the_same_mcq_answers(serve_app, robiology_prepared, tmp_path,
                                                   monkeypatch):
    from medray.eval.runner import run_eval

    url, key, _ = serve_app
    monkeypatch.setenv("MEDRAY_TEST_KEY", key)
    engine = {"kind": "serve", "url": url, "api_key_env": "MEDRAY_TEST_KEY", "adapter": "ft"}
    score = {"resamples": 20, "wordnet": False}
    run_eval(_cfg(robiology_prepared, engine, limit=3, score=score), tmp_path / "http")
    run_eval(_cfg(robiology_prepared, {**engine, "app": APP}, limit=3, score=score),
             tmp_path / "handle")
    assert _rows(tmp_path / "handle") == _rows(tmp_path / "http")


def test_the_handle_batch_is_the_http_batch_and_qa_one_by_one(serve_app, client):
    from medray.engines.serve_handle import AppHandle

    handle = AppHandle(APP, timeout=60)
    context = "Pacienta de 54 ani, carcinom mamar stadiul IIA, chimioterapie adjuvanta. " * 8
    body = {"questions": ["Care este stadiul?", "Ce tratament a urmat?"], "context": context,
            "return_prompt_ids": True, "context_tokens": 96}
    status, answer = handle.call("/v1/qa/batch", body)
    resp = client.post("/v1/qa/batch", json=body)
    assert (status, answer) == (resp.status_code, resp.json()) and status == 200
    for q, got in zip(body["questions"], answer["answers"], strict=True):
        status, one = handle.call("/v1/qa", {**{k: v for k, v in body.items()
                                                 if k != "questions"}, "question": q})
        assert status == 200 and {**got, "logprob": None} == {**one, "logprob": None}
        assert got["logprob"] == pytest.approx(one["logprob"], abs=1e-3)


def test_handle_errors_are_the_routes_and_a_missing_app_is_a_clear_error(
        serve_app, medqaro_prepared, client):
    from medray.engines.registry import EngineSpecError
    from medray.engines.serve_handle import AppHandle
    from medray.eval.plan import plan_eval

    handle = AppHandle(APP, timeout=60)
    for path, body in [("/v1/qa", {"question": "", "context": "x"}),
                       ("/v1/mcq", {"question": "q", "kind": "single", "options": []}),
                       ("/v1/qa", {"question": "q", "context": "c", "adapter": "nope"}),
                       ("/v1/qa/batch", {"questions": ["q", " "], "context": "c"}),
                       ("/v1/qa/batch", {"questions": ["q"] * 65, "context": "c"})]:
        status, answer = handle.call(path, body)
        resp = client.post(path, json=body)
        assert (status, answer) == (resp.status_code, resp.json()), path
        assert 400 <= status < 500
    status, answer = handle.call("/v1/completions", {})
    assert status == 404 and "not callable in-cluster" in answer["error"]["message"]

    with pytest.raises(EngineSpecError, match=r"no such Serve application.*running: .*medray"):
        plan_eval(_cfg(medqaro_prepared, {"kind": "serve", "app": "no-such-app"}))
