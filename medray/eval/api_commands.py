"""`medray eval-api` (issue 7; the lead will fold it into `medray eval --engine ...`).
Only typer at import time: everything heavy is imported inside the command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


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


def eval_api(
    engine: str = typer.Option(..., help="openai:MODEL | anthropic:MODEL (also hf:PATH, "
                               "vllm:PATH, serve:URL)"),
    data: Path = typer.Option(..., help="prepared dataset directory"),
    output: Path = typer.Option(Path("runs/eval-api"), help="run directory (resumable)"),
    base_url: str = typer.Option(None, help="OpenAI-compatible / Messages API base URL"),
    sample: int = typer.Option(None, help="seeded random subset of N items (the papers' 100)"),
    seed: int = typer.Option(0, help="seed of --sample, of the shots and of the bootstrap"),
    dry_run: bool = typer.Option(False, help="print prompts, item count, token and cost "
                                 "estimate; call nothing"),
    allow_external_api: bool = typer.Option(False, help="permit sending clinical context "
                                            "(MedQARo) to an external provider"),
    shots: int = typer.Option(0, help="in-context examples (RoBiology: 0/1/3/5)"),
    split: str = typer.Option("test", help="split to evaluate"),
    group_as_multiple: bool = typer.Option(False, help="ask group items as multiple choice "
                                           "over the statements, map back to a letter"),
    cache: Path = typer.Option(None, help="response cache (default ~/.cache/medray/"
                               "api_responses.sqlite or $MEDRAY_CACHE_DIR)"),
    concurrency: int = typer.Option(4, help="API calls in flight at most"),
    requests_per_minute: float = typer.Option(None, help="API call starts per minute at most"),
    max_retries: int = typer.Option(5, help="SDK transport retries (429, 5xx, timeouts)"),
    timeout: float = typer.Option(60.0, help="SDK request timeout, seconds"),
    api_key_env: str = typer.Option(None, help="environment variable holding the API key "
                                    "(default OPENAI_API_KEY / ANTHROPIC_API_KEY)"),
    param: list[str] = typer.Option(None, help="extra request field KEY=VALUE (JSON value), "
                                    "e.g. reasoning_effort=minimal for reasoning models whose "
                                    "thinking counts against the minimal max tokens"),
    as_json: bool = typer.Option(False, "--json", help="print the metrics as JSON"),
) -> None:
    """Zero-/few-shot evaluation through an API (or local) engine: accuracy with CIs."""
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

    try:
        result = run_external_eval(
            engine, data, output, base_url=base_url, sample=sample, seed=seed,
            progress=None if dry_run or as_json else progress,
            dry_run=dry_run, allow_external_api=allow_external_api, shots=shots, split=split,
            cache=cache, group_as_multiple=group_as_multiple,
            engine_kwargs=api_kwargs)
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
    cache: Path = typer.Option(None, help="response cache (default as eval-api)"),
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
