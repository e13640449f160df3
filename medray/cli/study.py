"""`medray study context-length` (Ray, Tune and the engines are imported inside)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from medray.console import command_console, fail

study_app = typer.Typer(help="The papers' studies, each one command.", no_args_is_help=True)


@study_app.command("context-length")
def context_length(
    output: Annotated[Path, typer.Option("--output", help="study folder")],
    lengths: Annotated[str, typer.Option(help="context budgets, e.g. 1024,2048,4096")],
    config: Annotated[Path | None, typer.Option(
        "--config", help="training YAML: one run per length (a Ray Tune grid)")] = None,
    eval_only: Annotated[str | None, typer.Option(
        "--eval-only", help="no training: evaluate this model (folder or hub id) at each "
        "length")] = None,
    data: Annotated[Path | None, typer.Option(
        help="prepared data to evaluate on (default: the training config's)")] = None,
    splits: Annotated[str, typer.Option(help="comma-separated splits")] = "test,test_cross",
    engine: Annotated[str, typer.Option(help="evaluation engine: vllm (actors) or hf "
                                             "(in-process transformers)")] = "vllm",
    limit: Annotated[int | None, typer.Option(min=1, help="first N items per split (smoke "
                                                          "runs)")] = None,
    resamples: Annotated[int, typer.Option(min=1, help="bootstrap resamples")] = 1000,
    overrides: Annotated[list[str] | None, typer.Argument(
        help="dotted key=value training overrides")] = None,
    force: Annotated[bool, typer.Option(help="write into --output even if it is a non-empty "
                                             "folder medray did not create")] = False,
    verbose: Annotated[bool, typer.Option(help="show Ray logs here (default: "
                                               "OUTPUT/logs/)")] = False,
) -> None:
    """Train (or only evaluate) one model at several context budgets and tabulate F1 / EM /
    BLEU / METEOR with CIs per length, in-domain and cross-domain. Rerunning the same command
    resumes: finished trials and answered items are kept."""
    from medray.config import ConfigError
    from medray.io import OutputRefused, claim_directory
    from medray.tune.study import parse_lengths, sweep_plan

    if (config is None) == (eval_only is None):
        fail("give --config (train at each length) or --eval-only MODEL, not both")
    if engine not in ("vllm", "hf"):
        fail(f"--engine {engine!r}: vllm or hf")
    split_list = [s.strip() for s in splits.split(",") if s.strip()]
    try:
        budgets = parse_lengths(lengths)
        if eval_only is not None and data is None:
            fail("--eval-only needs --data")
        resume = (output / "sweep" / "sweep_spec.json").is_file()
        if config is not None and not resume:
            with tempfile.TemporaryDirectory() as scratch:  # every check before OUTPUT exists
                sweep_plan(config, budgets, Path(scratch), overrides or [])
        claim_directory(output, inputs=[p for p in (data, config) if p], force=force,
                        command="study")
        plan = None if config is None else (
            _resumed(output, budgets) if resume
            else sweep_plan(config, budgets, output, overrides or []))
    except (ConfigError, OutputRefused, FileNotFoundError) as exc:
        fail(str(exc))
    data_dir = str(data or plan.base["data"]["path"])
    with command_console("study", output / "logs", verbose=verbose) as display:
        _run(plan, budgets, eval_only, data_dir, output, display, split_list, engine,
             limit, resamples, resume)


def _resumed(output: Path, budgets: list[int]):
    """The sweep this study started; the lengths must be the ones it was started with."""
    from medray.config import ConfigError
    from medray.tune.plan import load_plan

    plan = load_plan(output / "sweep")
    started = sorted(plan.space.params["prompt.context_tokens"].values or [])
    if started != budgets:
        raise ConfigError(f"{output} holds a study of {started} tokens; rerun with --lengths "
                          f"{','.join(map(str, started))} to resume it, or choose another "
                          "--output")
    return plan


def _run(plan, budgets, eval_only, data_dir, output, display, splits, engine, limit,
         resamples, resume) -> None:
    from medray.cli.raystart import start_ray
    from medray.cluster import StorageNotShared
    from medray.tune.outputs import SweepFailed
    from medray.tune.plan import local_cpus
    from medray.tune.study import evaluate_lengths, trained_models, write_tables
    from medray.tune.sweep import preflight_sweep, run_sweep

    if plan is not None:
        preflight_sweep(plan, display.print)
        start_ray(min_cpus=local_cpus(plan))
        with display.stage(f"train at {len(budgets)} lengths (Ray Tune grid)"):
            try:
                run_sweep(plan, resume=resume, log=display.print, preflight=False)
            except StorageNotShared as exc:
                fail(str(exc))
            except SweepFailed as exc:
                fail(str(exc), code=1)
        models = trained_models(plan.output)
        missing = sorted(set(budgets) - set(models))
        if missing:
            fail(f"no finished training run for {missing} tokens (see {plan.output}/trials.csv)",
                 code=1)
    else:
        start_ray(min_cpus=2)
        models = {n: (eval_only, None) for n in budgets}
    with display.stage("evaluate each length"):
        runs = evaluate_lengths(models, data_dir, output, splits=splits, engine=engine,
                                eval_only=plan is None, resamples=resamples, limit=limit,
                                log=display.print)
    files = write_tables(runs, output)
    display.print("written: " + ", ".join(str(f) for f in files))


def register(root: typer.Typer) -> None:
    root.add_typer(study_app, name="study")
