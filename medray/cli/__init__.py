"""The `medray` command line: one typer app, one module per command group.

    medray data ...           medray.cli.data   (synth, prepare, stats, prompt)
    medray model/train/export medray.cli.train
    medray tune               medray.cli.tune
    medray study              medray.cli.study  (context-length)
    medray demo               medray.cli.demo
    medray eval/report/score/baseline/ensemble/translate/serve   the evaluation side

Each module exposes `register(app)`. Importing the CLI stays light: torch, ray and vLLM
are imported inside the commands. Every command reports bad input through
medray.console.fail (`error: ...`, exit status 2). `python -m medray` runs the same app.
"""

from __future__ import annotations

import typer

from medray.cli import data, demo, study, train, tune

app = typer.Typer(rich_markup_mode=None,
    help="Fine-tune, serve and evaluate LLMs on medical QA benchmarks, on Ray.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

for _group in (data, demo, train, tune, study):
    _group.register(app)


def _register_evaluation(root: typer.Typer) -> None:
    """The evaluation side: eval, report, score, baseline, ensemble, translate, serve."""
    from medray.cli.eval import ensemble, eval_cmd, report_cmd, translate
    from medray.cli.score import baseline, score
    from medray.cli.serve import serve_cmd

    root.command()(score)
    root.command()(baseline)
    root.command("serve")(serve_cmd)
    root.command("eval")(eval_cmd)
    root.command("report")(report_cmd)
    root.command()(ensemble)
    root.command()(translate)


_register_evaluation(app)


def main() -> None:
    """The `medray` command: the app, then exit noise kept off the person's terminal."""
    from medray.console import exit_output_to_log

    try:
        app()
    finally:
        exit_output_to_log()
