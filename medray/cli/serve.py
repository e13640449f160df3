"""`medray serve`: a model (vLLM replicas + QA ingress) from the YAML `serve run` reads.
Only typer at import time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from medray.cli.raystart import start_ray
from medray.console import command_console, fail


def _record_placement(app_name: str, logs: Path, display: Any) -> None:
    """Which node each replica started on: LOGS/placement.json and one console line."""
    import datetime

    from medray.io import write_json_atomic
    from medray.serve.placement import HOW, placement_line, replica_placement

    placement = replica_placement(app_name)
    write_json_atomic(logs / "placement.json", {
        "app": app_name, "deployments": placement, "how": HOW,
        "recorded_at": datetime.datetime.now(datetime.UTC).isoformat()})
    display.print(f"replicas: {placement_line(placement)} (placement: {logs}/placement.json)")


def serve_cmd(
    config: Annotated[Path, typer.Option("--config", "-c", help="Serve config (serve/*.yaml)")],
    address: Annotated[str | None, typer.Option(help="Ray address (default: local)")] = None,
    num_cpus: Annotated[int | None, typer.Option(help="logical CPUs of a local Ray")] = None,
    block: Annotated[bool, typer.Option(help="keep serving until Ctrl-C")] = True,
    logs: Annotated[Path, typer.Option(help="folder for Ray/Serve/vLLM logs")] = Path(
        "runs/serve/logs"),
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="show Ray/Serve/vLLM logs here instead of in --logs")] = False,
) -> None:
    """Serve a model (vLLM replicas + QA ingress) from the same YAML `serve run` reads."""
    from pydantic import ValidationError

    from medray.config import ConfigError
    from medray.serve.config import load_serve_file
    from medray.serve.validation import check_servable

    try:
        spec = load_serve_file(config)
        check_servable(spec.args.resolved(), spec.args)  # before Ray or any replica starts
    except ConfigError as err:  # names the file and the key already
        fail(str(err))
    except (OSError, ValueError, ValidationError) as err:
        fail(f"{config}: {err}")
    with command_console("serve", logs, verbose=verbose) as display:
        serving = False
        try:
            with display.stage("start Ray Serve and the vLLM replicas"):
                start_ray(address, num_cpus=num_cpus, worker_logs=False)
                _stop_on_sigterm()
                from ray import serve

                from medray.serve.app import build_app

                serve.start(http_options={"host": spec.host, "port": spec.port})
                serve.run(build_app(spec.args), name=spec.name, route_prefix=spec.route_prefix)
            _record_placement(spec.name, logs, display)
            names = [spec.args.model_id, *spec.args.adapters, *spec.args.models]
            display.print(f"serving {', '.join(names)} at http://{spec.host}:{spec.port}"
                          f"{spec.route_prefix} (logs: {logs}){'; Ctrl-C stops' if block else ''}")
            if not block:
                return
            serving = True
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM
            _stop_serve(display)
            if not serving:  # stopped while starting: reported as an interruption
                raise
            # else the normal way to stop a server: exit 0


def _stop_on_sigterm() -> None:
    """SIGTERM (kill, systemd, Kubernetes) stops the server as Ctrl-C does.

    Ray's core worker puts absl's failure-signal handler on SIGTERM in this process: it
    writes an error-level "*** SIGTERM received ... PC: @ ... clock_nanosleep" stack dump
    of wherever the main thread was (asleep below) into the log, then Ray's handler kills
    the processes and exits 1; for a server, SIGTERM is the normal stop. Replaced for
    SIGTERM only, after Ray is joined: crash signals (SIGSEGV, SIGABRT, ...) keep Ray's
    handler and its stack dumps. A second SIGTERM while stopping is ignored, so that the
    replicas finish stopping."""
    import signal

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, lambda *_: None)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def _stop_serve(display: Any) -> None:
    """Serve's apps, replicas and proxies stop before Ray does (the console leaves Ray
    after this): each replica drains and stops its vLLM engine in order (GatedLLMServer).
    Killed along with Ray instead, they log engine and connection errors."""
    import ray

    if not ray.is_initialized():
        return
    from ray import serve

    display.print("stopping Serve (apps, replicas, proxies), then Ray")
    serve.shutdown()
