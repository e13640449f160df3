"""A real two-node Ray cluster on this machine (scripts/cluster_up.sh): two network
namespaces joined by a veth pair, each node with its own IP, Ray temp dir and local disk,
one shared folder. Needs root (ip netns); skipped with the reason otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
HEAD_IP, WORKER_IP = "10.77.0.1", "10.77.0.2"


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "the two-node cluster needs root (ip netns, mount)"
    if not shutil.which("ip") or not shutil.which("unshare"):
        return "the two-node cluster needs iproute2 and util-linux (ip, unshare)"
    probe = f"medray-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"network namespaces are not available here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


def _run(*argv: str | os.PathLike, env: dict | None = None, timeout: float = 300,
         check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{argv} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    # Short: Ray's socket paths under the state folder must fit in 107 bytes.
    state = Path(tempfile.mkdtemp(prefix="mrc-", dir="/tmp"))
    env = {"MEDRAY_CLUSTER_DIR": str(state / "c"), "RAY": str(Path(sys.executable).parent / "ray")}
    _run(SCRIPTS / "cluster_up.sh", env=env, timeout=180)
    try:
        settings = dict(line.split("=", 1) for line in
                        (state / "c" / "cluster.env").read_text().splitlines())
        yield {**env, **settings}
    finally:
        _run(SCRIPTS / "cluster_down.sh", env=env, timeout=120, check=False)
        assert not (state / "c").exists(), "cluster_down.sh left its state folder behind"
        state.rmdir()
        namespaces = _run("ip", "netns", "list").stdout
        assert "medray-head" not in namespaces and "medray-worker" not in namespaces


def _on_cluster(cluster: dict[str, str], code: str, timeout: float = 180) -> dict:
    """Run a Python driver on the head's side of the veth; it prints one JSON line."""
    proc = _run(SCRIPTS / "cluster_exec.sh", sys.executable, "-c", textwrap.dedent(code),
                env=cluster, timeout=timeout)
    return json.loads(proc.stdout.strip().splitlines()[-1])


PROBE = """
    import json, os, socket
    import ray
    ray.init(log_to_driver=False)

    @ray.remote(num_cpus=0)
    def probe(shared):
        local = "/var/lib/medray-node"
        mine = os.path.join(local, "who")
        seen = sorted(os.listdir(local))
        with open(mine, "w") as f:
            f.write(ray.util.get_node_ip_address())
        with open(os.path.join(shared, ray.util.get_node_ip_address()), "w") as f:
            f.write("here")
        return {"ip": ray.util.get_node_ip_address(), "local_before": seen,
                "temp": ray.get_runtime_context().get_node_id()}

    shared = os.environ["MEDRAY_SHARED"]
    out = [ray.get(probe.options(resources={f"medray-{n}": 0.01}).remote(shared))
           for n in ("head", "worker")]
    nodes = [{"ip": n["NodeManagerAddress"], "alive": n["Alive"]} for n in ray.nodes()]
    print(json.dumps({"probes": out, "nodes": nodes, "shared": sorted(os.listdir(shared))}))
"""


def test_two_hosts_with_their_own_address_disk_and_one_shared_folder(cluster) -> None:
    seen = _on_cluster(cluster, PROBE)
    assert sorted(n["ip"] for n in seen["nodes"] if n["alive"]) == [HEAD_IP, WORKER_IP]
    head, worker = seen["probes"]
    assert (head["ip"], worker["ip"]) == (HEAD_IP, WORKER_IP)
    assert head["temp"] != worker["temp"]
    # Each node's local disk is its own: neither sees the file the other wrote.
    assert head["local_before"] == [] and worker["local_before"] == []
    state = Path(cluster["MEDRAY_CLUSTER_DIR"])
    assert (state / "head" / "local" / "who").read_text() == HEAD_IP
    assert (state / "worker" / "local" / "who").read_text() == WORKER_IP
    # The shared folder is one folder for both.
    assert seen["shared"] == sorted([HEAD_IP, WORKER_IP])
    # Ray's traffic stays on the veth: the namespaces have no other interface.
    for ns in ("medray-head", "medray-worker"):
        links = _run("ip", "-n", ns, "-o", "link").stdout
        names = sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines())
        assert names == ["lo", "medray0"]


NODE_IDS = """
    import json, time
    import ray
    ray.init(log_to_driver=False)
    want_gone = {gone!r}
    deadline = time.time() + 90
    while time.time() < deadline:
        nodes = {{n["NodeID"]: (n["NodeManagerAddress"], n["Alive"]) for n in ray.nodes()}}
        alive = {{i: ip for i, (ip, up) in nodes.items() if up}}
        if len(alive) == 2 and not (want_gone and want_gone in alive):
            break
        time.sleep(1)
    print(json.dumps({{"alive": alive, "dead": [i for i, (_, up) in nodes.items() if not up]}}))
"""


