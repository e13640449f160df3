"""Entry point for `ray job submit --working-dir . -- python jobs/sweep.py --config X
--space tune/spaces/Y.yaml --output DIR` (DIR on storage every node sees).

Thin on purpose: the same command as `medray tune`. Inside a submitted job RAY_ADDRESS is
set, so the sweep joins the existing cluster; `--resume` continues an interrupted sweep.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `ray job submit --working-dir .` ships the repository; make `medray` importable from it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if __name__ == "__main__":
    from medray.cli.tune import main

    main()
