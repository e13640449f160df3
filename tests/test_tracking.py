"""Experiment tracking (medray.tracking) against a real MLflow server, and W&B offline.

The module starts `mlflow server` (SQLite store, proxied artifacts) on 127.0.0.1 with a free
port; a tiny training run (also logged to W&B in offline mode), a 2-trial sweep and a
baseline evaluation log to it, and the test reads everything back with MlflowClient (the
W&B run from its offline .wandb file). An unreachable server fails before any work.

Budget on 2 cores: ~2 min (server start ~10 s, training ~40 s, sweep ~60 s, eval ~5 s).
"""

from __future__ import annotations

import glob
import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from medray.cli import app
from medray.tracking import flatten, public_uri

ROOT = Path(__file__).resolve().parents[1]
TINY_RUN = ["scaling.num_workers=1", "optim.epochs=2", "optim.warmup_steps=1",
            "data.max_train_examples=16", "data.max_val_examples=8",
            "data.val_generate_examples=2", "prompt.max_new_tokens=4",
            "prompt.context_tokens=128", "data.tokenize_actors=1",
            "checkpoint.every_steps=null", "fault.max_failures=0"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on a free port; yields its URI."""
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    log = open(root / "server.log", "w")  # noqa: SIM115  (closed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
         f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT)
    uri = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            if proc.poll() is not None:
                raise RuntimeError((root / "server.log").read_text()[-3000:])
            try:
                if httpx.get(f"{uri}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError("mlflow server did not start:\n"
                               + (root / "server.log").read_text()[-3000:])
        yield uri
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs(uri: str, experiment: str, where: str = "") -> list:
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r}"
    return client.search_runs([exp.experiment_id], where)


def _artifacts(uri: str, run_id: str, path: str | None = None) -> set[str]:
    return {a.path for a in _client(uri).list_artifacts(run_id, path)}


def _wandb_records(run_dir: Path) -> list:
    """The records of an offline W&B run (its .wandb file: LevelDB-style log blocks of
    protobuf `Record`s), read the way `wandb sync` reads them."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(glob.glob(str(run_dir / "*.wandb"))[0]).read_bytes()
    block, pos, buf, records = 32768, 7, b"", []  # 7: the ":W&B" file header
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        buf += data[pos:pos + n]
        pos += n
        if kind in (1, 4):  # FULL or LAST piece of a record
            rec = pb.Record()
            rec.ParseFromString(buf)
            records.append(rec)
            buf = b""
    return records


def test_flatten_keeps_config_and_drops_secrets():
    flat = flatten({"optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "engine": {
        "api_key": "sk-1", "api_key_env": "OPENAI_API_KEY", "hf_token": "x",
        "url": "https://user:pw@host:5000/x"}, "prompt": {"context_tokens": 128}})
    assert flat == {"optim.lr": "0.1", "optim.betas": "[0.9, 0.99]",
                    "engine.api_key_env": "OPENAI_API_KEY", "engine.url": "https://host:5000/x",
                    "prompt.context_tokens": "128"}
    assert public_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def _tiny_config_file(tmp_path: Path, model: Path, data: Path, **tracking) -> Path:
    raw = yaml.safe_load((ROOT / "configs/tiny-cpu.yaml").read_text())
    raw["model"]["name_or_path"], raw["data"]["path"] = str(model), str(data)
    if tracking:
        raw["tracking"] = tracking
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_an_unreachable_server_fails_before_any_work(tiny_model, medqaro_prepared, tmp_path):
    """train, tune and eval: exit 2 naming the URI, in seconds, nothing trained or asked."""
    dead = f"http://127.0.0.1:{_free_port()}"
    config = _tiny_config_file(tmp_path, tiny_model, medqaro_prepared)
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"search": "grid", "metric": "val_loss", "mode": "min",
                                     "params": {"optim.lr": [1e-3, 3e-3]}}))
    evalcfg = tmp_path / "eval.yaml"
    evalcfg.write_text(yaml.safe_dump({"data": str(medqaro_prepared), "engine": {
        "kind": "baseline", "baseline": "random-token"}, "score": {"resamples": 10}}))
    commands = {"train": ["train", "--config", str(config), "--output", str(tmp_path / "t")],
                "tune": ["tune", "--config", str(config), "--space", str(space),
                         "--output", str(tmp_path / "s")],
                "eval": ["eval", "--config", str(evalcfg), "--output", str(tmp_path / "e")]}
    for name, argv in commands.items():
        t0 = time.monotonic()
        result = CliRunner().invoke(app, [*argv, "--mlflow", dead])
        assert result.exit_code == 2, (name, result.output)
        assert dead in result.output and "cannot be reached" in result.output, result.output
        assert time.monotonic() - t0 < 30, name
    assert not (tmp_path / "t" / "metrics.json").exists()
    assert not (tmp_path / "s" / "sweep").exists()
    assert not (tmp_path / "e" / "predictions.jsonl").exists()


