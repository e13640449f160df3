"""`medray data ...`: synth, prepare, stats, prompt."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from medray.cli.choices import Compat, Dataset, PromptFormat, Scale
from medray.console import fail
from medray.data.registry import DATASETS
from medray.prompts.spec import REFERENCE_MAX_NEW_TOKENS

SCALE_HELP = "corpus size (default per dataset: " + ", ".join(
    f"{name} {spec.synthetic_scale}" for name, spec in DATASETS.items()) + ")"

app = typer.Typer(rich_markup_mode=None,
                  help="Synthesise, prepare and inspect benchmark data.",
                  no_args_is_help=True)


DatasetOpt = Annotated[Dataset, typer.Option("--dataset", "-d", help="the benchmark")]
ForceOpt = Annotated[bool, typer.Option(
    "--force", help="replace --out even if it is a non-empty folder medray did not create "
    "(an output that equals, contains or lies inside the input is refused regardless)")]


@app.command()
def synth(
    dataset: DatasetOpt,
    out: Annotated[Path, typer.Option(help="directory for the raw files")],
    seed: int = 0,
    scale: Annotated[Scale | None, typer.Option(help=SCALE_HELP)] = None,
    force: ForceOpt = False,
) -> None:
    """Write deterministic synthetic data in the benchmark's released raw format."""
    from medray.data import synth as generators
    from medray.io import OutputRefused

    write = generators.WRITERS[dataset.value]
    scale = scale or Scale(DATASETS[dataset.value].synthetic_scale)
    try:
        path = write(out, seed=seed, scale=scale.value, force=force)
    except OutputRefused as err:
        fail(str(err))
    typer.echo(f"wrote synthetic {dataset} (seed {seed}, scale {scale}) to {path}")


@app.command()
def prepare(
    dataset: DatasetOpt,
    input: Annotated[Path, typer.Option("--input", "-i", help="raw file or directory")],
    out: Annotated[Path, typer.Option(help="prepared dataset directory")],
    compat: Annotated[Compat | None, typer.Option(
        help="'medqaro': reproduce the reference's newline deletion (glues words)")] = None,
    shuffle: Annotated[bool, typer.Option(
        help="EuropeMedQA: permute options per item (protocol, seed 42)")] = True,
    seed: int = 42,
    encoding: Annotated[str | None, typer.Option(
        help="text encoding of the raw files (default: UTF-8, with or without BOM), "
        "e.g. cp1250, cp1252, latin-2")] = None,
    force: ForceOpt = False,
) -> None:
    """Validate and normalise raw files into one Arrow schema (Parquet)."""
    from medray.data.prepare import prepare as run_prepare
    from medray.data.schema import DataError
    from medray.data.stats import compute_stats, letter_shares
    from medray.io import OutputRefused

    if not input.exists():
        fail(f"--input {input}: no such file or directory")
    try:
        data = run_prepare(dataset.value, input, out, compat=compat and compat.value,
                           shuffle=shuffle, seed=seed, encoding=encoding, force=force)
    except (DataError, OutputRefused) as err:
        fail(str(err))
    _print_files(data.manifest)
    stats = compute_stats(data)
    typer.echo(f"prepared {dataset.value} -> {out} ({stats['examples']} examples)")
    for split, n in stats["splits"].items():
        extra = f", {stats['patients'][split]} patients" if "patients" in stats else ""
        typer.echo(f"  {split}: {n} examples{extra}")
    if "contexts" in stats:
        typer.echo(f"  contexts stored once: {stats['contexts']}"
                   f" (compat: {data.manifest['compat'] or 'none'})")
    if dataset is Dataset.europemedqa:
        removed = data.manifest["removed"]["no_validated_key"]
        shuffled = f"on (seed {seed})" if shuffle else "off"
        typer.echo(f"  removed without a validated key: {removed}; option shuffle {shuffled}")
        typer.echo(f"  key letters over single-answer items: {stats['answer_letters']} "
                   f"shares {letter_shares(stats['answer_letters'])}")


