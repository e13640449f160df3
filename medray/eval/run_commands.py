"""`medray serve`, `medray eval`, `medray report`. Only typer at import time."""

from __future__ import annotations

import inspect
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from medray.choices import MetricMode
from medray.console import command_console, fail

_fail = fail


def _init_ray(address: str | None, num_cpus: int | None,
              log_to_driver: bool | None = None) -> None:
    from medray.raycluster import connect

    connect(address, num_cpus=num_cpus, log_to_driver=log_to_driver)


def serve_cmd(
    config: Annotated[Path, typer.Option("--config", "-c", help="Serve config (serve/*.yaml)")],
    address: Annotated[str | None, typer.Option(help="Ray address (default: local)")] = None,
    num_cpus: Annotated[int | None, typer.Option(help="logical CPUs of a local Ray")] = None,
    block: Annotated[bool, typer.Option(help="keep serving until Ctrl-C")] = True,
    logs: Annotated[Path, typer.Option(help="folder for Ray/Serve/vLLM logs")] = Path(
        "runs/serve/logs"),
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="show Ray/Serve/vLLM logs here instead of in --logs")] = False,
) -> None:
    """Serve a model (vLLM replicas + QA ingress) from the same YAML `serve run` reads."""
    from pydantic import ValidationError

    from medray.serve_config import load_serve_file
    from medray.serving.validation import check_servable

    try:
        spec = load_serve_file(config)
        check_servable(spec.args.resolved(), spec.args)  # before Ray or any replica starts
    except (OSError, ValueError, ValidationError) as err:
        _fail(f"{config}: {err}")
    with command_console("serve", logs, verbose=verbose) as display:
        with display.stage("start Ray Serve and the vLLM replicas"):
            _init_ray(address, num_cpus, log_to_driver=False)
            from ray import serve

            from medray.serve_app import build_app

            serve.start(http_options={"host": spec.host, "port": spec.port})
            serve.run(build_app(spec.args), name=spec.name, route_prefix=spec.route_prefix)
        names = [spec.args.model_id, *spec.args.adapters, *spec.args.models]
        display.print(f"serving {', '.join(names)} at http://{spec.host}:{spec.port}"
                      f"{spec.route_prefix} (logs: {logs}){'; Ctrl-C stops' if block else ''}")
        if not block:
            return
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:  # the normal way to stop a server: exit 0
            serve.shutdown()


_CFG = "--config path (evaluation actors on Ray)"
_ENG = "--engine path (API or local engine)"


