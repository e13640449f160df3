"""The KubeRay files users deploy with: the fields medray depends on are there and valid."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import ray
import yaml

from medray.serve.config import AppConfig
from medray.train.config import load_config

ROOT = Path(__file__).resolve().parents[1]
KUBERAY = ROOT / "deploy" / "kuberay"
SHARED = "/mnt/shared"


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((KUBERAY / name).read_text()) if d]


def _one(name: str, kind: str) -> dict:
    hits = [d for d in _docs(name) if d["kind"] == kind]
    assert len(hits) == 1, f"{name}: expected one {kind}, found {len(hits)}"
    assert hits[0]["apiVersion"] == "ray.io/v1" or kind == "PersistentVolumeClaim"
    return hits[0]


def _cluster_specs() -> dict[str, dict]:
    return {
        "raycluster.yaml": _one("raycluster.yaml", "RayCluster")["spec"],
        "rayjob-finetune.yaml": _one("rayjob-finetune.yaml", "RayJob")["spec"]["rayClusterSpec"],
        "rayservice-qa.yaml": _one("rayservice-qa.yaml", "RayService")["spec"]["rayClusterConfig"],
    }


def _pods(spec: dict) -> list[dict]:
    return [spec["headGroupSpec"]["template"]["spec"]] + [
        g["template"]["spec"] for g in spec["workerGroupSpecs"]]


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob-finetune.yaml", "rayservice-qa.yaml"])
def test_every_pod_runs_this_ray_and_mounts_the_shared_volume(name: str) -> None:
    spec = _cluster_specs()[name]
    assert spec["rayVersion"] == ray.__version__, "rayVersion must match the Ray medray pins"
    claim = _one("raycluster.yaml", "PersistentVolumeClaim")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    for pod in _pods(spec):
        container = pod["containers"][0]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        shared = [n for n, p in mounts.items() if p == SHARED]
        assert shared, f"{name}: a pod does not mount {SHARED}"
        pvc = volumes[shared[0]]["persistentVolumeClaim"]["claimName"]
        assert pvc == claim["metadata"]["name"]


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob-finetune.yaml", "rayservice-qa.yaml"])
def test_gpu_workers_ask_for_gpus_and_the_head_schedules_none(name: str) -> None:
    spec = _cluster_specs()[name]
    assert spec["headGroupSpec"]["rayStartParams"].get("num-gpus") == "0"
    for group in spec["workerGroupSpecs"]:
        res = group["template"]["spec"]["containers"][0]["resources"]
        assert int(res["limits"]["nvidia.com/gpu"]) >= 1
        assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"]


def test_rayjob_entrypoint_is_a_valid_medray_train_command() -> None:
    job = _one("rayjob-finetune.yaml", "RayJob")["spec"]
    argv = shlex.split(job["entrypoint"])
    assert argv[:4] == ["python", "-m", "medray", "train"]
    config = ROOT / argv[argv.index("--config") + 1]
    output = argv[argv.index("--output") + 1]
    assert output.startswith(SHARED + "/"), "outputs must outlive the job's cluster"
    overrides = [a for a in argv[4:] if "=" in a and not a.startswith("--")]
    cfg = load_config(config, overrides)  # the config and its overrides validate
    assert cfg.data.path.startswith(SHARED + "/")
    env = yaml.safe_load(job["runtimeEnvYAML"])["env_vars"]
    assert env["HF_HOME"].startswith(SHARED + "/")
    assert job["shutdownAfterJobFinishes"] is True


def test_rayservice_args_validate_and_keys_come_from_the_secret() -> None:
    service = _one("rayservice-qa.yaml", "RayService")["spec"]
    serve = yaml.safe_load(service["serveConfigV2"])
    app = serve["applications"][0]
    assert app["import_path"] == "medray.serve.app:build_app"
    args = AppConfig.model_validate(app["args"])
    assert args.device == "gpu" and args.require_auth
    assert args.model.startswith(SHARED + "/")
    for pod in _pods(service["rayClusterConfig"]):
        env = {e["name"]: e for e in pod["containers"][0].get("env", [])}
        key = env[args.api_keys_env]
        assert "value" not in key, "API keys must come from a Secret, not the manifest"
        assert key["valueFrom"]["secretKeyRef"] == {"name": "medray-api-keys", "key": "keys"}


def test_dockerfile_base_image_matches_the_ray_version() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    base = next(line.split()[1] for line in text.splitlines() if line.startswith("FROM "))
    assert base.startswith(f"rayproject/ray:{ray.__version__}-")
    assert '".[gpu]"' in text