def _print_files(manifest: dict) -> None:
    """Which file became which split, and what was ignored: discovery is never silent."""
    files = manifest.get("files") or {}
    pairs = ([(path, split) for split, path in files.items()] if manifest["dataset"] == "medqaro"
             else list(files.items()))
    for path, split in pairs:
        typer.echo(f"  {Path(path).name} -> {split}")
    if manifest["dataset"] == "medqaro" and "val" not in files:
        typer.echo("  no val split (val.csv): training will have no validation data")
    for path in manifest.get("ignored") or []:
        typer.echo(f"  ignored: {Path(path).name}")


@app.command()
def stats(
    directory: Annotated[Path, typer.Argument(help="prepared dataset directory")],
    tokenizer: Annotated[str | None, typer.Option(help="count context tokens with this "
                                                  "tokenizer (hub id or path)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Counts per split, patients, contexts, answer letters and lengths."""
    from medray.data.prepared import load_prepared
    from medray.data.stats import compute_stats, to_json

    try:
        data = load_prepared(directory)
    except FileNotFoundError as err:
        fail(str(err))
    tok = None
    if tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    result = compute_stats(data, tok)
    if as_json:
        typer.echo(to_json(result))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result['dataset']} ({result['kind']}) — {directory}")
    table.add_column("statistic")
    table.add_column("value")
    for key, value in result.items():
        if key not in ("dataset", "kind"):
            table.add_row(key, str(value))
    Console().print(table)


@app.command()
def prompt(
    directory: Annotated[Path, typer.Argument(help="prepared dataset directory")],
    id: Annotated[str, typer.Option(
        "--id", help="example id as prepared: test:12 (MedQARo), test:rb-… (RoBiology), "
        "IT0001 (EuropeMedQA); `medray data stats DIR --json` shows the splits")],
    format: Annotated[PromptFormat, typer.Option("--format", help="MedQARo prompt order")
                      ] = PromptFormat.qea,
    context_tokens: Annotated[int | None, typer.Option(
        help="MedQARo: trim the epicrisis so the prompt fits N tokens")] = None,
    max_new_tokens: Annotated[int, typer.Option(
        help="MedQARo: tokens kept free for the answer inside --context-tokens")
                              ] = REFERENCE_MAX_NEW_TOKENS,
    tokenizer: Annotated[str | None, typer.Option(
        help="tokenizer for --context-tokens (hub id or path); default: whitespace words")] = None,
    shots: Annotated[int, typer.Option(help="RoBiology: 0, 1, 3 or 5 examples")] = 0,
    seed: Annotated[int, typer.Option(help="RoBiology: seed of the shot picker, as in "
                                      "`medray eval`")] = 0,
    chat_template: Annotated[bool | None, typer.Option(
        "--chat-template/--no-chat-template",
        help="force the tokenizer's chat template on or off; default: the tokenizer's own "
        "template where it has one (with --tokenizer), plain text otherwise")] = None,
) -> None:
    """Print the rendered prompt of one example, exactly as training and serving see it."""
    from pydantic import ValidationError

    from medray.data.prepared import load_prepared
    from medray.prompts.render import needs_tokenizer, render_example
    from medray.prompts.spec import PromptSpec

    try:
        fields = {"format": format.value, "max_new_tokens": max_new_tokens, "shots": shots,
                  "chat_template": "auto" if chat_template is None else chat_template}
        if context_tokens is not None:
            fields["context_tokens"] = context_tokens
        spec = PromptSpec(**fields)
        data = load_prepared(directory)
        trim = context_tokens is not None
        tok = None
        if tokenizer is not None and needs_tokenizer(data, spec, trim=trim):
            from medray.models import load_tokenizer

            tok = load_tokenizer(tokenizer)
        text = render_example(data, id, spec, trim=trim, tokenizer=tok, seed=seed)
    except ValidationError as err:
        first = err.errors()[0]
        fail(f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}")
    except (KeyError, ValueError, FileNotFoundError) as err:
        fail(str(err).strip("'\""))
    sys.stdout.write(text + "\n")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="data")