def eval_cmd(
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="eval config YAML (Serve/vLLM/baseline evaluation actors)",
        rich_help_panel=_CFG)] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="run directory (resumable; required)")] = None,
    address: Annotated[str | None, typer.Option(
        help="Ray address (default: local)", rich_help_panel=_CFG)] = None,
    num_cpus: Annotated[int | None, typer.Option(
        help="logical CPUs of a local Ray", rich_help_panel=_CFG)] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="show Ray/vLLM logs here (default: OUTPUT/logs/)",
        rich_help_panel=_CFG)] = False,
    engine: Annotated[str | None, typer.Option(
        help="openai:MODEL | anthropic:MODEL (also serve:URL; hf:PATH and vllm:PATH on "
        "multiple-choice data only: local models on MedQARo go through --config)",
        rich_help_panel=_ENG)] = None,
    data: Annotated[Path | None, typer.Option(
        help="prepared dataset directory (required with --engine)", rich_help_panel=_ENG)] = None,
    base_url: Annotated[str | None, typer.Option(
        help="OpenAI-compatible / Messages API base URL", rich_help_panel=_ENG)] = None,
    sample: Annotated[int | None, typer.Option(
        help="seeded random subset of N items (the papers' 100)", rich_help_panel=_ENG)] = None,
    seed: Annotated[int, typer.Option(
        help="seed of --sample, of the shots and of the bootstrap", rich_help_panel=_ENG)] = 0,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="print prompts, item count, token and cost estimate; call nothing",
        rich_help_panel=_ENG)] = False,
    allow_external_api: Annotated[bool, typer.Option(
        "--allow-external-api", help="permit sending clinical context (MedQARo) to an "
        "external provider", rich_help_panel=_ENG)] = False,
    shots: Annotated[int, typer.Option(
        help="in-context examples (RoBiology: 0/1/3/5)", rich_help_panel=_ENG)] = 0,
    split: Annotated[str, typer.Option(help="split to evaluate", rich_help_panel=_ENG)] = "test",
    group_as_multiple: Annotated[bool, typer.Option(
        "--group-as-multiple", help="ask group items as multiple choice over the statements, "
        "map back to a letter", rich_help_panel=_ENG)] = False,
    cache: Annotated[Path | None, typer.Option(
        help="response cache (default ~/.cache/medray/api_responses.sqlite or "
        "$MEDRAY_CACHE_DIR)", rich_help_panel=_ENG)] = None,
    concurrency: Annotated[int, typer.Option(
        help="API calls in flight at most", rich_help_panel=_ENG)] = 4,
    requests_per_minute: Annotated[float | None, typer.Option(
        help="API call starts per minute at most", rich_help_panel=_ENG)] = None,
    max_retries: Annotated[int, typer.Option(
        help="SDK transport retries (429, 5xx, timeouts)", rich_help_panel=_ENG)] = 5,
    timeout: Annotated[float, typer.Option(
        help="SDK request timeout, seconds", rich_help_panel=_ENG)] = 60.0,
    api_key_env: Annotated[str | None, typer.Option(
        help="environment variable holding the API key (default OPENAI_API_KEY / "
        "ANTHROPIC_API_KEY)", rich_help_panel=_ENG)] = None,
    param: Annotated[list[str] | None, typer.Option(
        help="extra request field KEY=VALUE (JSON value), e.g. reasoning_effort=minimal for "
        "reasoning models whose thinking counts against the minimal max tokens",
        rich_help_panel=_ENG)] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="print the metrics as JSON", rich_help_panel=_ENG)] = False,
    ctx: typer.Context = None,  # type: ignore[assignment]  # None in a plain Python call
) -> None:
    """Evaluate on a split. Either --config EVAL.yaml (evaluation actors) or --engine SPEC
    --data DIR (zero-/few-shot through an API or local engine: accuracy or F1 with CIs).
    Rerun with the same --output resumes."""
    engine_opts = dict(
        data=data, base_url=base_url, sample=sample, seed=seed, dry_run=dry_run,
        allow_external_api=allow_external_api, shots=shots, split=split,
        group_as_multiple=group_as_multiple, cache=cache, concurrency=concurrency,
        requests_per_minute=requests_per_minute, max_retries=max_retries, timeout=timeout,
        api_key_env=api_key_env, param=param, as_json=as_json)
    given = _given(ctx, {"config": config, "engine": engine, "address": address,
                         "num_cpus": num_cpus, **engine_opts})
    if (config is None) == (engine is None):
        _fail("give either --config EVAL.yaml (evaluation actors) or --engine SPEC --data DIR "
              f"(API or local engine), {'not both' if config else 'one of them'}")
    misplaced = [flag for name, flag in given.items()
                 if name in (engine_opts if config else ("address", "num_cpus"))]
    if misplaced:
        path, other = ("--config", "--engine") if config else ("--engine", "--config")
        _fail(f"{', '.join(misplaced)}: {'options' if len(misplaced) > 1 else 'an option'} "
              f"of `medray eval {other}`, not allowed with {path}")
    if output is None:
        _fail("missing option --output DIR (the run directory)")
    if engine is not None:
        if data is None:
            _fail("--engine needs --data DIR (a prepared dataset directory)")
        from medray.eval.api_commands import run_engine_eval

        run_engine_eval(engine, output, **engine_opts)
        return
    from medray.eval.config import load_eval_config

    try:
        cfg = load_eval_config(config)
    except ValueError as err:
        _fail(str(err))
    if not (cfg.data / "manifest.json").is_file():
        _fail(f"{config}: data {cfg.data} is not a prepared dataset (no manifest.json)")
    from medray.fsutil import OutputRefused, claim_directory

    try:  # claimed before the console writes OUTPUT/logs into it
        claim_directory(output, inputs=[cfg.data], command="eval")
    except OutputRefused as err:
        _fail(str(err))
    with command_console("eval", output / "logs", verbose=verbose) as display:
        summary = _run_actors(cfg, output, display, address, num_cpus)
    _print_summary(summary, output)


def _run_actors(cfg: Any, output: Path, display: Any, address: str | None,
                num_cpus: int | None) -> dict:
    """Evaluation actors under the console: a bar of answered items, then scoring."""
    from medray.eval.runner import run_eval

    with display.stage(f"evaluate {cfg.split} ({cfg.engine.kind} {cfg.engine.label})"):
        _init_ray(address, num_cpus)
        with display.progress() as bars:
            task = bars.add_task("items", total=None, info="")

            def planned(stats: dict) -> None:
                bars.update(task, total=stats["selected"], completed=stats["resumed"],
                            info=f"{stats['resumed']} resumed" if stats["resumed"] else "")

            return run_eval(cfg, output, on_prediction=lambda row: bars.advance(task),
                            on_plan=planned)


def _given(ctx: typer.Context | None, values: dict[str, Any]) -> dict[str, str]:
    """Option name -> flag, for the options the user set. The CLI records where each value
    came from, so `--seed 0` counts as given; a plain Python call (jobs/evaluate.py) counts
    the values that differ from eval_cmd's defaults."""
    if ctx is None:
        defaults = inspect.signature(eval_cmd).parameters
        return {n: "--" + n.replace("_", "-") for n, v in values.items()
                if v != defaults[n].default}
    flags = {p.name: p.opts[0] for p in ctx.command.params}
    return {n: flags[n] for n in values
            if getattr(ctx.get_parameter_source(n), "name", "DEFAULT") != "DEFAULT"}


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
    mode: Annotated[MetricMode, typer.Option(help="metric mode to tabulate")
                    ] = MetricMode.medqaro,
    force: Annotated[bool, typer.Option(
        help="replace --out even if it is a non-empty folder medray did not create")] = False,
) -> None:
    """Paper-style tables (Markdown, CSV, LaTeX) and PNG plots from evaluation runs."""
    from medray.eval.report import ReportError, write_report
    from medray.fsutil import OutputRefused

    try:
        files = write_report(runs, out, mode=str(mode), force=force)
    except (ReportError, OutputRefused) as err:
        _fail(str(err))
    typer.echo((out / "results.md").read_text().split("\n## ")[0].rstrip())
    typer.echo("\nwritten: " + ", ".join(str(f) for f in files))
