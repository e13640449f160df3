"""The serve engine's in-cluster transport: medray's Serve app called through a Ray Serve
`DeploymentHandle` to its QA ingress, instead of over HTTP.

Used when the evaluation runs in the Ray cluster that serves the app (the engine spec names
it: `engine.app`). The ingress's `call(path, payload)` (medray/serve/incluster.py) runs the
same route handler, with the same request validation, prompt rendering and request
accounting, as the HTTP route; only the HTTP proxy and the HTTP parsing are skipped. No
API key is sent: a caller inside the Ray cluster can already run any code there, so the
ingress trusts being in the cluster.

Not shared with the ingress (engines sit below serve): the route list of IN_CLUSTER_ROUTES
matches medray.serve.incluster.ROUTES (tests/test_serve_handle.py checks it).
"""

from __future__ import annotations

from typing import Any

from medray.engines.registry import EngineSpecError

IN_CLUSTER_ROUTES = ("/v1/qa", "/v1/qa/batch", "/v1/mcq", "/v1/models")
# Applications that may take calls: DEPLOYING is also an app being updated or scaled.
CALLABLE = ("RUNNING", "DEPLOYING")


def app_handle(app: str) -> Any:
    """The handle of Serve application `app`'s ingress, in the Ray cluster this process is
    connected to; EngineSpecError (a clear message, no traceback) if it is not there."""
    import ray

    hint = "; set engine.url (without engine.app) to call it over HTTP instead"
    if not ray.is_initialized():
        raise EngineSpecError(f"engine.app {app!r}: this process is not connected to a Ray "
                              f"cluster (run in the cluster that serves the app){hint}")
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        apps = serve.status().applications
    except RayServeException:
        apps = {}
    if app not in apps:
        running = ", ".join(sorted(apps)) or "none"
        raise EngineSpecError(f"engine.app {app!r}: no such Serve application in the "
                              f"connected Ray cluster (running: {running}){hint}")
    status = apps[app]
    if status.status not in CALLABLE:  # a str Enum
        raise EngineSpecError(f"engine.app {app!r}: the Serve application is "
                              f"{status.status} ({status.message or 'no message'})")
    return serve.get_app_handle(app)


class AppHandle:
    """Calls of one Serve application's ingress; `call` answers (status, JSON body) as the
    HTTP route would."""

    def __init__(self, app: str, timeout: float) -> None:
        self.app, self.timeout = app, timeout
        self._handle = app_handle(app)

    def call(self, path: str, payload: dict[str, Any]) -> tuple[int, Any]:
        from ray import exceptions as rex
        from ray.serve.exceptions import BackPressureError, RayServeException

        try:
            out = self._handle.call.remote(path, payload).result(timeout_s=self.timeout)
        except TimeoutError:
            return 504, _error(504, "timeout", f"no answer within {self.timeout:g} s")
        except BackPressureError:
            return 429, _error(429, "rate_limit", "too many requests in flight; retry later")
        except (rex.RayActorError, rex.ActorUnavailableError, RayServeException) as exc:
            return 503, _error(503, "unavailable", f"the {self.app!r} ingress is unavailable "
                               f"({type(exc).__name__}); retry later")
        return int(out["status"]), out["body"]


def _error(status: int, kind: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": status, "param": None}}
