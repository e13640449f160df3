"""`medray serve`, `medray eval`, `medray report`. Only typer at import time."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _init_ray(address: str | None, num_cpus: int | None) -> None:
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        # Serve's proxy and the ingress need logical CPUs beside the LLM replicas' bundles.
        ray.init(num_cpus=num_cpus or max(4, os.cpu_count() or 1), include_dashboard=False,
                 log_to_driver=False)


def serve_cmd(
    config: Annotated[Path, typer.Option("--config", "-c", help="Serve config (serve/*.yaml)")],
    address: Annotated[str | None, typer.Option(help="Ray address (default: local)")] = None,
    num_cpus: Annotated[int | None, typer.Option(help="logical CPUs of a local Ray")] = None,
    block: Annotated[bool, typer.Option(help="keep serving until Ctrl-C")] = True,
) -> None:
    """Serve a model (vLLM replicas + QA ingress) from the same YAML `serve run` reads."""
    from pydantic import ValidationError

    from medray.serve_config import load_serve_file

    try:
        spec = load_serve_file(config)
    except (OSError, ValueError, ValidationError) as err:
        _fail(f"{config}: {err}")
    _init_ray(address, num_cpus)
    from ray import serve

    from medray.serve_app import build_app

    serve.start(http_options={"host": spec.host, "port": spec.port})
    serve.run(build_app(spec.args), name=spec.name, route_prefix=spec.route_prefix)
    typer.echo(f"serving {spec.args.model_id} ({spec.args.model}) at "
               f"http://{spec.host}:{spec.port}{spec.route_prefix}", err=True)
    if not block:
        return
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()


def eval_cmd(
    config: Annotated[Path, typer.Option("--config", "-c", help="eval config YAML")],
    output: Annotated[Path, typer.Option("--output", "-o", help="run directory (resumable)")],
    address: Annotated[str | None, typer.Option(help="Ray address (default: local)")] = None,
    num_cpus: Annotated[int | None, typer.Option(help="logical CPUs of a local Ray")] = None,
) -> None:
    """Evaluate on a split through evaluation actors; rerun with the same --output resumes."""
    from medray.eval.config import load_eval_config

    try:
        cfg = load_eval_config(config)
    except ValueError as err:
        _fail(str(err))
    if not (cfg.data / "manifest.json").is_file():
        _fail(f"{config}: data {cfg.data} is not a prepared dataset (no manifest.json)")
    _init_ray(address, num_cpus)
    from medray.eval.runner import run_eval

    summary = run_eval(cfg, output)
    _print_summary(summary, output)


def _print_summary(summary: dict, output: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    run, req = summary["run"], summary["requests"]
    table = Table(title=f"{run['dataset']} {run['split']} n={run['n']} | {run['engine']} "
                        f"{run['model']} adapter={run['adapter']} | {run['prompt_format']} "
                        f"{run['context_tokens']} tokens, {run['strategy']}")
    table.add_column("mode")
    table.add_column("metric")
    table.add_column("mean [95% CI]")
    for mode, res in summary["metrics"].items():
        for name, m in res["metrics"].items():
            if not isinstance(m, dict):
                continue
            ci = m.get("ci95") or [None, None]
            val = "n/a" if m.get("mean") is None else (
                f"{m['mean']:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]" if ci[0] is not None
                else f"{m['mean']:.4f}")
            table.add_row(mode, name, val)
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    typer.echo(f"requests: {req['requested']} sent, {req['resumed']} resumed from "
               f"{output}/predictions.jsonl; metrics in {output}/metrics.json", err=True)


def report_cmd(
    runs: Annotated[list[Path], typer.Argument(help="run directories of `medray eval`")],
    out: Annotated[Path, typer.Option("--out", help="folder for tables and plots")],
    mode: Annotated[str, typer.Option(help="metric mode to tabulate")] = "medqaro",
) -> None:
    """Paper-style tables (Markdown, CSV, LaTeX) and PNG plots from evaluation runs."""
    from medray.eval.report import ReportError, write_report

    try:
        files = write_report(runs, out, mode=mode)
    except ReportError as err:
        _fail(str(err))
    typer.echo(json.dumps([str(f) for f in files]))
