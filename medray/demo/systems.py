"""The demo's three systems: serving a model on Ray Serve (vLLM replica + QA ingress) and
evaluating each system with `medray eval`'s runner (evaluation actors, which call the app
through a DeploymentHandle: it runs in the same Ray cluster) on every split."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from medray.demo.config import BASE_NAMES, DemoConfig

DEMO_APP = "medray-demo"  # Serve application names and route prefixes start with it
DEMO_KEY_ENV = "MEDRAY_DEMO_KEY"  # the bearer key of the demo's Serve app (random per run)
# How long one evaluation call to the demo's app may wait. A call carries a whole patient
# (~27 prompts) and queues behind the other patients in flight; on a slow CPU that wait
# passed the engine's 300 s default. The app answers only this evaluation, so a long wait
# is a slow machine, not a lost request.
DEMO_CALL_TIMEOUT_S = 1800.0


def system_names(cfg: DemoConfig) -> dict[str, str]:
    model = BASE_NAMES[cfg.base]
    return {"majority": "majority baseline", "zero_shot": f"{model}, zero-shot",
            "fine_tuned": f"{model} + LoRA (fine-tuned)"}


def model_dirs(output: Path) -> dict[str, Path]:
    """Where the demo writes its models (serve/medqaro-cpu.yaml serves pretrained + merged)."""
    model = Path(output) / "model"
    return {"base": model / "base", "pretrained": model / "pretrained",
            "merged": model / "merged", "adapter": Path(output) / "train" / "adapter"}


def fine_tuned_model(cfg: DemoConfig, train_cfg: Any, output: Path) -> Path:
    """What vLLM serves for the fine-tuned row: the LoRA adapter dir (served on the base),
    or the base with the adapter merged in (PEFT merge_and_unload)."""
    from medray.train.checkpoints import merge_adapter

    dirs = model_dirs(output)
    if not cfg.serves_merged:
        return dirs["adapter"]
    return merge_adapter(train_cfg.model.name_or_path, dirs["adapter"], dirs["merged"])


@contextmanager
def serving(cfg: DemoConfig, train_cfg: Any, output: Path, name: str, model: Path,
            console: Console) -> Iterator[dict]:
    """A Serve app (vLLM replica + QA ingress) for `model` (a model dir, or a LoRA adapter
    dir served on the base it was trained on); yields its endpoint, deletes the app after."""
    import socket

    from ray import serve
    from ray.serve.context import _get_global_client

    from medray.serve.app import build_app
    from medray.serve.config import AppConfig, Replicas

    # A random per-run bearer key: the replicas read it from a 0600 file (they do not see
    # this process's environment); the evaluation driver hands it to its actors.
    key = os.environ.setdefault(DEMO_KEY_ENV, secrets.token_urlsafe(24))
    key_file = output / "serve.key"
    key_file.touch(mode=0o600)
    key_file.write_text(key + "\n")
    is_adapter = (model / "adapter_config.json").is_file()
    base = train_cfg.model.name_or_path  # the model the adapter was trained on
    app = AppConfig(model=str(base) if is_adapter else str(model),
                    model_id=f"demo-{name}", adapters={name: str(model)} if is_adapter else {},
                    max_lora_rank=train_cfg.lora.r, device="cpu",
                    max_model_len=cfg.serve.max_model_len,
                    engine_kwargs={"dtype": cfg.serve.dtype, "kv_cache_memory_bytes":
                                   int(cfg.serve.kv_cache_gib * 2**30)},
                    prompt=train_cfg.prompt, api_keys_env=None,
                    api_keys_file=str(key_file),
                    llm=Replicas(num_replicas=cfg.serve.num_replicas))
    with socket.socket() as s:  # a free port, unless Serve already runs (then its port)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app_name = f"{DEMO_APP}-{name}"
    serve.run(build_app(app), name=app_name, route_prefix=f"/{app_name}")
    try:
        http = _get_global_client().http_config
        endpoint = {"url": f"http://{http.host}:{http.port}/{app_name}", "app": app_name,
                    "model": app.model_id, "adapter": name if is_adapter else None}
        console.print(f"serving {model.name} as {app.model_id}"
                      f"{' + adapter ' + name if is_adapter else ''}: {endpoint['url']}/v1/qa "
                      f"(bearer key in {key_file})", soft_wrap=True)
        yield endpoint
    finally:
        serve.delete(app_name)


class SystemEvaluator:
    """Runs `medray eval` (evaluation actors) for one system on every configured split;
    .runs[system][split] is the run directory (predictions.jsonl + metrics.json)."""

    def __init__(self, cfg: DemoConfig, train_cfg: Any, output: Path, console: Console):
        self.cfg, self.train_cfg, self.output, self.console = cfg, train_cfg, output, console
        self.runs: dict[str, dict[str, Path]] = {}

    def __call__(self, system: str, endpoint: dict | None) -> None:
        from medray.eval.config import EngineSpec, EvalConfig, ScoreSpec
        from medray.eval.runner import run_eval

        if endpoint is None:
            engine = EngineSpec(kind="baseline", baseline="majority")
        else:
            # In-cluster (the app runs in this Ray cluster): through a DeploymentHandle, no
            # HTTP proxy; the URL stays recorded and serves outside callers.
            engine = EngineSpec(kind="serve", url=endpoint["url"], app=endpoint["app"],
                                api_key_env=DEMO_KEY_ENV, model=endpoint["model"],
                                adapter=endpoint["adapter"], timeout_s=DEMO_CALL_TIMEOUT_S)
        e = self.cfg.eval
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=self.console) as bar:
            for split in e.splits:
                ev = EvalConfig(data=self.output / "data", split=split, engine=engine,
                                prompt=self.train_cfg.prompt, actors=e.actors,
                                max_in_flight=e.max_in_flight, limit=e.limit,
                                fine_tuned=system == "fine_tuned",
                                score=ScoreSpec(modes=["medqaro"], by=["question_type"],
                                                wordnet=False, resamples=e.resamples))
                task = bar.add_task(f"{system_names(self.cfg)[system]} on {split}",
                                    total=None)
                out = self.output / "eval" / f"{system}-{split}"
                run_eval(ev, out, on_prediction=lambda _row, t=task: bar.advance(t))
                bar.update(task, total=bar.tasks[task].completed)
                self.runs.setdefault(system, {})[split] = out
