"""Serve's CPU replicas run vLLM in their own process (no engine-core or worker children),
and a normal stop of `medray serve` (SIGTERM) leaves no crash-like stack dump in its logs.

Budget: the session app's check is free once it runs; the CLI test starts its own small
app (one tiny-model replica, ~60-90 s on 2 cores) and stops it with SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from medray.engines.vllm import SERVE_ENGINE_THREAD

# What a crash-like dump writes: absl's failure-signal handler ("*** SIGTERM received at
# time=...", then "PC: @ 0x... clock_nanosleep" frames) or faulthandler ("Fatal Python").
DUMP = re.compile(r"\*\*\* SIG\w+ received|PC: @|Fatal Python error")


def _replicas(root: psutil.Process, llm_only: bool = True) -> list[psutil.Process]:
    out = []
    for p in [root, *root.children(recursive=True)]:
        try:
            title = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "ray::ServeReplica" in title and not (llm_only and "QAIngress" in title):
            out.append(p)
    return out


def _threads(proc: psutil.Process) -> set[str]:
    names = set()
    for task in Path(f"/proc/{proc.pid}/task").iterdir():
        try:
            names.add((task / "comm").read_text().strip())
        except OSError:  # a thread that ended
            continue
    return names


def _assert_vllm_in_process(root: psutil.Process, expected: int) -> None:
    """Each LLM replica steps vLLM's engine on its own thread (SERVE_ENGINE_THREAD) and has no
    child process: vLLM's multiprocess engine shows as EngineCore and worker children."""
    replicas = _replicas(root)
    assert len(replicas) == expected, [" ".join(p.cmdline()) for p in replicas]
    for rep in replicas:
        children = [" ".join(c.cmdline()) for c in rep.children(recursive=True)]
        assert children == [], f"{rep.cmdline()[0]} has child processes: {children}"
        assert SERVE_ENGINE_THREAD in _threads(rep), _threads(rep)


def test_session_app_replicas_run_vllm_in_process(serve_app):
    url, key, _ = serve_app
    r = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "medray-ft", "prompt": "Pacienta", "max_tokens": 2},
                   timeout=120)
    assert r.status_code == 200, r.text
    # The base (with its LoRA adapter) and the merged model: one replica each.
    _assert_vllm_in_process(psutil.Process(), expected=2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _console(proc: subprocess.Popen) -> tuple[list[str], threading.Thread]:
    """The command's console lines as they come (read on a thread, which ends with the
    process's stdout)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),
                              daemon=True)
    reader.start()
    return lines, reader


def _wait_ready(url: str, proc: subprocess.Popen, console: list[str], timeout: float) -> None:
    """Ready as the command says it is: its "serving ... at" line. /readyz answers 200 as
    soon as the replicas do, a moment before `serve.run` returns to the command; a SIGTERM
    in that moment is (rightly) an interrupted start."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            time.sleep(1)  # the reader thread drains the pipe
            pytest.fail(f"medray serve exited {proc.returncode}: {''.join(console)}")
        if any(line.startswith("serving ") for line in console):
            assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
            return
        time.sleep(2)
    pytest.fail(f"medray serve did not say it was serving after {timeout} s: "
                f"{''.join(console)}")


def test_medray_serve_stops_on_sigterm_without_stack_dumps(tiny_model, tmp_path):
    """`medray serve` on its own local Ray: the replica runs vLLM in-process, answers, and
    SIGTERM (the normal stop of a server) exits 0 after Serve and Ray stopped, with no
    stack dump in serve.log or in any of the Ray session's logs."""
    port = _free_port()
    keys = tmp_path / "keys"
    keys.write_text("k-0123456789\n")
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"http_options: {{host: 127.0.0.1, port: {port}}}\n"
        "applications:\n"
        "  - name: medray\n    route_prefix: /\n    import_path: medray.serve.app:build_app\n"
        f"    args: {{model: {tiny_model}, device: cpu, max_model_len: 512,\n"
        "           prompt: {context_tokens: 256},\n"
        f"           api_keys_env: null, api_keys_file: {keys},\n"
        "           llm: {num_replicas: 1, num_cpus: 1}, ingress: {num_cpus: 0.5}}\n")
    logs = tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "medray", "serve", "--config", str(config), "--logs", str(logs),
         "--num-cpus", "4"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        console, reader = _console(proc)
        _wait_ready(url, proc, console, timeout=420)
        r = httpx.post(f"{url}/v1/completions", headers={"Authorization": "Bearer k-0123456789"},
                       json={"model": "medray", "prompt": "Pacienta", "max_tokens": 4,
                             "temperature": 0}, timeout=120)
        assert r.status_code == 200, r.text
        _assert_vllm_in_process(psutil.Process(proc.pid), expected=1)
        session = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=30)
    out = "".join(console)
    assert proc.returncode == 0, out
    assert "stopping Serve" in out
    gone, alive = psutil.wait_procs(session, timeout=30)
    assert not alive, [p.pid for p in alive]  # Ray and the replicas stopped with it
    files = [logs / "serve.log", *(p for p in (logs / "ray").rglob("*") if p.is_file())]
    assert len(files) > 5, files  # the Ray session's logs are linked and were read
    dumps = {str(f.relative_to(logs)): m.group(0) for f in files
             if (m := DUMP.search(f.read_text(errors="replace")))}
    assert dumps == {}, dumps
