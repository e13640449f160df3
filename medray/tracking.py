"""Experiment tracking: MLflow and Weights & Biases, off unless asked for.

A `tracking:` section in the train, tune and eval configs (or `--mlflow URI` / `--wandb
PROJECT` on those commands, or MLFLOW_TRACKING_URI in the environment) turns it on:

    tracking:
      mlflow: {uri: "http://127.0.0.1:5000", experiment: medray}
      wandb: {project: medray, mode: offline}     # mode: W&B's own WANDB_MODE when unset

One `Tracker` per run logs, from the driver only: the resolved config as parameters
(flattened to dotted keys), metrics with their step, and output files as artifacts. It
never logs predictions, references or prompts (clinical text), nor secrets: keys that name
a key, token, secret or password are dropped, and user:password is cut out of URIs.
A server that cannot be reached is a ConfigError naming the URI, raised by `start()`,
which every command calls before any training or request.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field

from medray.config import ConfigError, Strict

CHECK_TIMEOUT_S = 10.0
# keys whose value is a credential (api_key, hf_token, password); not context_tokens or
# api_key_env, which names the variable that holds the key
SECRET = re.compile(r"(^|_)(api_?key|key|token|secret|password)$", re.IGNORECASE)


class MlflowTracking(Strict):
    uri: str | None = None  # None: $MLFLOW_TRACKING_URI; neither: MLflow is off
    experiment: str = Field("medray", min_length=1)


class WandbTracking(Strict):
    project: str | None = None  # None: W&B is off
    entity: str | None = None
    mode: Literal["online", "offline"] | None = None  # None: $WANDB_MODE, else online


class TrackingConfig(Strict):
    mlflow: MlflowTracking = MlflowTracking()
    wandb: WandbTracking = WandbTracking()
    run_name: str | None = None  # None: the command's own name for the run
    artifacts: bool = True  # adapter, prompt.json, metrics.json, config and report files


def with_flags(cfg: TrackingConfig, mlflow: str | None = None,
               wandb: str | None = None) -> TrackingConfig:
    """The config with the command's `--mlflow URI` / `--wandb PROJECT` applied."""
    update: dict[str, Any] = {}
    if mlflow:
        update["mlflow"] = cfg.mlflow.model_copy(update={"uri": mlflow})
    if wandb:
        update["wandb"] = cfg.wandb.model_copy(update={"project": wandb})
    return cfg.model_copy(update=update)


def mlflow_uri(cfg: TrackingConfig) -> str | None:
    return cfg.mlflow.uri or os.environ.get("MLFLOW_TRACKING_URI") or None


def enabled(cfg: TrackingConfig) -> bool:
    return bool(mlflow_uri(cfg) or cfg.wandb.project)


def public_uri(uri: str) -> str:
    """`uri` without user:password (what a message or a parameter may show)."""
    parts = urlsplit(uri)
    if parts.password is None and parts.username is None:
        return uri
    return urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port
                                                              else "")))


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """{"optim": {"lr": 0.1}} -> {"optim.lr": "0.1"}: parameters as strings, lists as JSON,
    secrets left out."""
    out: dict[str, str] = {}
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            if SECRET.search(str(key)):
                continue
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(tree, str) and "://" in tree:
        tree = public_uri(tree)
    text = tree if isinstance(tree, str) else json.dumps(tree, default=str)
    return {prefix: text[:6000]}  # MLflow's parameter value limit


def numbers(tree: Any, prefix: str = "", sep: str = ".") -> dict[str, float]:
    """Every number of a nested record, keyed by its dotted path ([lo, hi] -> _lo / _hi)."""
    out: dict[str, float] = {}
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            out.update(numbers(value, f"{prefix}{sep}{key}" if prefix else str(key), sep))
    elif isinstance(tree, list | tuple) and len(tree) == 2:
        out.update(numbers({"lo": tree[0], "hi": tree[1]}, prefix, "_"))
    elif isinstance(tree, int | float) and not isinstance(tree, bool):
        out[prefix] = float(tree)
    return out


