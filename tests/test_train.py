"""Real Ray Train V2 runs: 2 CPU workers, DeepSpeed ZeRO-2, PEFT LoRA on the tiny model.

Budget on 2 cores (measured): the `tiny_trained` run (which also loses a worker and
resumes) ~2-2.5 min, the vLLM adapter check ~40 s. Run under the shared lock:
    flock /tmp/medray-heavy.lock .venv/bin/pytest tests/test_train.py -x -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_TRAINED_OVERRIDES, TRAIN_KILL_MARKER


def test_training_lowers_val_loss_and_writes_outputs(tiny_trained):
    m = json.loads((tiny_trained / "metrics.json").read_text())
    epochs = m["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert epochs[-1]["val_loss"] < m["initial"]["val_loss"] - 0.1  # it learned something
    for e in epochs:
        assert e["tokens_per_s"] > 0 and e["train_loss"] > 0
        assert 0.0 <= e["val_f1"] <= 1.0 and 0.0 <= e["val_em"] <= 1.0
        assert e["val_generated"] == m["config"]["data"]["val_generate_examples"]
    assert m["config"]["deepspeed"]["stage"] == 2 and m["config"]["scaling"]["num_workers"] == 2
    assert "medqaro" in m["how"]  # numbers say how they were computed
    adapter = tiny_trained / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    assert (adapter / "adapter_model.safetensors").is_file()
    assert list((tiny_trained / "tensorboard").glob("events.out.tfevents.*"))
    # The prompt it was trained with, beside the adapter (what Serve and eval read back).
    from medray.prompts.spec import PromptSpec, load_prompt_spec

    trained = PromptSpec.model_validate(m["config"]["prompt"])
    assert trained.context_tokens == 128 and trained.answer_reserve == 10
    assert load_prompt_spec(adapter) == trained
    checkpoints = list((tiny_trained / "ray").glob("*/checkpoint_*/adapter"))
    assert checkpoints and all(load_prompt_spec(c) == trained for c in checkpoints)


def test_adapter_loads_in_transformers_and_changes_the_model(tiny_trained, tiny_model):
    import torch
    from peft import PeftModel

    from medray.models import load_model_and_tokenizer

    cfg = json.loads((tiny_trained / "adapter" / "adapter_config.json").read_text())
    assert sorted(cfg["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert (cfg["r"], cfg["lora_alpha"]) == (8, 16)
    base, tok = load_model_and_tokenizer(str(tiny_model), "fp32")
    ids = torch.tensor([tok("Intrebare: Are pacienta metastaze? Context: x Raspuns:")["input_ids"]])
    with torch.no_grad():
        before = base(input_ids=ids).logits
        tuned = PeftModel.from_pretrained(base, str(tiny_trained / "adapter"))
        after = tuned(input_ids=ids).logits
    assert not torch.allclose(before, after, atol=1e-4)  # LoRA B is no longer zero


def test_export_merge_matches_peft(tiny_trained, tmp_path):
    import torch
    from peft import PeftModel
    from typer.testing import CliRunner

    from medray.cli import app
    from medray.models import load_model_and_tokenizer
    from medray.prompts.spec import load_prompt_spec

    res = CliRunner().invoke(app, ["export", str(tiny_trained), "--merge", "--out",
                                   str(tmp_path / "merged")])
    assert res.exit_code == 0, res.output
    # The merged model is prompted as its adapter was trained.
    assert load_prompt_spec(tmp_path / "merged") == load_prompt_spec(tiny_trained / "adapter")
    assert load_prompt_spec(tmp_path / "merged") is not None
    merged, tok = load_model_and_tokenizer(str(tmp_path / "merged"), "fp32")
    base_path = json.loads((tiny_trained / "adapter" / "adapter_config.json").read_text())[
        "base_model_name_or_path"]
    base, _ = load_model_and_tokenizer(base_path, "fp32")
    peft = PeftModel.from_pretrained(base, str(tiny_trained / "adapter"))
    ids = torch.tensor([tok("Context: pacienta Intrebare: Ce stadiu? Raspuns:")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, peft(input_ids=ids).logits,
                                   atol=1e-4, rtol=1e-4)


VLLM_SCRIPT = r"""
import json, sys
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest
if __name__ == "__main__":
    model, adapter, prompt = sys.argv[1], sys.argv[2], sys.argv[3]
    llm = LLM(model=model, enable_lora=True, max_lora_rank=8, enforce_eager=True,
              dtype="float32", max_model_len=512, gpu_memory_utilization=0.5)
    sp = SamplingParams(max_tokens=6, temperature=0.0)
    out = llm.generate([prompt], sp, lora_request=LoRARequest("medray", 1, adapter))
    print("RESULT " + json.dumps(list(out[0].outputs[0].token_ids)))