def test_a_killed_worker_node_is_declared_dead_and_a_fresh_one_rejoins(cluster) -> None:
    before = _on_cluster(cluster, NODE_IDS.format(gone=None))["alive"]
    worker_id = next(i for i, ip in before.items() if ip == WORKER_IP)
    _run(SCRIPTS / "cluster_kill_node.sh", "worker", env=cluster)
    assert _run("ip", "netns", "pids", "medray-worker").stdout.strip() == ""
    _run(SCRIPTS / "cluster_up.sh", "--rejoin-worker", env=cluster, timeout=120)
    after = _on_cluster(cluster, NODE_IDS.format(gone=worker_id))
    assert worker_id in after["dead"]
    assert sorted(after["alive"].values()) == [HEAD_IP, WORKER_IP]
    assert worker_id not in after["alive"]


# ---------------------------------------------------------------- training on two nodes

RAY = Path(sys.executable).parent / "ray"
RUNTIME_ENV = json.dumps({"working_dir": ".", "excludes": [
    ".venv", ".git", "runs", "*.egg-info", "tests", "docs", "bench"]})


def _ray_job(cluster: dict[str, str], *args: str, timeout: float = 120,
             check: bool = True) -> subprocess.CompletedProcess:
    return _run(SCRIPTS / "cluster_exec.sh", RAY, "job", *args[:1], "--address",
                cluster["MEDRAY_DASHBOARD"], *args[1:], env=cluster, timeout=timeout,
                check=check)


def _train_argv(model: Path, data: Path, output: str, *extra: str) -> list[str]:
    return ["python", "-m", "medray", "train", "--config", "configs/tiny-cpu.yaml",
            "--output", output, f"model.name_or_path={model}", f"data.path={data}",
            "data.max_val_examples=16", "data.val_generate_examples=4",
            "prompt.context_tokens=128", "data.tokenize_actors=1",
            "scaling.placement_strategy=STRICT_SPREAD", *extra]


def test_training_refuses_checkpoints_on_one_nodes_local_disk(cluster, tiny_model,
                                                              medqaro_prepared) -> None:
    from concurrent.futures import ThreadPoolExecutor

    local = "/var/lib/medray-node/run"  # the head's own disk: the worker cannot see it
    train = _train_argv(tiny_model, medqaro_prepared, local, "data.max_train_examples=32",
                        "optim.epochs=1")
    # a sweep is refused the same way: its trials write under its folder from either node
    tune = ["python", "-m", "medray", "tune", "--config", "configs/tiny-cpu.yaml", "--space",
            "tune/spaces/tiny_cpu.yaml", "--output", "/var/lib/medray-node/sweep",
            f"model.name_or_path={tiny_model}", f"data.path={medqaro_prepared}"]
    with ThreadPoolExecutor(2) as pool:  # two jobs side by side: each mostly waits
        trained, tuned = pool.map(lambda argv: _ray_job(
            cluster, "submit", "--runtime-env-json", RUNTIME_ENV, "--", *argv, timeout=300,
            check=False), (train, tune))
    assert trained.returncode != 0
    assert "is not shared storage" in trained.stdout and WORKER_IP in trained.stdout
    assert "Traceback" not in trained.stdout
    # refused before anything was written: no run folder left on the head's disk
    assert not (Path(cluster["MEDRAY_CLUSTER_DIR"]) / "head" / "local" / "run").exists()
    assert tuned.returncode != 0
    assert "sweep output" in tuned.stdout and "is not shared storage" in tuned.stdout
    assert WORKER_IP in tuned.stdout and "Traceback" not in tuned.stdout


def _train_checkpoints(storage: Path) -> list[dict]:
    """The checkpoints Ray Train has registered (written in full) under its storage."""
    snapshots = list(storage.glob("*/checkpoint_manager_snapshot.json"))
    try:
        return json.loads(snapshots[0].read_text())["checkpoint_results"] if snapshots else []
    except (json.JSONDecodeError, KeyError):  # caught mid-write
        return []


def _stalled(cluster: dict[str, str], job: str, since: float) -> str:
    """What a stalled training job was doing: its console, `ray status`, and the tails of
    the Train worker and controller logs each node wrote since the job started."""
    parts = [_ray_job(cluster, "logs", job, check=False).stdout[-2000:],
             _run(SCRIPTS / "cluster_exec.sh", RAY, "status", env=cluster, check=False,
                  timeout=60).stdout]
    for node in ("head", "worker"):
        logs = Path(cluster["MEDRAY_CLUSTER_DIR"]) / node / "ray" / "session_latest" / "logs"
        for f in sorted([*logs.glob("worker-*.out"), *logs.glob("worker-*.err"),
                         *logs.glob("train/**/*.log")]):
            text = f.read_text(errors="replace").strip()
            if f.stat().st_mtime >= since and text:
                parts.append(f"--- {node}: {f.name}\n" + "\n".join(text.splitlines()[-15:]))
    return "\n".join(parts)[-12000:]


