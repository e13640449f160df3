"""The GPU code path, checked on CPU: devices, collectives, dtype cast, accumulation steps.

Real DeepSpeed (single process, gloo world size 1) and the worker's own setup function
(`build_engine`) and step function (`train_step`); the device is injected where a GPU
would be (`meta` tensors show where every tensor goes without computing on it).
DeepSpeed runs here: `flock /tmp/medray-heavy.lock pytest tests/test_gpu_path.py`.
"""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def process_group():
    """A real one-process gloo group, as a Ray Train worker has (world size 1)."""
    import os

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _rows(n: int, seed: int = 0) -> list[dict]:
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        prompt, answer = rng.randint(6, 20), rng.randint(1, 4)
        ids = [rng.randrange(4, 200) for _ in range(prompt + answer)]
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


# ----------------------------------------------------------------------- devices


def test_backend_names_cpu_and_cuda_collectives():
    from ray.train.torch.config import _is_backend_nccl
    from torch.distributed.distributed_c10d import BackendConfig

    from medray.train.device import torch_backend

    assert torch_backend(False) == "gloo"
    gpu = torch_backend(True)
    assert BackendConfig(gpu).get_device_backend_map() == {"cpu": "gloo", "cuda": "nccl"}
    assert _is_backend_nccl(gpu)  # Ray still applies its NCCL settings


def test_trainer_uses_the_device_backend(tiny_model, tmp_path):
    from medray.train.presets import tiny_config
    from medray.train.trainer import build_trainer

    for use_gpu, backend in ((True, "cpu:gloo,cuda:nccl"), (False, "gloo")):
        cfg = tiny_config(tiny_model, tmp_path, [f"scaling.use_gpu={str(use_gpu).lower()}"])
        trainer = build_trainer(cfg, tmp_path, {"total_steps": 1}, {})
        assert trainer.backend_config.backend == backend


def test_worker_device_comes_from_the_injected_get_device():
    import torch

    from medray.train.device import worker_device

    calls = []

    def recorded() -> torch.device:
        calls.append(1)
        return torch.device("meta")

    assert worker_device(recorded) == torch.device("meta") and calls == [1]


@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_batches_move_to_the_worker_device(mode):
    import torch

    from medray.train.collate import micro_batches
    from medray.train.device import to_device

    batch = next(micro_batches(_rows(8), batch_size=4, pad_id=0, mode=mode, max_len=64))
    moved = to_device(batch, torch.device("meta"))
    tensors = {k: v for k, v in moved.items() if isinstance(v, torch.Tensor)}
    assert set(tensors) >= {"input_ids", "labels"}
    assert all(v.device.type == "meta" for v in tensors.values())
    assert moved["num_tokens"] == batch["num_tokens"]  # bookkeeping stays a Python int


def test_collective_tensors_live_on_the_worker_device(process_group):
    import torch

    from medray.train.device import all_reduce, reduce_tensor

    # A real collective (gloo, world size 1) on the device given...
    assert all_reduce([1.0, 2.5], torch.device("cpu")) == [1.0, 2.5]
    assert all_reduce([3.0], torch.device("cpu"), op="min") == [3.0]
    # ...and the tensor is built on that device, whatever it is (cuda under NCCL).
    process_group.destroy_process_group()
    try:
        assert reduce_tensor([1.0], torch.device("meta")).device.type == "meta"
    finally:
        process_group.init_process_group("gloo", rank=0, world_size=1)


class _TinyLM:
    """A two-layer torch LM: HF models cannot run forward on `meta` (data-dependent mask
    code), this one can, so the step's device handling is visible end to end."""

    def __new__(cls, seen: list):
        import torch

        class LM(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb = torch.nn.Embedding(256, 8)
                self.out = torch.nn.Linear(8, 256)

            def forward(self, input_ids, use_cache=None, **rest):
                seen.append({k: v.device.type for k, v in
                             {"input_ids": input_ids, **rest}.items()})
                return SimpleNamespace(logits=self.out(self.emb(input_ids)))

        return LM()


@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_train_step_sends_every_tensor_to_the_device(mode):
    import torch

    from medray.train.collate import micro_batches
    from medray.train.step import TorchEngine, train_step

    seen: list = []
    with torch.device("meta"):
        model = _TinyLM(seen)
    engine = TorchEngine(model, torch.optim.AdamW(model.parameters(), lr=1e-3), grad_accum=2)
    batches = list(micro_batches(_rows(64), batch_size=4, pad_id=0, mode=mode, max_len=64))
    assert len(batches) >= 4
    results = [train_step(engine, b, torch.device("meta")) for b in batches[:4]]
    assert seen and all(set(s.values()) == {"meta"} for s in seen)
    assert "position_ids" in seen[0] if mode == "pack" else "attention_mask" in seen[0]
    assert all(r.loss.device.type == "meta" for r in results)
    assert [r.tokens for r in results] == [b["num_tokens"] for b in batches[:4]]
    assert [r.boundary for r in results] == [False, True, False, True]
    assert engine.global_steps == 2


# -------------------------------------------------------- the worker's own setup


def _engine(tiny_model, tmp_path, *overrides: str):
    import torch

    from medray.train.loop import build_engine
    from medray.train.plan import RunPlan
    from medray.train.presets import tiny_config

    cfg = tiny_config(tiny_model, tmp_path, ["optim.warmup_steps=0", *overrides])
    torch.manual_seed(0)
    plan = RunPlan(lora_targets="auto", n_train=0, n_val=0, train_ids=None, val_ids=None,
                   steps_per_epoch_estimate=100, total_steps=100)
    return build_engine(cfg, plan, 1, torch.device("cpu"))


def test_bf16_run_keeps_rope_buffers_float32(tiny_model, tmp_path, process_group):
    import torch

    from medray.models import load_model_and_tokenizer
    from medray.train.collate import micro_batches
    from medray.train.device import cast_parameters, float_buffers
    from medray.train.step import train_step

    # The bug being fixed: a module-wide .to(bf16) rounds RoPE's inv_freq.
    plain, _ = load_model_and_tokenizer(str(tiny_model), "bf16")
    assert set(float_buffers(plain).values()) == {torch.float32}
    assert set(float_buffers(plain.to(torch.bfloat16)).values()) == {torch.bfloat16}
    fixed, _ = load_model_and_tokenizer(str(tiny_model), "fp32")
    cast_parameters(fixed, torch.bfloat16)
    assert {p.dtype for p in fixed.parameters()} == {torch.bfloat16}
    assert set(float_buffers(fixed).values()) == {torch.float32}

    # The worker's setup (device map, LoRA, cast, DeepSpeed bf16) and a real bf16 step.
    engine, model, tok, _ = _engine(tiny_model, tmp_path, "model.dtype=bf16")
    buffers = float_buffers(engine.module)
    assert any("inv_freq" in n for n in buffers)
    assert set(buffers.values()) == {torch.float32}
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.bfloat16}
    batch = next(micro_batches(_rows(8), batch_size=4, pad_id=tok.pad_token_id))
    res = train_step(engine, batch, torch.device("cpu"))
    assert torch.isfinite(res.loss) and res.loss.dtype in (torch.bfloat16, torch.float32)
    assert set(float_buffers(engine.module).values()) == {torch.float32}