def check_reachable(uri: str) -> None:
    """A tracking server answers its REST API, else ConfigError naming the URI. Local
    stores (a folder, file:, sqlite:) need no check; other schemes are left to MLflow."""
    if urlsplit(uri).scheme not in ("http", "https"):
        return
    import httpx

    auth = None
    if os.environ.get("MLFLOW_TRACKING_USERNAME"):
        auth = (os.environ["MLFLOW_TRACKING_USERNAME"],
                os.environ.get("MLFLOW_TRACKING_PASSWORD", ""))
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    where = public_uri(uri)
    try:
        reply = httpx.get(f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/search",
                          params={"max_results": 1}, auth=auth, headers=headers,
                          timeout=CHECK_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise ConfigError(f"MLflow tracking server {where} cannot be reached "
                          f"({type(exc).__name__}: {exc}); start it, or fix --mlflow, "
                          "tracking.mlflow.uri or MLFLOW_TRACKING_URI") from None
    if reply.status_code >= 400:
        raise ConfigError(f"MLflow tracking server {where} answered HTTP "
                          f"{reply.status_code} to a search of its experiments: "
                          + ("check MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD"
                             if reply.status_code in (401, 403) else "is it an MLflow server?"))


def check_tracking(cfg: TrackingConfig) -> None:
    """What a command checks before it starts: the MLflow server answers."""
    if uri := mlflow_uri(cfg):
        check_reachable(uri)


class Tracker:
    """One tracked run on every backend the config turns on (`start`), logged from the
    driver; the logging methods skip a backend that is off. Used as a context manager it
    ends the runs, FAILED when the block raised."""

    def __init__(self, cfg: TrackingConfig, *, kind: str, name: str, folder: Path,
                 tags: Mapping[str, str] | None = None) -> None:
        self.cfg, self.kind, self.folder = cfg, kind, Path(folder)
        self.name = cfg.run_name or name
        self.tags = {"medray.command": kind, **(tags or {})}
        self.uri = mlflow_uri(cfg)
        self.client: Any = None
        self.run_id: str | None = None
        self.wandb: Any = None
        self.warnings: list[str] = []

    def start(self, params: Mapping[str, Any]) -> Tracker:
        """Open the runs and log `params` (a nested config). Fails, as ConfigError naming
        the URI, when the MLflow server cannot be reached."""
        flat = flatten(params)
        if self.uri:
            check_reachable(self.uri)
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=self.uri)
            try:
                exp = self.client.get_experiment_by_name(self.cfg.mlflow.experiment)
                exp_id = (exp.experiment_id if exp else
                          self.client.create_experiment(self.cfg.mlflow.experiment))
                run = self.client.create_run(exp_id, run_name=self.name, tags=self.tags)
            except Exception as exc:  # noqa: BLE001  (MlflowException, OSError, ...)
                raise ConfigError(f"MLflow tracking URI {public_uri(self.uri)}: cannot "
                                  f"create a run: {exc}") from None
            self.run_id = run.info.run_id
            items = [Param(k, v) for k, v in flat.items()]
            for i in range(0, len(items), 100):  # MLflow takes 100 parameters per batch
                self.client.log_batch(self.run_id, params=items[i:i + 100])
        if self.cfg.wandb.project:
            import wandb

            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                self.wandb = wandb.init(
                    project=self.cfg.wandb.project, entity=self.cfg.wandb.entity,
                    name=self.name, job_type=self.kind, dir=str(self.folder), config=flat,
                    tags=[self.kind], mode=self.cfg.wandb.mode, reinit="create_new",
                    # no stdout capture (the console is ours), no system-metrics sampler
                    settings=wandb.Settings(console="off", x_disable_stats=True, silent=True))
            except Exception as exc:  # noqa: BLE001  (not logged in, no network, ...)
                self.finish(ok=False)  # the MLflow run just opened, if any
                raise ConfigError(f"W&B project {self.cfg.wandb.project!r}: cannot start a "
                                  f"run ({type(exc).__name__}: {exc}); `wandb login`, or "
                                  "WANDB_MODE=offline to keep it local") from None
        return self

    def _safely(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        """A tracking hiccup mid-run is a warning, never the loss of a finished training."""
        try:
            fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            self.warnings.append(f"tracking: {what} failed: {type(exc).__name__}: {exc}")

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not metrics:
            return
        if self.run_id:
            self.log_metrics_mlflow(metrics, step or 0)
        if self.wandb is not None:
            self._safely("W&B metrics", self.wandb.log, dict(metrics), step=step)

    def log_epochs(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Per-epoch records as `epoch/<key>` against the epoch number (W&B: its x-axis)."""
        if self.wandb is not None:
            self._safely("W&B axis", self.wandb.define_metric, "epoch/*", step_metric="epoch")
        for rec in records:
            values = {f"epoch/{k}": v for k, v in numbers(rec).items() if k != "epoch"}
            if self.run_id:
                self.log_metrics_mlflow(values, int(rec["epoch"]))
            if self.wandb is not None:
                self._safely("W&B metrics", self.wandb.log, {"epoch": rec["epoch"], **values})

    def log_metrics_mlflow(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self._safely("MLflow metrics", self.client.log_batch, self.run_id, metrics=batch)

    def log_summary(self, metrics: Mapping[str, float]) -> None:
        """Final numbers: MLflow metrics at step 0, the W&B run's summary."""
        if self.run_id:
            self.log_metrics_mlflow(metrics, 0)
        if self.wandb is not None:
            self._safely("W&B summary", self.wandb.summary.update, dict(metrics))

    def log_artifacts(self, paths: Iterable[Path]) -> None:
        """Files and folders (a folder keeps its name) that exist; none when
        `tracking.artifacts` is false."""
        paths = [Path(p) for p in paths if Path(p).exists()]
        if not self.cfg.artifacts or not paths:
            return
        for path in paths:
            if self.run_id and path.is_dir():
                self._safely(f"MLflow artifact {path.name}", self.client.log_artifacts,
                             self.run_id, str(path), artifact_path=path.name)
            elif self.run_id:
                self._safely(f"MLflow artifact {path.name}", self.client.log_artifact,
                             self.run_id, str(path))
        if self.wandb is not None:
            import wandb

            art = wandb.Artifact(re.sub(r"[^\w.-]", "-", f"{self.kind}-{self.name}"),
                                 type=self.kind)
            for path in paths:
                if path.is_dir():
                    art.add_dir(str(path), name=path.name)
                else:
                    art.add_file(str(path))
            self._safely("W&B artifact", self.wandb.log_artifact, art)

    def finish(self, ok: bool = True) -> None:
        if self.run_id:
            self._safely("MLflow end", self.client.set_terminated, self.run_id,
                         "FINISHED" if ok else "FAILED")
        if self.wandb is not None:
            self._safely("W&B end", self.wandb.finish, exit_code=0 if ok else 1)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.finish(ok=exc_type is None)
