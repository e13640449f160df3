"""`medray tune` (Ray is imported inside the command, never at CLI import)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from medray.cli.choices import OptMode, SearchAlg, SweepMetric
from medray.cli.train import MLFLOW_HELP, WANDB_HELP
from medray.console import command_console, fail, terminal


def tune(
    output: Annotated[Path, typer.Option("--output", help="sweep directory")],
    config: Annotated[Path | None, typer.Option(
        "--config", help="training YAML (configs/*.yaml)")] = None,
    space: Annotated[Path | None, typer.Option(
        "--space", help="search space YAML (tune/spaces/*.yaml)")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="continue an interrupted sweep in OUTPUT (finished "
        "trials are kept, unfinished ones resume)")] = False,
    search: Annotated[SearchAlg | None, typer.Option(
        help="search algorithm (default: the space's)")] = None,
    num_samples: Annotated[int | None, typer.Option(
        help="trials (random/optuna) or grid repeats")] = None,
    max_concurrent_trials: Annotated[int | None, typer.Option(
        help="default: space, else all (queued)")] = None,
    metric: Annotated[SweepMetric | None, typer.Option(
        help="metric to optimise (default: the space's)")] = None,
    mode: Annotated[OptMode | None, typer.Option(help="max or min (default: the space's)")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(
        help="dotted key=value training overrides")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="write into --output even if it is a "
        "non-empty folder medray did not create")] = False,
    best_if_partial: Annotated[bool, typer.Option(
        "--best-if-partial", help="write best.yaml even when the sweep was "
        "interrupted (the best trial so far)")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="show Ray Tune/Train logs here (default: OUTPUT/logs/)")] = False,
    mlflow: Annotated[str | None, typer.Option(
        "--mlflow", metavar="URI", help=MLFLOW_HELP + "; one child run per trial")] = None,
    wandb: Annotated[str | None, typer.Option(
        "--wandb", metavar="PROJECT", help=WANDB_HELP)] = None,
) -> None:
    """Sweep hyperparameters with Ray Tune (ASHA; grid, random or Optuna search).

    Writes OUTPUT/trials.csv, OUTPUT/best.yaml (a config `medray train` runs as is),
    OUTPUT/val_f1_vs_hparams.png and TensorBoard files (tensorboard --logdir OUTPUT).
    Ctrl-C stops the sweep, keeps what finished and exits 130; --resume continues it.
    """
    from medray.cluster import StorageNotShared
    from medray.config import ConfigError
    from medray.io import OutputRefused, claim_directory
    from medray.tracking import check_tracking, with_flags
    from medray.tune.outputs import SweepFailed
    from medray.tune.plan import load_plan, plan_sweep
    from medray.tune.tracked import tracking_of

    try:
        if resume:
            if overrides or search or num_samples or metric or mode:
                fail("--resume continues the sweep as it was started; drop the overrides "
                      "and search options")
            plan = load_plan(output)
        else:
            if config is None or space is None:
                fail("--config and --space are required (or --resume with --output)")
            plan = plan_sweep(config, space, output, overrides or [],
                              search=search and str(search), num_samples=num_samples,
                              metric=metric and str(metric), mode=mode and str(mode),
                              max_concurrent_trials=max_concurrent_trials)
            model = Path(plan.base["model"]["name_or_path"])
            claim_directory(output, inputs=[plan.base["data"]["path"],
                                            *([model] if model.exists() else [])],
                            force=force, command="tune")
        if max_concurrent_trials:
            plan.max_concurrent_trials = max_concurrent_trials
        if not resume:  # the training config's tracking section, with the flags applied
            tracking = with_flags(tracking_of(plan), mlflow, wandb)
            plan.base["tracking"] = tracking.model_dump(mode="json")
            check_tracking(tracking)  # an unreachable server fails before Ray starts
        elif mlflow or wandb:
            fail("--resume logs to the tracking of the sweep it continues; drop --mlflow "
                 "and --wandb")
    except (ConfigError, FileNotFoundError, FileExistsError, OutputRefused) as exc:
        fail(str(exc))
    with command_console("tune", output / "logs", verbose=verbose) as display:
        try:
            summary = _run(plan, display, resume=resume, best_if_partial=best_if_partial)
        except (ConfigError, FileNotFoundError, FileExistsError, StorageNotShared) as exc:
            fail(str(exc))
        except SweepFailed as exc:
            fail(str(exc), code=1)
    if summary.interrupted:
        terminal().print(f"interrupted: finished trials are kept; continue with "
                         f"`medray tune --output {output} --resume`", markup=False)
        raise typer.Exit(130)


def _run(plan: Any, display: Any, *, resume: bool, best_if_partial: bool) -> Any:
    """The sweep under the console: a bar of finished trials (new sweeps), then the summary."""
    from medray.cli.raystart import start_ray
    from medray.tune.plan import local_cpus, trial_count
    from medray.tune.progress import TrialProgress
    from medray.tune.sweep import preflight_sweep, run_sweep

    preflight_sweep(plan, display.print)  # fails in seconds, before Ray starts
    # RAY_ADDRESS set (ray job submit, a cluster): join it; otherwise a local cluster with
    # room for every concurrent trial.
    start_ray(min_cpus=local_cpus(plan))
    with display.stage("sweep"), display.progress() as bars:
        callbacks = [] if resume else [TrialProgress(bars, trial_count(plan), plan.metric,
                                                     plan.mode)]
        return run_sweep(plan, resume=resume, log=display.print, preflight=False,
                         best_if_partial=best_if_partial, callbacks=callbacks)


def main(argv: list[str] | None = None) -> None:
    """`tune/sweep.py` and `jobs/sweep.py`: the `medray tune` command on its own (exits)."""
    from medray.cli.standalone import run_alone

    run_alone(tune, "sweep.py", argv)


def register(root: typer.Typer) -> None:
    root.command("tune")(tune)