def test_training_logs_params_step_and_epoch_metrics_and_artifacts(
        mlflow_server, ray_session, tiny_model, medqaro_prepared, tmp_path, monkeypatch):
    """`medray train --mlflow URI` (its console draws the progress board the scalars travel
    through), W&B offline from the config's tracking section."""
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # must never reach the logged config
    out = tmp_path / "tracked-train"
    config = _tiny_config_file(tmp_path, tiny_model, medqaro_prepared,
                               mlflow={"experiment": "t-train"},
                               wandb={"project": "medray-test", "mode": "offline"})
    result = CliRunner().invoke(app, ["train", "--config", str(config), "--output", str(out),
                                      "--mlflow", mlflow_server, *TINY_RUN])
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    total = metrics["plan"]["total_steps"]

    (run,) = _runs(mlflow_server, "t-train")
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked-train"
    # the whole resolved config, flattened, and nothing else
    assert run.data.params == flatten(metrics["config"])
    assert run.data.params["optim.lr"] == "0.003"
    assert run.data.params["tracking.mlflow.uri"] == mlflow_server  # --mlflow was applied
    assert run.data.params["prompt.chat_template"] in ("true", "false")  # auto, decided
    client = _client(mlflow_server)
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(steps) == list(range(1, total + 1)), steps
    val = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val/loss")}
    assert 0 in val and total in val  # before training and after the last epoch
    epochs = client.get_metric_history(run.info.run_id, "epoch/val_loss")
    assert {m.step: m.value for m in epochs} == {
        e["epoch"]: pytest.approx(e["val_loss"]) for e in metrics["epochs"]}
    assert run.data.metrics["final/val_loss"] == pytest.approx(
        metrics["exported"]["record"]["val_loss"])
    assert {"adapter", "prompt.json", "metrics.json"} <= _artifacts(mlflow_server,
                                                                     run.info.run_id)
    adapter = _artifacts(mlflow_server, run.info.run_id, "adapter")
    assert {"adapter/adapter_model.safetensors", "adapter/prompt.json"} <= adapter

    # W&B, offline: the same config and metrics in the run's .wandb file
    (wb_dir,) = glob.glob(str(out / "wandb" / "offline-run-*"))
    records = _wandb_records(Path(wb_dir))
    config = {u.key: json.loads(u.value_json) for r in records
              if r.WhichOneof("record_type") == "run" for u in r.run.config.update}
    assert config["optim.lr"] == "0.003" and config["data.max_train_examples"] == "16"
    raw = Path(glob.glob(str(Path(wb_dir) / "*.wandb"))[0]).read_bytes()
    assert b"k" * 40 not in raw  # the API key is in no record
    history = [{"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                for i in r.history.item} for r in records
               if r.WhichOneof("record_type") == "history"]
    assert {h["_step"] for h in history if "train/loss" in h} == set(range(1, total + 1))
    summary = {"/".join(u.nested_key) or u.key: u.value_json for r in records
               if r.WhichOneof("record_type") == "summary" for u in r.summary.update}
    assert float(summary["final/val_loss"]) == pytest.approx(
        metrics["exported"]["record"]["val_loss"])
    assert any(r.WhichOneof("record_type") == "artifact" for r in records)


def test_sweep_logs_a_parent_run_with_one_child_run_per_trial(
        mlflow_server, ray_session, tiny_model, medqaro_prepared, tmp_path):
    from medray.tune.plan import plan_sweep
    from medray.tune.sweep import run_sweep

    config = _tiny_config_file(tmp_path, tiny_model, medqaro_prepared,
                               mlflow={"uri": mlflow_server, "experiment": "t-sweep"})
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({
        "search": "grid", "metric": "val_loss", "mode": "min", "scheduler": {"type": "none"},
        "max_concurrent_trials": 2, "driver_cpus": 1,
        "fixed": {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in TINY_RUN)}
        | {"optim.epochs": 1},
        "params": {"optim.lr": [1e-3, 3e-3]}}))
    plan = plan_sweep(config, space, tmp_path / "sweep")
    before = os.environ.get("MLFLOW_TRACKING_URI")
    summary = run_sweep(plan, log=lambda *a: None)
    # Ray's MLflow callback sets MLFLOW_TRACKING_URI for subprocesses; the sweep puts it back
    assert os.environ.get("MLFLOW_TRACKING_URI") == before
    assert len(summary.trials) == 2

    (parent,) = _runs(mlflow_server, "t-sweep", "tags.`medray.command` = 'tune'")
    assert parent.info.status == "FINISHED"
    assert parent.data.params["base.optim.lr"] == "0.003"  # the base config, then the space
    assert parent.data.params["space.params.optim.lr.values"] == "[0.001, 0.003]"
    assert parent.data.metrics["best/val_loss"] == pytest.approx(
        float(summary.trials["best_val_loss"].min()))
    assert {"trials.csv", "best.yaml", "sweep_spec.json"} <= _artifacts(mlflow_server,
                                                                        parent.info.run_id)
    children = _runs(mlflow_server, "t-sweep",
                     f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(float(c.data.params["optim.lr"]) for c in children) == [1e-3, 3e-3]
    for child in children:
        assert child.info.status == "FINISHED"
        assert "val_loss" in child.data.metrics and "train_loss" in child.data.metrics
    # the trials' own training was not tracked a second time
    assert len(_runs(mlflow_server, "t-sweep")) == 3


def test_evaluation_logs_scores_with_cis_and_no_clinical_text(
        mlflow_server, ray_session, medqaro_prepared, tmp_path):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(yaml.safe_dump({
        "data": str(medqaro_prepared), "engine": {"kind": "baseline", "baseline": "random-token",
                                                  "seed": 3},
        "score": {"resamples": 50, "wordnet": False},
        "tracking": {"mlflow": {"experiment": "t-eval"}}}))
    out = tmp_path / "tracked-eval"
    result = CliRunner().invoke(app, ["eval", "--config", str(cfg), "--output", str(out),
                                      "--mlflow", mlflow_server])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "metrics.json").read_text())
    (run,) = _runs(mlflow_server, "t-eval")
    assert run.info.status == "FINISHED"
    assert run.data.params["engine.kind"] == "baseline"
    assert run.data.params["tracking.mlflow.uri"] == mlflow_server  # --mlflow was applied
    f1 = summary["metrics"]["medqaro"]["metrics"]["f1"]
    assert run.data.metrics["medqaro.f1.mean"] == pytest.approx(f1["mean"])
    assert run.data.metrics["medqaro.f1.ci95_lo"] == pytest.approx(f1["ci95"][0])
    assert run.data.metrics["medqaro.f1.ci95_hi"] == pytest.approx(f1["ci95"][1])
    assert _artifacts(mlflow_server, run.info.run_id) == {"metrics.json", "config.json"}
    answers = [json.loads(x)["prediction"] for x in
               (out / "predictions.jsonl").read_text().splitlines()]
    logged = json.dumps(run.data.params) + json.dumps(run.data.tags)
    long = [a for a in answers if len(a) >= 20]
    assert long and not any(a in logged for a in long)  # no prediction text in the run
