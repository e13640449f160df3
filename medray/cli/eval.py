"""`medray eval`, `medray report`, `medray ensemble`, `medray translate`. Only typer at import
time: the work is imported inside the commands.

`medray eval --config EVAL.yaml` and `medray eval --engine KIND:TARGET --data DIR ...` are one
command over one runner (medray/eval/runner.py): the flags build the same EvalConfig a YAML
file gives.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from medray.cli.choices import MetricMode
from medray.cli.raystart import join_serve_app, start_ray
from medray.cli.train import MLFLOW_HELP, WANDB_HELP
from medray.console import command_console, fail
from medray.tracking import check_tracking, with_flags

_CFG = "--config path (any engine, from a YAML file)"
_ENG = "--engine path (shorthand: the config from flags)"


def _params(items: list[str]) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--param {item!r}: expected KEY=VALUE")
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError:
            extra[key] = value  # a bare string
    return extra


def eval_cmd(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="eval config YAML (any engine kind: serve, vllm, hf, openai, "
        "anthropic, baseline)", rich_help_panel=_CFG)] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="run directory (resumable; required)")] = None,
    address: Annotated[str | None, typer.Option(
        help="Ray address (default: local)", rich_help_panel=_CFG)] = None,
    num_cpus: Annotated[int | None, typer.Option(
        help="logical CPUs of a local Ray", rich_help_panel=_CFG)] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="show Ray/vLLM logs here (default: OUTPUT/logs/)")] = False,
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
    chat_template: Annotated[bool | None, typer.Option(
        "--chat-template/--no-chat-template", help="force the model's chat template on or "
        "off (local engines); default: its own template where it has one",
        rich_help_panel=_ENG)] = None,
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
    mlflow: Annotated[str | None, typer.Option(
        "--mlflow", metavar="URI", help=MLFLOW_HELP)] = None,
    wandb: Annotated[str | None, typer.Option(
        "--wandb", metavar="PROJECT", help=WANDB_HELP)] = None,
) -> None:
    """Evaluate on a split: --config EVAL.yaml, or --engine SPEC --data DIR (the same run
    from flags: zero-/few-shot through an API or local engine). Accuracy or F1 with CIs in
    OUTPUT/metrics.json. Rerun with the same --output resumes."""
    flags = dict(
        data=data, base_url=base_url, sample=sample, seed=seed, dry_run=dry_run,
        allow_external_api=allow_external_api, shots=shots, chat_template=chat_template,
        split=split, group_as_multiple=group_as_multiple, cache=cache, concurrency=concurrency,
        requests_per_minute=requests_per_minute, max_retries=max_retries, timeout=timeout,
        api_key_env=api_key_env, param=param, as_json=as_json)
    given = _given(ctx, {"config": config, "engine": engine, "address": address,
                         "num_cpus": num_cpus, **flags})
    if (config is None) == (engine is None):
        fail("give either --config EVAL.yaml or --engine SPEC --data DIR (the same run from "
             f"flags), {'not both' if config else 'one of them'}")
    misplaced = [flag for name, flag in given.items()
                 if name in (flags if config else ("address", "num_cpus"))]
    if misplaced:
        path, other = ("--config", "--engine") if config else ("--engine", "--config")
        fail(f"{', '.join(misplaced)}: {'options' if len(misplaced) > 1 else 'an option'} "
             f"of `medray eval {other}`, not allowed with {path}")
    if output is None:
        fail("missing option --output DIR (the run directory)")
    cfg = _config(config, engine, flags)
    cfg.tracking = with_flags(cfg.tracking, mlflow, wandb)
    if not dry_run:  # engine.app: planning reads the served prompt through its cluster
        join_serve_app(cfg.engine, address)
    plan = _plan(cfg, dry_run, shorthand=engine is not None)
    if not dry_run:
        try:  # an unreachable tracking server fails before the run folder is claimed
            check_tracking(cfg.tracking)
        except ValueError as err:
            fail(str(err))
    if dry_run:
        _print_dry_run(plan, as_json)
        return
    _evaluate(cfg, plan, output, address=address, num_cpus=num_cpus, verbose=verbose,
              as_json=as_json)


def evaluate_config(config: Path, output: Path, *, address: str | None = None,
                    num_cpus: int | None = None, verbose: bool = False,
                    as_json: bool = False) -> None:
    """`medray eval --config CONFIG --output OUTPUT` as a plain function (jobs/evaluate.py):
    the same checks, run directory, console and exit statuses."""
    cfg = _config(config, None, {})
    join_serve_app(cfg.engine, address)
    _evaluate(cfg, _plan(cfg, False, shorthand=False), output, address=address,
              num_cpus=num_cpus, verbose=verbose, as_json=as_json)


def _evaluate(cfg: Any, plan: Any, output: Path, *, address: str | None,
              num_cpus: int | None, verbose: bool, as_json: bool) -> None:
    """Claim the run directory, run the plan under the console, print the summary."""
    from medray.eval.config import EXECUTION_ONLY
    from medray.eval.runio import RunMismatch, open_run
    from medray.eval.runner import config_record
    from medray.io import OutputRefused

    try:  # claimed (and a resume checked) before the console writes OUTPUT/logs into it
        open_run(output, config_record(cfg), inputs=[cfg.data], ignore=EXECUTION_ONLY)
    except (OutputRefused, RunMismatch) as err:
        fail(str(err))
    with command_console("eval", output / "logs", verbose=verbose) as display:
        summary = _run(cfg, plan, output, display, address, num_cpus)
    _print_summary(summary, output, as_json)


def _config(config: Path | None, engine: str | None, flags: dict[str, Any]) -> Any:
    from medray.engines.registry import EngineSpecError
    from medray.eval.config import engine_config, load_eval_config

    try:
        if config is not None:
            cfg = load_eval_config(config)
        else:
            if flags["data"] is None:
                fail("--engine needs --data DIR (a prepared dataset directory)")
            opts = {k: flags[k] for k in ("base_url", "api_key_env", "concurrency",
                                          "requests_per_minute", "max_retries", "timeout",
                                          "seed")}
            cfg = engine_config(
                engine or "", flags["data"], params=_params(flags["param"] or []),
                sample=flags["sample"], shots=flags["shots"],
                chat_template=flags["chat_template"], split=flags["split"],
                group_as_multiple=flags["group_as_multiple"], cache=flags["cache"],
                allow_external_api=flags["allow_external_api"], **opts)
    except (EngineSpecError, ValueError) as err:
        fail(str(err))
    if not (cfg.data / "manifest.json").is_file():
        fail(f"{config or '--data'}: data {cfg.data} is not a prepared dataset "
             "(no manifest.json)")
    return cfg


def _plan(cfg: Any, dry_run: bool, shorthand: bool) -> Any:
    from medray.data.schema import DataError
    from medray.eval.governance import GovernanceError
    from medray.eval.plan import plan_eval

    try:
        plan = plan_eval(cfg, dry_run=dry_run)
    except (GovernanceError, DataError, FileNotFoundError, KeyError, ValueError) as err:
        fail(str(err).strip("'\""))
    spec = cfg.engine
    if shorthand and plan.data.kind == "generative" and spec.kind in ("hf", "vllm"):
        # The flags carry no prompt settings (context tokens, format, strategy): a local
        # model on clinical text is evaluated with those stated in a config.
        fail(f"engine {spec}: `medray eval --engine {spec.kind}:...` is for multiple-choice "
             f"data (RoBiology, EuropeMedQA) and API baselines; {plan.data.dataset} is "
             "generative. Evaluate a local model on it with `medray eval --config EVAL.yaml` "
             f"(engine.kind: {spec.kind}; see configs/eval-demo-vllm.yaml), which trims each "
             "epicrisis to the context budget as training did")
    return plan


def _run(cfg: Any, plan: Any, output: Path, display: Any, address: str | None,
         num_cpus: int | None) -> dict:
    """The runner under the console: a bar of answered items, then scoring."""
    from medray.data.schema import DataError
    from medray.engines.api import MissingAPIKey
    from medray.engines.registry import EngineSpecError
    from medray.eval.actors import PoolError
    from medray.eval.runio import RunMismatch
    from medray.eval.runner import run_eval

    with display.stage(f"evaluate {cfg.split} ({cfg.engine})"):
        if plan.executor == "ray":
            start_ray(address, num_cpus=num_cpus)
        with display.progress() as bars:
            task = bars.add_task("items", total=None, info="")

            def planned(stats: dict) -> None:
                bars.update(task, total=stats["selected"], completed=stats["resumed"],
                            info=f"{stats['resumed']} resumed" if stats["resumed"] else "")

            try:
                return run_eval(cfg, output, plan=plan, on_plan=planned,
                                on_prediction=lambda row: bars.advance(task))
            except (MissingAPIKey, EngineSpecError, RunMismatch, DataError,
                    FileNotFoundError, ValueError) as err:
                fail(str(err))
            except PoolError as err:  # not the user's input: exit 1, the answers kept
                fail(str(err), code=1)
    raise AssertionError("unreachable")  # fail() raised


def _given(ctx: typer.Context, values: dict[str, Any]) -> dict[str, str]:
    """Option name -> flag, for the options the user set (the command line records where
    each value came from, so `--seed 0` counts as given)."""
    flags = {p.name: p.opts[0] for p in ctx.command.params}
    return {n: flags[n] for n in values
            if getattr(ctx.get_parameter_source(n), "name", "DEFAULT") != "DEFAULT"}


def _print_dry_run(plan: Any, as_json: bool) -> None:
    from medray.eval.dryrun import dry_run_report
    from medray.eval.summary import summary_lines

    result = dry_run_report(plan)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, ensure_ascii=False, default=str) + "\n")
        return
    for messages in result["prompts"]:
        typer.echo("---- prompt ----")
        for m in messages:
            typer.echo(f"[{m['role']}]\n{m['content']}")
    for line in summary_lines(result):
        typer.echo(line)


def _print_summary(summary: dict, output: Path, as_json: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    from medray.eval.summary import summary_lines

    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2, ensure_ascii=False, default=str) + "\n")
        return
    lines = summary_lines(summary)
    typer.echo(lines[0])
    table = Table()
    for col in ("mode", "metric", "mean [95% CI]"):
        table.add_column(col)
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
    for line in lines[1:]:
        typer.echo(line)
    req = summary["requests"]
    lost = (f", {req['actors_replaced']} evaluation actor(s) lost and replaced "
            f"({req['reasked']} items asked again)" if req.get("actors_replaced") else "")
    typer.echo(f"requests: {req['requested']} sent, {req['resumed']} resumed from "
               f"{output}/predictions.jsonl{lost}; metrics in {output}/metrics.json", err=True)


def report_cmd(
    runs: Annotated[list[Path], typer.Argument(help="run directories of `medray eval`")],
    out: Annotated[Path, typer.Option("--out", help="folder for tables and plots")],
    mode: Annotated[MetricMode, typer.Option(help="metric mode to tabulate")
                    ] = MetricMode.medqaro,
    force: Annotated[bool, typer.Option(
        help="replace --out even if it is a non-empty folder medray did not create")] = False,
    by: Annotated[str | None, typer.Option(
        "--by", help="comma-separated breakdown fields, each with CIs: country, modality, "
        "language, specialty, year, gold_letter, kind, question_type, grade, stage, or any "
        "column or meta key of the items")] = None,
    hard_items: Annotated[bool, typer.Option(
        "--hard-items", help="list the items every given run misses, counted per --by field "
        "(default: per kind / question type)")] = False,
    resamples: Annotated[int, typer.Option(min=1, help="bootstrap resamples of the "
                                                       "breakdowns")] = 1000,
) -> None:
    """Paper-style tables (Markdown, CSV, LaTeX) and PNG plots from evaluation runs, generative
    and multiple-choice runs in one table; per-field breakdowns and the items all runs miss."""
    from medray.eval.report import ReportError, write_report
    from medray.io import OutputRefused

    fields = [f.strip() for f in (by or "").split(",") if f.strip()]
    try:
        files = write_report(runs, out, mode=str(mode), force=force, by=fields,
                             hard=hard_items, resamples=resamples)
    except (ReportError, OutputRefused) as err:
        fail(str(err))
    typer.echo((out / "results.md").read_text().split("\n## ")[0].rstrip())
    if hard_items:
        typer.echo("\n" + (out / "hard_items.md").read_text().splitlines()[0].lstrip("# "))
    typer.echo("\nwritten: " + ", ".join(str(f) for f in files))


def ensemble(
    runs: Annotated[list[Path], typer.Argument(
        help="run directories (predictions.jsonl), the "
        "strongest first: ties go to the earliest listed")],
    data: Annotated[Path, typer.Option(help="prepared dataset directory the runs answered")],
    output: Annotated[Path, typer.Option(help="directory for the ensemble row")],
    split: Annotated[str, typer.Option(help="split to vote on")] = "test",
    seed: Annotated[int, typer.Option(help="bootstrap seed")] = 0,
) -> None:
    """Unweighted majority vote over multiple-choice runs, scored as its own row."""
    from medray.eval.ensemble import majority_vote
    from medray.eval.summary import summary_lines

    try:
        m = majority_vote(runs, data, output, split=split, seed=seed)
    except (ValueError, FileNotFoundError, KeyError) as err:
        fail(str(err))
    typer.echo(f"{m['row']} ({', '.join(map(str, runs))}); ties: {m['n_ties']}, broken by "
               f"the {m['tie_rule']}")
    for line in summary_lines(m)[1:]:
        typer.echo(line)


def translate(
    engine: Annotated[str, typer.Option(help="translation engine, e.g. openai:gpt-4o-mini")],
    data: Annotated[Path, typer.Option(help="prepared multiple-choice dataset directory")],
    output: Annotated[Path, typer.Option(help="new prepared dataset directory (language en)")],
    base_url: Annotated[str | None, typer.Option(help="API base URL")] = None,
    cache: Annotated[Path | None, typer.Option(
        help="response cache (default as `medray eval --engine`)")] = None,
) -> None:
    """Translate questions and options to English (EuropeMedQA protocol), ids preserved."""
    from medray.engines.registry import EngineSpecError, build_engine, parse_spec
    from medray.eval.plan import default_cache_path
    from medray.eval.translate import TranslationError, translate_dataset

    try:
        spec = parse_spec(engine, base_url=base_url)
        kwargs = {"cache": cache or default_cache_path()} if spec.external else {}
        eng = build_engine(spec, **kwargs)
        out = translate_dataset(data, output, eng)
    except (EngineSpecError, TranslationError, ValueError, FileNotFoundError,
            RuntimeError) as err:
        fail(str(err))
    usage = out.manifest["translation"]["usage"] or {}
    typer.echo(f"translated {len(out.examples)} items to English with {spec} into {output} "
               f"(new calls {usage.get('calls')}, cached {usage.get('cached')}, cost "
               f"{usage.get('cost_usd')} USD at list prices as of {usage.get('prices_as_of')})")
