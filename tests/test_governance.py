"""Clinical context (MedQARo) reaches an external provider only with --allow-external-api,
checked before any call; the decision is recorded in the run outputs. Also the usage errors
of `medray eval` (--config XOR --engine). Budget: ~15 s."""

from __future__ import annotations

import json

import pytest
from fakes import FakeAnthropic, FakeOpenAI
from typer.testing import CliRunner

from medray.cli import app
from medray.eval.governance import GovernanceError, check_external_use

SECRET = "sk-test-GOVERNANCE-9c1e"


@pytest.fixture(autouse=True)
def _keys(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


def test_rule():
    for engine in ("openai:gpt-4o-mini", "anthropic:claude-sonnet-4-5"):
        with pytest.raises(GovernanceError, match="--allow-external-api"):
            check_external_use("medqaro", engine, allow_external_api=False)
        assert check_external_use("medqaro", engine, True)["allow_external_api"] is True
        for public in ("robiology", "europemedqa"):
            assert check_external_use(public, engine, False)["flag_required"] is False
    # a local engine keeps the data on the machine: no flag needed
    assert check_external_use("medqaro", "hf:/models/tiny", False)["external_provider"] is False
    # a loopback base URL is no exemption: it may be a proxy to the provider
    with pytest.raises(GovernanceError):
        check_external_use("medqaro", "openai:m", False, base_url="http://127.0.0.1:9")


@pytest.mark.parametrize("fake,provider", [(FakeAnthropic, "anthropic"), (FakeOpenAI, "openai")])
def test_cli_refuses_medqaro_without_flag_before_any_call(medqaro_prepared, tmp_path, fake,
                                                         provider):
    out = tmp_path / "run"
    with fake() as server:
        base = server.url if provider == "anthropic" else server.url + "/v1"
        result = CliRunner().invoke(app, [
            "eval", "--engine", f"{provider}:some-model", "--base-url", base,
            "--data", str(medqaro_prepared), "--output", str(out), "--sample", "3",
            "--cache", str(tmp_path / "c.sqlite")])
        assert result.exit_code == 2, result.output
        assert "--allow-external-api" in result.output
        assert server.calls == 0  # no request reached the server
    assert not out.exists() and not (tmp_path / "c.sqlite").exists()


def test_with_flag_runs_and_records_decision_key_never_written(medqaro_prepared, tmp_path):
    out, cache = tmp_path / "run", tmp_path / "c.sqlite"
    with FakeAnthropic(responder=lambda body: "Nu") as server:
        result = CliRunner().invoke(app, [
            "eval", "--engine", "anthropic:claude-3-5-haiku-20241022", "--base-url",
            server.url, "--data", str(medqaro_prepared), "--output", str(out), "--sample", "4",
            "--seed", "1", "--allow-external-api", "--cache", str(cache)])
        assert result.exit_code == 0, result.output
        assert server.calls == 4
        assert "F1" in result.output and "bootstrap over patients" in result.output
        assert "seeded sample 4 of" in result.output and "prompt: qea" in result.output
    metrics = json.loads((out / "metrics.json").read_text())
    config = json.loads((out / "config.json").read_text())
    record = metrics["governance"]
    assert record["allow_external_api"] is True and record["clinical_data"] is True
    assert record["flag_required"] is True and config["allow_external_api"] is True
    assert metrics["metrics"]["medqaro"]["n"] == 4 and metrics["usage"]["calls"] == 4
    lines = (out / "predictions.jsonl").read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(x)["prediction"] == "Nu" for x in lines)
    # the full epicrisis was sent (no trimming for API models) ...
    assert "Context:" in server.bodies[0]["messages"][0]["content"][0]["text"]
    # ... and the key is nowhere in the outputs or the cache
    for path in [*out.rglob("*"), cache]:
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in result.output


def test_public_exam_data_needs_no_flag(europemedqa_prepared, tmp_path):
    with FakeAnthropic(responder=lambda body: "A") as server:
        result = CliRunner().invoke(app, [
            "eval", "--engine", "anthropic:m", "--base-url", server.url,
            "--data", str(europemedqa_prepared), "--output", str(tmp_path / "run"),
            "--sample", "3", "--cache", str(tmp_path / "c.sqlite"), "--param", "top_k=5"])
        assert result.exit_code == 0, result.output
        assert server.calls == 3
        assert all(b["top_k"] == 5 and "temperature" not in b for b in server.bodies)
    gov = json.loads((tmp_path / "run" / "metrics.json").read_text())["governance"]
    assert gov["clinical_data"] is False and gov["allow_external_api"] is False


@pytest.mark.parametrize("args,expect", [
    ([], "either --config"),  # neither path
    (["--config", "e.yaml", "--engine", "hf:m", "--data", "d"], "not both"),
    (["--config", "e.yaml", "--seed", "0"], "--seed"),  # an --engine option, even at default
    (["--config", "e.yaml", "--data", "d", "--json"], "--data, --json"),
    (["--engine", "hf:m", "--data", "d", "--num-cpus", "2"], "--num-cpus"),  # a --config one
    (["--engine", "hf:m"], "--data"),
])
def test_eval_usage_errors_exit_2_naming_the_option(tmp_path, args, expect):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["eval", "--output", str(out), *args])
    assert result.exit_code == 2, result.output
    assert expect in result.output and "error:" in result.output
    assert not out.exists()


def test_eval_without_output_and_no_eval_api_command(tmp_path):
    result = CliRunner().invoke(app, ["eval", "--engine", "hf:m", "--data", str(tmp_path)])
    assert result.exit_code == 2 and "--output" in result.output
    result = CliRunner().invoke(app, ["eval-api", "--engine", "hf:m"])
    assert result.exit_code == 2 and "No such command" in result.output
