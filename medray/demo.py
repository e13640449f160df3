"""`medray demo`: the whole pipeline on a laptop, on the embedded recipe (configs/demo.yaml).

Reads top to bottom:
1. synthesise MedQARo-like CSVs (released format) and prepare them (validate, normalise);
2. build a tiny random-init Llama; its tokenizer sees TRAIN-split text only;
3. pre-train the tiny base on TRAIN epicrises (unlabelled text; see medray/pretrain.py);
4. fine-tune LoRA on Ray Train: Ray Data tokenisation, 2 workers, DeepSpeed ZeRO-2;
5. evaluate the majority baseline, then serve the pre-trained base on Ray Serve (vLLM
   replica) and evaluate it zero-shot with evaluation actors, in-domain (held-out test
   patients) and cross-domain;
6. serve the fine-tuned model the same way and evaluate it;
7. write the report (Markdown + PNG plots) and metrics.json.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from medray.console import Display
from medray.demo_config import DEFAULT_DEMO_CONFIG, DemoConfig, load_demo_config
from medray.fsutil import claim_directory

STAGES = 7
DEMO_APP = "medray-demo"  # Serve application names and route prefixes start with it
DEMO_KEY_ENV = "MEDRAY_DEMO_KEY"  # the bearer key of the demo's Serve app (random per run)
SYSTEMS = {"majority": "majority baseline", "zero_shot": "tiny model, zero-shot",
           "fine_tuned": "tiny model + LoRA (fine-tuned)"}


def model_dirs(output: Path) -> dict[str, Path]:
    """Where the demo writes its models (serve/medqaro-cpu.yaml serves pretrained + merged)."""
    model = Path(output) / "model"
    return {"base": model / "base", "pretrained": model / "pretrained",
            "merged": model / "merged", "adapter": Path(output) / "train" / "adapter"}


def run_demo(output: Path, seed: int = 0, config: Path = DEFAULT_DEMO_CONFIG,
             overrides: list[str] | None = None, address: str | None = None,
             console: Console | None = None) -> dict:
    console = console or Console()
    cfg = load_demo_config(config, overrides)
    output = Path(output)
    claim_directory(output, command="demo")  # never write into a folder medray did not create
    timings: dict[str, float] = {}
    started = time.time()
    memory = MemoryPeak().start()

    with _stage(console, timings, 1, "synthetic MedQARo-like data"):
        data = synthesise_and_prepare(cfg, output, seed)
        console.print(f"{data.manifest['splits']} examples per split; each epicrisis stored "
                      f"once ({len(data.contexts)} contexts) in {output / 'data'}")

    with _stage(console, timings, 2, "tiny model (tokenizer from the train split only)"):
        base = build_base(cfg, data, model_dirs(output)["base"], seed)
        console.print(f"random-init Llama, {cfg.tiny_model.n_layers} layers x "
                      f"{cfg.tiny_model.hidden_size} hidden, in {base}")

    with _stage(console, timings, 3, "pre-train the tiny base on train epicrises"):
        from medray.pretrain import pretrain_tiny_base

        pre = pretrain_tiny_base(base, split_contexts(data, "train"),
                                 steps=cfg.pretrain.steps, lr=cfg.pretrain.lr,
                                 seq_len=cfg.pretrain.seq_len,
                                 batch_size=cfg.pretrain.batch_size, seed=seed,
                                 out_dir=model_dirs(output)["pretrained"])
        console.print(f"held-out LM loss {pre['held_out_loss_before']:.3f} -> "
                      f"{pre['held_out_loss_after']:.3f} ({pre['steps']} steps, "
                      f"{pre['tokens_seen']} tokens seen; unlabelled text, no QA pairs)")

    ray_info = init_ray(address)
    with _stage(console, timings, 4, "LoRA fine-tuning on Ray Train (DeepSpeed ZeRO)"):
        from medray.train.trainer import run_training

        train_cfg = cfg.train.model_copy(deep=True)
        train_cfg.model.name_or_path = str(output / "model" / "pretrained")
        train_cfg.data.path = str(output / "data")
        train_cfg.optim.seed = seed
        trained = run_training(train_cfg, output / "train", log=console.print,
                               display=Display(console, None))

    # One vLLM replica at a time keeps a laptop's memory low: serve, evaluate, tear down.
    evaluate = SystemEvaluator(cfg, train_cfg, output, console)
    with _stage(console, timings, 5, "zero-shot: serve the base (Ray Serve + vLLM), evaluate"):
        evaluate("majority", None)
        with serving(cfg, train_cfg, output, "base", model_dirs(output)["pretrained"],
                     console) as endpoint:
            evaluate("zero_shot", endpoint)

    with _stage(console, timings, 6, "fine-tuned: serve the adapter, evaluate"):
        with serving(cfg, train_cfg, output, "ft", fine_tuned_model(train_cfg, output),
                     console) as endpoint:
            evaluate("fine_tuned", endpoint)
    runs = evaluate.runs

    with _stage(console, timings, 7, "report"):
        from medray.demo_report import write_demo_report

        timings["total"] = round(time.time() - started, 1)
        summary = write_demo_report(output, cfg, runs, pretrain=pre, trained=trained,
                                    timings=timings, seed=seed, memory=memory.stop())
        for line in summary["lines"]:
            console.print(line, markup=False)
    console.rule("[bold green]done")
    console.print(f"report: {output / 'report.md'}   numbers: {output / 'metrics.json'}",
                  soft_wrap=True)
    console.print(f"TensorBoard: tensorboard --logdir {output / 'train' / 'tensorboard'}",
                  soft_wrap=True)
    console.print(ray_info, soft_wrap=True)
    return summary


@contextmanager
def _stage(console: Console, timings: dict[str, float], n: int, title: str) -> Iterator[None]:
    console.rule(f"[bold]{n}/{STAGES} {title}")
    t0 = time.time()
    yield
    timings[title] = round(time.time() - t0, 1)
    console.print(f"[dim]{title}: {timings[title]:.0f} s[/dim]")


class MemoryPeak:
    """Peak system memory in use above the level at start, sampled every 0.5 s (Ray workers,
    the vLLM replica and this driver are separate processes: the system view covers all)."""

    def __init__(self) -> None:
        import threading

        import psutil

        self._vm = psutil.virtual_memory
        self._start = self._peak = self._used()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _used(self) -> int:
        vm = self._vm()
        return vm.total - vm.available

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._peak = max(self._peak, self._used())

    def start(self) -> MemoryPeak:
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {"peak_above_start_gib": round((self._peak - self._start) / 2**30, 2),
                "how": "system memory in use (total - available), peak minus the value at "
                       "start, sampled every 0.5 s; includes anything else running"}


def synthesise_and_prepare(cfg: DemoConfig, output: Path, seed: int) -> Any:
    from medray.data.prepare import prepare
    from medray.data.synth import write_medqaro

    raw = write_medqaro(output / "raw", seed=seed, scale=cfg.synth.scale,
                        n_patients=cfg.synth.n_patients, words=cfg.synth.words)
    return prepare("medqaro", raw, output / "data")


def split_contexts(data: Any, split: str) -> list[str]:
    ids = set(data.split(split)["context_id"])
    return data.contexts[data.contexts["context_id"].isin(ids)]["text"].tolist()


def build_base(cfg: DemoConfig, data: Any, out: Path, seed: int) -> Path:
    """Held-out patients stay unseen: tokenizer corpus = train epicrises, questions, answers."""
    from medray.models import build_tiny_model

    train = data.split("train")
    texts = split_contexts(data, "train") + train["question"].tolist() + train["answer"].tolist()
    return build_tiny_model(out, texts, seed=seed, **cfg.tiny_model.model_dump())


def init_ray(address: str | None) -> str:
    """Join RAY_ADDRESS/--address, or start a local Ray with its dashboard."""
    from medray.raycluster import connect

    ctx = connect(address, dashboard=True)
    if ctx is None:
        return "Ray: the caller's cluster (its dashboard, if any, where it was started)"
    if address or os.environ.get("RAY_ADDRESS"):
        return f"Ray dashboard: http://{ctx.dashboard_url}" if ctx.dashboard_url else \
            "Ray: joined the cluster"
    return (f"Ray dashboard (live while a cluster runs): http://{ctx.dashboard_url}; this "
            "demo's local cluster stops with it. To keep one: `ray start --head`, then "
            "`RAY_ADDRESS=127.0.0.1:6379 medray demo`.")


def fine_tuned_model(train_cfg: Any, output: Path) -> Path:
    """What vLLM serves for the fine-tuned row: a plain LoRA adapter rides on the base
    (returned as is); one that also trains full modules (modules_to_save) cannot be loaded
    as LoRA by vLLM, so it is merged into the base first (PEFT merge_and_unload)."""
    from medray.train.checkpoints import merge_adapter

    dirs = model_dirs(output)
    if not train_cfg.lora.modules_to_save:
        return dirs["adapter"]
    return merge_adapter(train_cfg.model.name_or_path, dirs["adapter"], dirs["merged"])


@contextmanager
def serving(cfg: DemoConfig, train_cfg: Any, output: Path, name: str, model: Path,
            console: Console) -> Iterator[dict]:
    """A Serve app (vLLM replica + QA ingress) for `model` (a model dir, or a LoRA adapter
    dir served on the pre-trained base); yields its endpoint, deletes the app after."""
    import socket

    from ray import serve
    from ray.serve.context import _get_global_client

    from medray.serve_app import build_app
    from medray.serve_config import AppConfig, Replicas

    # A random per-run bearer key: the replicas read it from a 0600 file (they do not see
    # this process's environment); the evaluation driver hands it to its actors.
    key = os.environ.setdefault(DEMO_KEY_ENV, secrets.token_urlsafe(24))
    key_file = output / "serve.key"
    key_file.touch(mode=0o600)
    key_file.write_text(key + "\n")
    is_adapter = (model / "adapter_config.json").is_file()
    app = AppConfig(model=str(model_dirs(output)["pretrained"]) if is_adapter else str(model),
                    model_id=f"demo-{name}", adapters={name: str(model)} if is_adapter else {},
                    max_lora_rank=train_cfg.lora.r, device="cpu",
                    max_model_len=cfg.serve.max_model_len,
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
        endpoint = {"url": f"http://{http.host}:{http.port}/{app_name}",
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
            engine = EngineSpec(kind="serve", url=endpoint["url"], api_key_env=DEMO_KEY_ENV,
                                model=endpoint["model"], adapter=endpoint["adapter"])
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
                task = bar.add_task(f"{SYSTEMS[system]} on {split}", total=None)
                out = self.output / "eval" / f"{system}-{split}"
                run_eval(ev, out, on_prediction=lambda _row, t=task: bar.advance(t))
                bar.update(task, total=bar.tasks[task].completed)
                self.runs.setdefault(system, {})[split] = out
