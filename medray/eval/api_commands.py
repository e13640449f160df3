"""The `--engine` path of `medray eval`, plus `medray ensemble` and `medray translate`.
Only typer at import time: everything heavy is imported inside the functions."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from medray.console import fail

_fail = fail


def _api_kwargs(engine: str, concurrency: int, rpm: float | None, max_retries: int,
                timeout: float, api_key_env: str | None, params: list[str]) -> dict:
    if not engine.startswith(("openai:", "anthropic:")):
        return {}
    extra = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--param {item!r}: expected KEY=VALUE")
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError:
            extra[key] = value  # a bare string
    return {"concurrency": concurrency, "requests_per_minute": rpm, "max_retries": max_retries,
            "timeout": timeout, "api_key_env": api_key_env, "params": extra}


def run_engine_eval(engine: str, output: Path, *, data: Path, dry_run: bool, as_json: bool,
                    concurrency: int, requests_per_minute: float | None, max_retries: int,
                    timeout: float, api_key_env: str | None, param: list[str] | None,
                    **eval_opts: Any) -> None:
    """`medray eval --engine SPEC --data DIR`: run, then print the summary (or JSON). The
    options and their defaults are `eval_cmd`'s; `eval_opts` go to `run_external_eval`
    (base_url, sample, seed, allow_external_api, shots, split, group_as_multiple, cache).
    Errors print to stderr and exit 2."""
    from medray.data.schema import DataError
    from medray.engines.registry import EngineSpecError
    from medray.eval.api_eval import run_external_eval, summary_lines
    from medray.eval.governance import GovernanceError
    from medray.eval.runio import RunMismatch

    api_kwargs = _api_kwargs(engine, concurrency, requests_per_minute, max_retries, timeout,
                             api_key_env, param or [])
    bar = None

    def progress(done: int, total: int) -> None:  # counts only: never item text
        nonlocal bar
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(total=total, desc="items", unit="item", file=sys.stderr)
        bar.update(done - bar.n)

    from medray.fsutil import check_output

    try:
        check_output(output, [data])  # OutputRefused (a ValueError): exit 2 below
        result = run_external_eval(
            engine, data, output, dry_run=dry_run, engine_kwargs=api_kwargs,
            progress=None if dry_run or as_json else progress, **eval_opts)
    except (GovernanceError, EngineSpecError, RunMismatch, DataError, FileNotFoundError,
            KeyError, ValueError) as err:
        _fail(str(err))
    except RuntimeError as err:  # e.g. a missing API key
        _fail(str(err))
    if bar is not None:
        bar.close()
    if as_json:
        json.dump(result, sys.stdout, indent=2, ensure_ascii=False, default=str)
        sys.stdout.write("\n")
        return
    if dry_run:
        for messages in result["prompts"]:
            typer.echo("---- prompt ----")
            for m in messages:
                typer.echo(f"[{m['role']}]\n{m['content']}")
    for line in summary_lines(result):
        typer.echo(line)


def ensemble(
    runs: list[Path] = typer.Argument(..., help="run directories (predictions.jsonl), the "
                                      "strongest first: ties go to the earliest listed"),
    data: Path = typer.Option(..., help="prepared dataset directory the runs answered"),
    output: Path = typer.Option(..., help="directory for the ensemble row"),
    split: str = typer.Option("test", help="split to vote on"),
    seed: int = typer.Option(0, help="bootstrap seed"),
) -> None:
    """Unweighted majority vote over multiple-choice runs, scored as its own row."""
    from medray.eval.api_eval import summary_lines
    from medray.eval.ensemble import majority_vote

    try:
        m = majority_vote(runs, data, output, split=split, seed=seed)
    except (ValueError, FileNotFoundError, KeyError) as err:
        _fail(str(err))
    typer.echo(f"{m['row']} ({', '.join(map(str, runs))}); ties: {m['n_ties']}, broken by "
               f"the {m['tie_rule']}")
    for line in summary_lines({**m, "sample": None})[1:]:
        typer.echo(line)


def translate(
    engine: str = typer.Option(..., help="translation engine, e.g. openai:gpt-4o-mini"),
    data: Path = typer.Option(..., help="prepared multiple-choice dataset directory"),
    output: Path = typer.Option(..., help="new prepared dataset directory (language en)"),
    base_url: str = typer.Option(None, help="API base URL"),
    cache: Path = typer.Option(None, help="response cache (default as `medray eval --engine`)"),
) -> None:
    """Translate questions and options to English (EuropeMedQA protocol), ids preserved."""
    from medray.engines.registry import EngineSpecError, build_engine, parse_spec
    from medray.eval.api_eval import default_cache_path
    from medray.eval.translate import TranslationError, translate_dataset

    try:
        spec = parse_spec(engine)
        kwargs = {"base_url": base_url, "cache": cache or default_cache_path()} \
            if spec.external else {}
        eng = build_engine(spec, **kwargs)
        out = translate_dataset(data, output, eng)
    except (EngineSpecError, TranslationError, ValueError, FileNotFoundError,
            RuntimeError) as err:
        _fail(str(err))
    usage = out.manifest["translation"]["usage"] or {}
    typer.echo(f"translated {len(out.examples)} items to English with {spec} into {output} "
               f"(new calls {usage.get('calls')}, cached {usage.get('cached')}, cost "
               f"{usage.get('cost_usd')} USD at list prices as of {usage.get('prices_as_of')})")
