"""`medray demo`: the embedded default, end to end on a laptop.

Today it runs the data stage of the pipeline on synthetic MedQARo-like data: synthesise,
prepare (validate, normalise, store each epicrisis once), print statistics and one
rendered prompt. Later stages join here as they land.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from medray.data.prepare import prepare
from medray.data.render import render_example
from medray.data.stats import compute_stats
from medray.data.synth import write_medqaro

PROMPT_PREVIEW_TOKENS = 160


def run_demo(output: Path, seed: int = 0, console: Console | None = None) -> dict:
    console = console or Console()
    output.mkdir(parents=True, exist_ok=True)

    console.rule("[bold]1/3 synthesise MedQARo-like data")
    raw = write_medqaro(output / "raw", seed=seed, scale="small")
    console.print(f"raw CSVs (released format) in {raw}")

    console.rule("[bold]2/3 prepare: validate, normalise, one Arrow schema")
    data = prepare("medqaro", raw, output / "data")
    stats = compute_stats(data)
    console.print_json(json.dumps(stats, ensure_ascii=False, default=str))

    console.rule("[bold]3/3 a rendered prompt (Q+E+A, trimmed to "
                 f"{PROMPT_PREVIEW_TOKENS} whitespace tokens)")
    first_test = data.split("test")["id"].iloc[0]
    console.print(render_example(data, first_test, fmt="qea",
                                 context_tokens=PROMPT_PREVIEW_TOKENS), markup=False)

    (output / "stats.json").write_text(json.dumps(stats, ensure_ascii=False, indent=2,
                                                  default=str))
    console.rule("[bold green]done")
    console.print(f"prepared data: {output / 'data'}  stats: {output / 'stats.json'}")
    return stats
