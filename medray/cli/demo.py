"""`medray demo`: the whole pipeline on synthetic data (the code lives in medray.demo)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from medray.cli.choices import DemoModel


def demo(
    output: Annotated[Path, typer.Option(
        help="where the demo writes everything")] = Path("runs/demo"),
    seed: Annotated[int, typer.Option(
        help="seed of the synthetic data, model init and training")] = 0,
    model: Annotated[DemoModel, typer.Option(
        help="the model fine-tuned: tiny (random-init, pre-trained by the demo; fastest) or "
        "smollm2 (SmolLM2-135M-Instruct from its wheel, plain LoRA; configs/demo-smollm2.yaml)"
    )] = DemoModel.tiny,
    config: Annotated[Path | None, typer.Option(
        help="demo recipe (default: configs/demo.yaml, or configs/demo-smollm2.yaml with "
        "--model smollm2)")] = None,
    address: Annotated[str | None, typer.Option(
        help="Ray address (default: RAY_ADDRESS, else local)")] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="show Ray/vLLM/DeepSpeed logs here (default: OUTPUT/logs/)")] = False,
    overrides: Annotated[list[str] | None, typer.Argument(
        help="dotted key=value recipe overrides, e.g. train.optim.max_steps=100")] = None,
) -> None:
    """The whole pipeline on synthetic data: a small model, Ray Train LoRA, Serve, eval,
    report."""
    from medray.config import ConfigError
    from medray.console import command_console, fail
    from medray.demo import DEMO_CONFIGS, run_demo
    from medray.io import OutputRefused, claim_directory

    try:  # claimed before the console writes OUTPUT/logs into it
        claim_directory(output, command="demo")
    except OutputRefused as err:
        fail(str(err))
    with command_console("demo", output / "logs", verbose=verbose) as display:
        try:
            run_demo(output, seed=seed, config=config or DEMO_CONFIGS[model.value],
                     overrides=overrides or [], address=address, console=display.console,
                     base=model.value if config is None or model != DemoModel.tiny else None)
        except (ConfigError, OutputRefused) as err:
            fail(str(err))


def register(root: typer.Typer) -> None:
    root.command()(demo)
