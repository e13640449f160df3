"""Entry point for `ray job submit --working-dir . -- python jobs/finetune.py --config X`.

Thin on purpose: parses arguments and calls the same code as `medray train`. Inside a
submitted job RAY_ADDRESS is set, so `connect()` joins the existing cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# `ray job submit --working-dir .` ships the repository; make `medray` importable from it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="YAML config (configs/*.yaml)")
    parser.add_argument("--output", required=True, help="run directory (shared storage)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    args = parser.parse_args(argv)

    from medray.config import ConfigError
    from medray.fsutil import OutputRefused, check_output
    from medray.models import LoraTargetError
    from medray.raycluster import connect
    from medray.tokenize import BudgetError
    from medray.train.config import load_config
    from medray.train.trainer import preflight, run_training

    try:
        cfg = load_config(args.config, args.overrides)
        check_output(args.output, [cfg.data.path])  # never into a folder medray did not make
        preflight(cfg)  # every cheap check, before Ray starts
        # RAY_ADDRESS (set by `ray job submit`) or a local cluster sized for the run.
        connect(min_cpus=cfg.scaling.local_cpus())
        metrics = run_training(cfg, args.output)
    except (ConfigError, LoraTargetError, BudgetError, FileNotFoundError,
            OutputRefused) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    last = metrics["epochs"][-1] if metrics["epochs"] else {}
    print(f"done: adapter {metrics['adapter']}; last epoch {last}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