@pytest.mark.parametrize("grad_accum", [1, 2, 4])
def test_step_counting_follows_deepspeed(tiny_model, tmp_path, process_group, grad_accum):
    """The loop's boundary flag agrees with DeepSpeed's own optimiser-step counter."""
    import torch

    from medray.train.collate import micro_batches
    from medray.train.step import train_step

    engine, _, tok, scheduler = _engine(tiny_model, tmp_path, "model.dtype=fp32",
                                        f"optim.grad_accum={grad_accum}")
    batches = list(micro_batches(_rows(16, seed=1), batch_size=2, pad_id=tok.pad_token_id))
    assert len(batches) == 8
    flagged, lrs = [], []
    for i, batch in enumerate(batches):
        before = engine.global_steps
        res = train_step(engine, batch, torch.device("cpu"))
        # A flagged micro-batch is exactly one where DeepSpeed stepped the optimiser.
        assert res.boundary == (engine.global_steps == before + 1), (i, grad_accum)
        if res.boundary:
            flagged.append((i, engine.global_steps))
            lrs.append(scheduler.get_last_lr()[0])
    assert flagged == [(i, (i + 1) // grad_accum) for i in range(8)
                       if (i + 1) % grad_accum == 0]
    assert engine.global_steps == 8 // grad_accum and engine.micro_steps == 8
    assert 0 not in [s for _, s in flagged]  # no "step 0" checkpoint or log line


def test_deepspeed_compiles_no_shared_memory_op(tiny_model, tmp_path, process_group):
    """Only tensor-parallel inference calls DeepSpeed's shm all-reduce; compiling it cost
    every CPU worker 20-130 s (a two-node run's workers were ready after two minutes)."""
    import deepspeed.comm.comm as ds_comm
    from deepspeed.comm.torch import build_shm_op

    _engine(tiny_model, tmp_path, "model.dtype=fp32")
    assert ds_comm.cdb is not None and ds_comm.cdb.shm_comm_op is None
    assert build_shm_op() is None  # without the switch: a gcc build, then the op


def test_models_load_with_a_device_map_cache_and_attention(tiny_model, tmp_path):
    import torch

    from medray.models import check_attn_implementation, load_model_and_tokenizer

    # The weights go straight to the device given (a device map), never via host RAM:
    # visible with `meta`, where nothing is materialised at all.
    on_meta, _ = load_model_and_tokenizer(str(tiny_model), "bf16", device=torch.device("meta"))
    assert {p.device.type for p in on_meta.parameters()} == {"meta"}
    model, _ = load_model_and_tokenizer(str(tiny_model), "fp32", device=torch.device("cpu"),
                                        cache_dir=str(tmp_path / "hf"),
                                        attn_implementation="eager")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert model.config._attn_implementation == "eager"
    default, _ = load_model_and_tokenizer(str(tiny_model), "fp32")
    assert default.config._attn_implementation == "sdpa"
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(ValueError, match="flash-attn"):
            check_attn_implementation("flash_attention_2")
    with pytest.raises(ValueError, match="expected one of"):
        check_attn_implementation("flash")


def test_attn_implementation_and_cache_dir_config(tiny_model, medqaro_prepared, tmp_path):
    import importlib.util

    from medray.train.config import ConfigError
    from medray.train.presets import tiny_config
    from medray.train.trainer import preflight, resolve_cache_dir

    cfg = tiny_config(tiny_model, medqaro_prepared)
    assert cfg.model.attn_implementation == "sdpa" and cfg.model.cache_dir is None
    assert resolve_cache_dir(cfg, tmp_path / "run") == str(tmp_path / "run" / "hf-cache")
    kept = tiny_config(tiny_model, medqaro_prepared, ["model.cache_dir=/mnt/shared/hf-cache"])
    assert resolve_cache_dir(kept, tmp_path) == "/mnt/shared/hf-cache"
    if importlib.util.find_spec("flash_attn") is None:
        fa = tiny_config(tiny_model, medqaro_prepared,
                         ["model.attn_implementation=flash_attention_2"])
        with pytest.raises(ConfigError, match="flash-attn"):
            preflight(fa)  # before any worker starts
