"""Ray Jobs entry point: `ray job submit -- python jobs/evaluate.py --config X --output DIR`.

Same code path as `medray eval` (connects to the job's cluster with address="auto").
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="eval config YAML")
    parser.add_argument("--output", required=True, help="run directory (resumable)")
    parser.add_argument("--address", default="auto", help="Ray address ('' for a local Ray)")
    args = parser.parse_args(argv)

    from pathlib import Path

    import typer

    from medray.cli.eval import evaluate_config

    try:
        evaluate_config(Path(args.config), Path(args.output), address=args.address or None)
    except typer.Exit as exc:
        return int(exc.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