"""


def test_adapter_loads_in_vllm_with_same_greedy_tokens(tiny_trained, tiny_model, tmp_path):
    pytest.importorskip("vllm")
    import torch
    from peft import PeftModel

    from medray.models import load_model_and_tokenizer

    prompt = "Intrebare: Are pacienta metastaze? Context: pacienta Raspuns:"
    script = tmp_path / "vllm_lora.py"
    script.write_text(VLLM_SCRIPT)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    proc = subprocess.run([sys.executable, str(script), str(tiny_model),
                           str(tiny_trained / "adapter"), prompt],
                          capture_output=True, text=True, env=env, timeout=400)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    vllm_tokens = json.loads(lines[-1][len("RESULT "):])

    base, tok = load_model_and_tokenizer(str(tiny_model), "fp32")
    peft = PeftModel.from_pretrained(base, str(tiny_trained / "adapter")).eval()
    ids = torch.tensor([tok(prompt)["input_ids"]])
    with torch.no_grad():
        gen = peft.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                            max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    hf_tokens = gen[0, ids.shape[1]:].tolist()
    assert vllm_tokens[: len(hf_tokens)] == hf_tokens[: len(vllm_tokens)]


def test_killed_worker_resumes_from_checkpoint(tiny_trained):
    """The shared training run lost worker rank 1 at step 5 (see conftest.tiny_trained)."""
    marker = tiny_trained.parent / TRAIN_KILL_MARKER
    out = tiny_trained
    killed = json.loads(marker.read_text())
    assert killed == {**killed, "rank": 1, "step": 5}  # rank 1 really died at step 5
    m = json.loads((Path(out) / "metrics.json").read_text())
    # The replacement worker group restarted from the step-4 checkpoint, not from scratch,
    # and the run finished both epochs: at most 1 step was lost.
    assert m["resumed_from_step"] == 4
    assert m["epochs"][-1]["epoch"] == 2 and m["epochs"][-1]["step"] == m["plan"]["total_steps"]
    assert (Path(out) / "adapter" / "adapter_model.safetensors").is_file()


def test_a_restart_after_the_last_checkpoint_reports_the_final_epoch_again(
        tiny_trained, tiny_model, medqaro_prepared, tmp_path):
    """A run interrupted after its last checkpoint was saved, but perhaps before the report
    reached its caller (a Tune trial would end on its previous epoch): the restart trains
    nothing and reports the final epoch once more, with a checkpoint of its own state."""
    import shutil

    import ray.train

    from medray.train.presets import tiny_config
    from medray.train.trainer import run_training

    reports = tmp_path / "reports.jsonl"

    class RecordReports(ray.train.UserCallback):  # local: pickled by value to the controller
        def after_report(self, run_context, metrics, checkpoint) -> None:
            with open(reports, "a") as f:
                f.write(json.dumps({"metrics": metrics[0],
                                    "checkpoint": checkpoint is not None}) + "\n")

    before = json.loads((tiny_trained / "metrics.json").read_text())
    again = tmp_path / "run"
    shutil.copytree(tiny_trained, again)
    cfg = tiny_config(tiny_model, medqaro_prepared, TINY_TRAINED_OVERRIDES)
    m = run_training(cfg, again, callbacks=[RecordReports()])
    final = before["epochs"][-1]
    assert m["resumed_from_step"] == final["step"], m["resumed_from_step"]
    assert m["epochs"] == before["epochs"]  # nothing trained again
    sent = [json.loads(x) for x in reports.read_text().splitlines()]
    assert len(sent) == 1 and sent[0]["checkpoint"], sent
    assert (sent[0]["metrics"]["epoch"], sent[0]["metrics"]["step"]) == (2, final["step"])
    assert sent[0]["metrics"]["val_loss"] == pytest.approx(final["val_loss"])
