"""What GPU work asks Ray for, and the files a GPU cluster runs from, checked without a GPU.

Evaluation actors and Serve replicas: the resource requests Ray would schedule on (built
by the real code, not started). cluster.yaml, configs/*.yaml, serve/medqaro-gpu.yaml,
pyproject.toml and the README: checked against each other and the installed Ray.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
GPU_CONFIGS = [p for p in sorted((ROOT / "configs").glob("*.yaml"))
               if yaml.safe_load(p.read_text()).get("scaling", {}).get("use_gpu")]


# ------------------------------------------------------------------ evaluation actors


def _eval_cfg(tmp_path, **engine):
    from medray.eval.config import EvalConfig

    return EvalConfig.model_validate({"data": str(tmp_path), "engine": engine})


def test_vllm_actors_reserve_their_gpus(tmp_path):
    from medray.eval.actors import worker_class

    gpu = _eval_cfg(tmp_path, kind="vllm", model="m", device="gpu", tensor_parallel_size=2)
    assert gpu.engine.actor_options() == {"num_cpus": 1, "num_gpus": 2}
    # What the runner hands Ray: the remote class's default options.
    opts = worker_class(gpu, 3)._default_options
    assert opts["num_gpus"] == 2 and opts["num_cpus"] == 1 and opts["max_concurrency"] == 3

    cpu = _eval_cfg(tmp_path, kind="vllm", model="m")
    assert "num_gpus" not in worker_class(cpu, 1)._default_options
    # A model on CPU: one actor by default, holding the cores it is given (engine.cpus wins).
    assert cpu.actor_count == 1 and gpu.actor_count == 2
    assert worker_class(cpu, 1, 4)._default_options["num_cpus"] == 4
    pinned = _eval_cfg(tmp_path, kind="hf", model="m", cpus=3)
    assert pinned.engine.runs_on_cpu and pinned.engine.actor_options(8) == {"num_cpus": 3}
    serve = _eval_cfg(tmp_path, kind="serve", url="http://x")
    assert worker_class(serve, 1)._default_options["num_cpus"] == 0.25
    assert serve.actor_count == 2 and not serve.engine.runs_on_cpu
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        _eval_cfg(tmp_path, kind="vllm", model="m", tensor_parallel_size=2)


def test_vllm_engine_kwargs_are_real_engine_args(tmp_path):
    import inspect

    from vllm import EngineArgs

    from medray.engines.vllm import VLLMEngine

    spec = _eval_cfg(tmp_path, kind="vllm", model="m", device="gpu", tensor_parallel_size=4,
                     gpu_memory_utilization=0.45, enable_prefix_caching=True,
                     max_model_len=8192).engine
    kwargs = spec.vllm_kwargs()
    assert kwargs == {"max_model_len": 8192, "enable_prefix_caching": True,
                      "tensor_parallel_size": 4, "gpu_memory_utilization": 0.45,
                      "distributed_executor_backend": "mp"}
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert set(kwargs) <= fields  # vLLM itself accepts every key
    params = inspect.signature(VLLMEngine).parameters
    assert {"tensor_parallel_size", "gpu_memory_utilization", "enable_prefix_caching",
            "max_model_len"} <= set(params)
    cpu = _eval_cfg(tmp_path, kind="vllm", model="m").engine.vllm_kwargs()
    assert "tensor_parallel_size" not in cpu and "gpu_memory_utilization" not in cpu


# ------------------------------------------------------------------------- Serve


def test_serve_device_is_explicit(tiny_model):
    from pydantic import ValidationError

    from medray.serve.config import AppConfig

    with pytest.raises(ValidationError):
        AppConfig(model=str(tiny_model), device="auto")
    with pytest.raises(ValidationError, match="device"):  # no default: the config says
        AppConfig(model=str(tiny_model))
    assert AppConfig(model=str(tiny_model), device="gpu").device == "gpu"


def test_serve_gpu_replicas_ask_for_gpus_wherever_the_app_is_built(tiny_model):
    """Built here, on a machine without a GPU: the device comes from the config alone."""
    from medray.serve.app import build_app
    from medray.serve.config import AppConfig
    from medray.serve.llm import llm_config

    gpu = AppConfig(model=str(tiny_model), device="gpu", require_auth=False,
                    engine_kwargs={"tensor_parallel_size": 2})
    lc = llm_config(gpu, "medray", str(tiny_model), lora=False)
    assert type(lc.accelerator_config).__name__ == "GPUConfig"
    bundles = lc.get_engine_config().placement_bundles
    assert sum(b.get("GPU", 0) for b in bundles) == 2
    ingress = build_app(gpu)._bound_deployment
    assert not ingress.ray_actor_options.get("num_gpus")  # the QA ingress needs none

    cpu = llm_config(AppConfig(model=str(tiny_model), device="cpu", require_auth=False),
                     "medray", str(tiny_model), lora=False)
    assert type(cpu.accelerator_config).__name__ == "CPUConfig"
    assert all(not b.get("GPU") for b in cpu.get_engine_config().placement_bundles)


def test_gpu_serve_file(tiny_model):
    from vllm import EngineArgs

    from medray.serve.config import AppConfig

    raw = yaml.safe_load((ROOT / "serve" / "medqaro-gpu.yaml").read_text())
    args = raw["applications"][0]["args"]
    assert args["device"] == "gpu"
    # Adapter paths live on the cluster's shared storage, not here: validate the rest.
    cfg = AppConfig.model_validate({**args, "adapters": {}})
    assert set(cfg.engine_kwargs) <= {f.name for f in dataclasses.fields(EngineArgs)}
    for path in [*args["adapters"].values(), args["engine_kwargs"]["download_dir"]]:
        assert path.startswith(_shared_mount() + "/")


# ------------------------------------------------------------------ cluster and files


def _cluster() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def _shared_mount() -> str:
    mounts = [re.search(r"mount -t \S+ .* (\S+)$", c) for c in _cluster()["setup_commands"]]
    found = [m.group(1) for m in mounts if m]
    assert len(found) == 1, "cluster.yaml mounts one shared file system on every node"
    return found[0]


def test_cluster_installs_vllm_wherever_serve_can_run():
    c = _cluster()
    every_node = " ".join(c["setup_commands"])
    head_only = " ".join(c.get("head_setup_commands") or [])
    # The Serve build task and ingress may land on the head: vLLM must import there too.
    assert re.search(r'pip install -e "\.\[[^\]]*gpu[^\]]*\]"', every_node + head_only)


def test_cluster_gpu_nodes_fit_one_run_of_each_config():
    nodes = [n for n in _cluster()["available_node_types"].values()
             if n.get("resources", {}).get("GPU")]
    assert nodes and GPU_CONFIGS
    for node in nodes:
        assert 4 <= node["resources"]["GPU"] <= 8
    for path in GPU_CONFIGS:
        sc = yaml.safe_load(path.read_text())["scaling"]
        assert any(n["resources"]["GPU"] >= sc["num_workers"]
                   and n["resources"]["CPU"] >= sc["num_workers"] * sc["cpus_per_worker"]
                   for n in nodes), f"{path.name}: no node type holds its workers"


def test_shared_storage_is_named_the_same_everywhere():
    mount = _shared_mount()
    assert mount == "/mnt/shared"
    for path in GPU_CONFIGS:
        text = path.read_text()
        cfg = yaml.safe_load(text)
        assert cfg["data"]["path"].startswith(mount + "/"), path.name
        assert cfg["model"]["cache_dir"].startswith(mount + "/"), path.name
        outputs = re.findall(r"--output (\S+)", text)
        assert outputs and all(o.startswith(mount + "/") for o in outputs), path.name
    readme = (ROOT / "README.md").read_text()
    for other in (ROOT / "README.md", ROOT / "cluster.yaml", *GPU_CONFIGS):
        # no second spelling of the shared storage (e.g. a bare /shared/runs)
        assert not re.search(r"(?<![\w/])/shared/", other.read_text()), other.name
    assert f"{mount}/runs" in readme and f"{mount}/hf-cache" in readme


def test_gpu_extra_pins_the_vllm_of_rays_llm_stack():
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    gpu = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]["gpu"]]
    by_name = {r.name: r for r in gpu}
    ray_llm = [Requirement(r) for r in requires("ray") or []
               if r.startswith("vllm") and 'extra == "llm"' in r]
    assert ray_llm, "ray's llm extra names its vllm"
    assert str(by_name["vllm"].specifier) == str(ray_llm[0].specifier)
    assert str(by_name["vllm"].specifier).startswith("==")
    assert version("deepspeed") in by_name["deepspeed"].specifier  # the tested DeepSpeed
    readme = (ROOT / "README.md").read_text()
    assert f"vllm{by_name['vllm'].specifier}" in readme


# ------------------------------------------------------------------------------- Tune


def test_tune_concurrency_is_the_configured_maximum(tmp_path, monkeypatch):
    import ray

    from medray.tune.plan import SweepPlan, max_concurrency, trial_count
    from medray.tune.space import load_space

    def no_snapshot(*_a, **_k):
        raise AssertionError("concurrency must not come from a cluster snapshot")

    monkeypatch.setattr(ray, "cluster_resources", no_snapshot)
    monkeypatch.setattr(ray, "available_resources", no_snapshot)
    space = load_space(ROOT / "tune" / "spaces" / "tiny_cpu.yaml")
    plan = SweepPlan(output=tmp_path, base={}, space=space, search="grid", num_samples=2,
                     metric="val_loss", mode="min", max_concurrent_trials=None)
    assert trial_count(plan) == 2 * space.grid_size()
    assert max_concurrency(plan) == trial_count(plan)  # all queued; autoscaler adds nodes
    plan.max_concurrent_trials = 3
    assert max_concurrency(plan) == 3
