"""`medray` command line. Heavy imports (torch, ray) happen inside the commands."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(rich_markup_mode=None,
    help="Fine-tune, serve and evaluate LLMs on medical QA benchmarks, on Ray.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

# --- data (lead) ---
from medray.data.commands import data_app  # noqa: E402

app.add_typer(data_app, name="data")


@app.command()
def demo(
    output: Path = typer.Option(Path("runs/demo"), help="where the demo writes everything"),
    seed: int = typer.Option(0, help="seed of the synthetic data, model init and training"),
    config: Path = typer.Option(None, help="demo recipe (default: configs/demo.yaml)"),
    address: str = typer.Option(None, help="Ray address (default: RAY_ADDRESS, else local)"),
    verbose: bool = typer.Option(False, "--verbose",
                                 help="show Ray/vLLM/DeepSpeed logs here (default: "
                                      "OUTPUT/logs/)"),
    overrides: list[str] = typer.Argument(None, help="dotted key=value recipe overrides, "
                                          "e.g. train.optim.max_steps=100"),
) -> None:
    """The whole pipeline on synthetic data: tiny model, Ray Train LoRA, Serve, eval, report."""
    from medray.console import command_console, fail
    from medray.demo import DEFAULT_DEMO_CONFIG, run_demo
    from medray.fsutil import OutputRefused, claim_directory
    from medray.train.config import ConfigError

    try:  # claimed before the console writes OUTPUT/logs into it
        claim_directory(output, command="demo")
    except OutputRefused as err:
        fail(str(err))
    with command_console("demo", output / "logs", verbose=verbose) as display:
        try:
            run_demo(output, seed=seed, config=config or DEFAULT_DEMO_CONFIG,
                     overrides=overrides or [], address=address, console=display.console)
        except (ConfigError, OutputRefused) as err:
            fail(str(err))


# --- metrics and baselines (issue 3) ---
from medray.eval.commands import baseline, score  # noqa: E402

app.command()(score)
app.command()(baseline)

# --- models and training (issue 4) ---
from medray.train import commands as _train_cmds  # noqa: E402  (typer only; no torch/ray)

app.add_typer(_train_cmds.model_app, name="model")
app.command("train")(_train_cmds.train)
app.command("export")(_train_cmds.export)

# --- tuning (issue 5) ---
from medray.tune.commands import tune as _tune_cmd  # noqa: E402  (typer only; no ray)

app.command("tune")(_tune_cmd)

# --- serving, evaluation, reports (issue 6) ---
from medray.eval.run_commands import eval_cmd, report_cmd, serve_cmd  # noqa: E402

app.command("serve")(serve_cmd)
app.command("eval")(eval_cmd)
app.command("report")(report_cmd)

# --- API baselines (issue 7; `medray eval --engine` is eval_cmd's engine path) ---
from medray.eval.api_commands import ensemble, translate  # noqa: E402

app.command()(ensemble)
app.command()(translate)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