def test_training_on_both_nodes_finishes_from_a_checkpoint_after_losing_one(
        cluster, tiny_model, medqaro_prepared) -> None:
    import time

    out = Path(cluster["MEDRAY_SHARED"]) / "train"
    job = f"medray-train-{os.getpid()}"
    # 128 examples = 8 steps of 2 workers x 8; a checkpoint every 2 steps
    _ray_job(cluster, "submit", "--no-wait", "--submission-id", job, "--runtime-env-json",
             RUNTIME_ENV, "--", *_train_argv(
                 tiny_model, medqaro_prepared, str(out), "data.max_train_examples=128",
                 "optim.epochs=1", "checkpoint.every_steps=2", "fault.max_failures=1"))
    killed = False
    try:
        started = time.time()
        while not _train_checkpoints(out / "ray"):
            status = _ray_job(cluster, "status", job).stdout
            assert "RUNNING" in status or "PENDING" in status, status
            assert time.time() < started + 240, _stalled(cluster, job, started)
            time.sleep(1)
        _run(SCRIPTS / "cluster_kill_node.sh", "worker", env=cluster)
        killed = True
        # Strict spread needs both nodes: the run restarts once the worker is back.
        _run(SCRIPTS / "cluster_up.sh", "--rejoin-worker", env=cluster, timeout=120)
        try:
            logs = _ray_job(cluster, "logs", "--follow", job, timeout=360).stdout
        except subprocess.TimeoutExpired:
            raise AssertionError(_stalled(cluster, job, started)) from None
    finally:
        _ray_job(cluster, "stop", job, check=False)
        if not killed:
            _run(SCRIPTS / "cluster_up.sh", "--rejoin-worker", env=cluster, timeout=120,
                 check=False)
    status = _ray_job(cluster, "status", job).stdout
    assert "succeeded" in status.lower(), (status, logs[-4000:])
    assert "Traceback" not in logs, logs
    m = json.loads((out / "metrics.json").read_text())
    assert [e["epoch"] for e in m["epochs"]] == [1] and m["epochs"][-1]["step"] == 8
    # restarted from a checkpoint on the shared storage, not from step 0
    assert m["resumed_from_step"] and m["resumed_from_step"] % 2 == 0, m["resumed_from_step"]
    starts = m["workers"]  # per (re)start of the worker group: where each rank ran
    assert len(starts) == 2, starts
    for ranks in starts:
        assert sorted(r["node_ip"] for r in ranks) == [HEAD_IP, WORKER_IP], starts
    on_worker = [next(r["node_id"] for r in ranks if r["node_ip"] == WORKER_IP)
                 for ranks in starts]
    assert on_worker[0] != on_worker[1], starts  # the second start ran on the fresh node
    assert (out / "adapter" / "adapter_config.json").is_file()


# ---------------------------------------------------------------- evaluation on two nodes

