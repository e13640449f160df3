"""bench/lm_eval_parity.py on a few items: `medray eval`'s option log-likelihood (hf engine)
and lm-evaluation-harness's `multiple_choice` task over the same strings pick the same
option for every item, with the real SmolLM2 (~40 s here besides the model import).
    flock /tmp/medray-heavy.lock pytest tests/test_lm_eval_parity.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_lm_eval_parity_few_items(smollm2_model, shared_data, tmp_path):
    out = tmp_path / "parity.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEDRAY_SHARED_DATA": str(shared_data)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "lm_eval_parity.py"), "--n", "4",
         "--model", str(smollm2_model), "--robiology-scale", "small", "--no-results",
         "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res["datasets"]) == {"europemedqa", "robiology"}
    for name, c in res["datasets"].items():
        assert c["n"] == 4, name
        # lm-eval asked for exactly the strings medray scores, and picked the same options
        assert c["same_request_strings"] == 1.0, name
        assert c["agreement"] == 1.0 and c["agreement_norm"] == 1.0, c["disagreements"]
        assert c["acc"]["medray"] == c["acc"]["lm_eval"], c
        assert c["acc_norm"]["medray"] == c["acc_norm"]["lm_eval"], c
        assert c["max_abs_logprob_diff"] < 1e-3, c
        assert c["items_per_s"]["medray"] > 0 and c["items_per_s"]["lm_eval"] > 0
    assert "lm-eval parity" in proc.stdout
