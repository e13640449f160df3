"""Entry point for `ray job submit --working-dir . -- python jobs/finetune.py --config X
--output DIR [key=value ...]` (DIR on storage every node sees).

Thin on purpose: the `medray train` command on its own (same options, checks and exit
statuses). Inside a submitted job RAY_ADDRESS is set, so the run joins that cluster;
Ray's own logs go to DIR/logs/ (`--verbose` shows them in the job's log instead).
"""

from __future__ import annotations

import sys
from pathlib import Path

# `ray job submit --working-dir .` ships the repository; make `medray` importable from it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if __name__ == "__main__":
    from medray.cli.standalone import run_alone
    from medray.cli.train import train

    run_alone(train, "finetune.py")
