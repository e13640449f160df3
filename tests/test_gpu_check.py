"""bench/gpu_check.py --dry-run: the GPU check's code path on CPU, so it cannot rot.

Tiny shapes of both models, bf16, DeepSpeed ZeRO-2 over a one-process gloo group, medray's
collate and training step; Ray is made unimportable, as on the GPU machine. The real-model
section runs on a tiny Llama checkpoint saved and loaded back (no SmolLM2 import) and says
why its vLLM part is skipped (no GPU). ~15 s here.
    flock /tmp/medray-heavy.lock pytest tests/test_gpu_check.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run the script with `import ray` failing, as on a GPU machine without Ray.
NO_RAY = (
    "import runpy, sys; sys.modules['ray'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", NO_RAY, str(ROOT / "bench" / "gpu_check.py"), "--dry-run",
         "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["ok"] and res["header"]["dry_run"] and res["header"]["backend"] == "gloo"
    assert res["header"]["world_size"] == 1
    assert set(res["models"]) == {"phi-4-mini", "llama-3-8b"}
    for name, entry in res["models"].items():
        assert entry["engine"].startswith("deepspeed"), entry["engine"]
        assert entry["rope_inv_freq_float32"] is True
        losses = entry["loss_check"]["losses"]
        assert entry["loss_check"]["decreased"] and losses[-1] < losses[0]
        cases = {(c["context"], c["batching"]): c for c in entry["cases"]}
        assert set(cases) == {(n, b) for n in (64, 128, 256) for b in ("padded", "packed")}
        for (context, _), case in cases.items():
            assert case["useful_tokens_per_s"] > 0 and case["steps"] == 3, (name, case)
            assert 0 < case["useful_fraction"] <= 1
            assert case["checkpointing"] == (context == 256)
    fused = res["models"]["phi-4-mini"]["lora_targets"]
    assert fused == ["qkv_proj", "o_proj"]  # Phi-4-mini's fused attention projection
    assert "packed / padded" in proc.stdout and "MFU = useful tok/s" in proc.stdout
    real = res["real"]
    assert real["ok"] and real["source"].startswith("dry run"), real["source"]
    training = real["training"]
    assert training["lora_targets"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert training["loss_check"]["decreased"] and training["rope_inv_freq_float32"]
    cases = {(c["context"], c["batching"]): c for c in training["cases"]}
    assert set(cases) == {(n, b) for n in (64, 256) for b in ("padded", "packed")}
    assert all(c["useful_tokens_per_s"] > 0 for c in cases.values()), cases
    assert "no GPU" in real["vllm"]["skipped"]
    assert "vLLM evaluation: skipped: no GPU" in proc.stdout