def test_evaluation_spreads_over_both_nodes_and_survives_losing_one(
        cluster, tiny_model, medqaro_prepared, tmp_path: Path) -> None:
    import time

    import yaml

    shared = Path(cluster["MEDRAY_SHARED"])
    config = tmp_path / "eval.yaml"
    # 10 engine calls of 16 items (qea) on 2 actors, each holding one running and one
    # queued: when the first call's rows are saved, the worker node still holds two calls
    # and the queue six more (with 4 calls, the warm actors finished them all within the
    # second the kill takes, and the worker sometimes had nothing left to lose).
    n = 160
    config.write_text(yaml.safe_dump({
        "data": str(medqaro_prepared), "split": "test", "limit": n,
        "engine": {"kind": "vllm", "model": str(tiny_model)},
        "prompt": {"context_tokens": 128, "max_new_tokens": 24},
        "actors": 2, "score": {"modes": ["medqaro"], "resamples": 50, "wordnet": False}}))
    out = shared / "eval"
    proc = subprocess.Popen(
        [str(SCRIPTS / "cluster_exec.sh"), sys.executable, "-m", "medray", "eval", "--config",
         str(config), "--output", str(out)], cwd=ROOT, env={**os.environ, **cluster},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Lose the worker node once the first answers are saved: what it held is asked again.
        predictions, deadline = out / "predictions.jsonl", time.time() + 240
        while not (predictions.exists() and predictions.read_text().count("\n") >= 16):
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
            time.sleep(0.5)
        _run(SCRIPTS / "cluster_kill_node.sh", "worker", env=cluster)
        console, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        _run(SCRIPTS / "cluster_up.sh", "--rejoin-worker", env=cluster, timeout=120)
    assert proc.returncode == 0, console[-3000:]
    requests = json.loads((out / "metrics.json").read_text())["requests"]
    assert "Traceback" not in console, console
    assert "lost and replaced" in console, (requests, console)
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert len(rows) == n and len({r["id"] for r in rows}) == n  # none lost, none twice
    first_two = sorted(a["node_ip"] for a in requests["actors"][:2])
    assert first_two == [HEAD_IP, WORKER_IP]  # one actor per node
    assert requests["actors_replaced"] >= 1
    # replacements that started ran on the head: the worker node was gone
    assert all(a["node_ip"] == HEAD_IP for a in requests["actors"][2:]), requests
    assert requests["requested"] == n + requests["reasked"]


# ---------------------------------------------------------------- Serve on two nodes

ANSWERS = """
    import json, time
    import httpx
    answered, deadline = 0, time.time() + 120
    codes = []
    while answered < {answers} and time.time() < deadline:  # consecutive answers
        try:
            r = httpx.post("http://127.0.0.1:8000/v1/qa", timeout=30, json={{
                "question": "Care este stadiul?", "context": "Diagnostic: carcinom. Stadiu: II.",
                "max_new_tokens": 4}})
            codes.append(r.status_code)
            answered = answered + 1 if r.status_code == 200 else 0
        except httpx.HTTPError as exc:
            codes.append(type(exc).__name__)
            answered = 0
        if answered == 0:
            time.sleep(1)
    seen = {{"answered": answered, "codes": codes[-20:]}}
"""
# ... and the LLM replicas alive by then, with their nodes (a driver of its own: ~8 s)
REPLICAS_AND_ANSWERS = ANSWERS + """
    import ray
    from ray.util.state import list_actors
    ray.init(log_to_driver=False)
    # listed once the service answers: right after a node is lost the list is in flux
    ips = {{n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}}
    alive = list_actors(filters=[("state", "=", "ALIVE")])
    seen["replicas"] = sorted(ips[a.node_id] for a in alive if "LLM" in a.class_name)
    print(json.dumps(seen))
"""


def test_two_llm_replicas_on_two_nodes_and_the_service_survives_losing_one(
        cluster, tiny_model, tmp_path: Path) -> None:
    import yaml

    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({
        "proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": 8000},
        "applications": [{"name": "medray", "route_prefix": "/",
                          "import_path": "medray.serve.app:build_app",
                          "args": {"model": str(tiny_model), "device": "cpu",
                                   "max_model_len": 256, "require_auth": False,
                                   "prompt": {"context_tokens": 128},
                                   "llm": {"num_replicas": 2, "num_cpus": 1},
                                   "ingress": {"num_replicas": 1, "num_cpus": 0.5}}}]}))
    served = _run(SCRIPTS / "cluster_exec.sh", sys.executable, "-m", "medray", "serve",
                  "--config", config, "--no-block", "--logs", tmp_path / "logs", env=cluster,
                  timeout=300)
    # `medray serve` records where each replica started (and says so on its console)
    line = next(x for x in served.stdout.splitlines() if x.startswith("replicas: "))
    assert HEAD_IP in line and WORKER_IP in line and "placement.json" in line, line
    placement = json.loads((tmp_path / "logs" / "placement.json").read_text())
    llm = [d for name, d in placement["deployments"].items() if "LLM" in name]
    assert len(llm) == 1, placement
    assert sorted(r["node_ip"] for r in llm[0]) == [HEAD_IP, WORKER_IP], placement
    assert {r["state"] for r in llm[0]} == {"RUNNING"}, placement
    assert "start-up placement" in placement["how"]
    # The module's last test: the fixture's cluster_down.sh stops Serve with the cluster
    # (a Serve shutdown after the node loss waits ~20 s for the lost replica), and the
    # worker is not brought back.
    # one replica per node (placement.json above), and the service answers
    before = _on_cluster(cluster, (ANSWERS + "    print(json.dumps(seen))\n").format(answers=3))
    assert before["answered"] == 3, before["codes"]
    _run(SCRIPTS / "cluster_kill_node.sh", "worker", env=cluster)
    after = _on_cluster(cluster, REPLICAS_AND_ANSWERS.format(answers=5))
    assert after["answered"] == 5, after["codes"]  # the head's replica answers alone
    assert HEAD_IP in after["replicas"]
