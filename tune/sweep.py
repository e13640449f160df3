"""Sweep entry point: `python tune/sweep.py --config X --space Y --output DIR [--resume] [k=v]`.

The same command as `medray tune` (medray.cli.tune over medray.tune; `plan_sweep`,
`run_sweep` and `load_plan` are re-exported for scripts that import this file). With RAY_ADDRESS set
(a cluster, `ray job submit`) it joins that cluster, otherwise it starts a local one.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run from a checkout (or a `ray job submit --working-dir .` copy) without installing.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from medray.cli.tune import main  # noqa: E402
from medray.tune.plan import load_plan, plan_sweep  # noqa: E402
from medray.tune.sweep import run_sweep  # noqa: E402

__all__ = ["load_plan", "main", "plan_sweep", "run_sweep"]

if __name__ == "__main__":
    main()
