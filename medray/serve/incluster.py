"""In-cluster calls of the QA ingress: a caller in the same Ray cluster (the serve engine's
handle transport, medray/engines/serve_handle.py) calls `QAIngress.call(path, payload)`
through a DeploymentHandle instead of the HTTP route.

The route's own handler runs on the payload: the same body size limit, text check and
schema validation (`QAIngress._body`), prompt rendering and request counts, so the answer
is the one HTTP gives. Skipped: the HTTP proxy, HTTP parsing and the API-key check (a
caller inside the Ray cluster can already run any code there; being in the cluster is its
credential). The answer is {"status", "body"} with the JSON body the route would send.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from medray.serve.errors import APIError
from medray.serve.limits import check_text

log = logging.getLogger("medray.serve")

# Route path -> QAIngress method (the HTTP route's handler).
ROUTES = {"/v1/qa": "qa", "/v1/qa/batch": "qa_batch", "/v1/mcq": "mcq",
          "/v1/models": "models"}


@dataclass
class Payload:
    """An in-cluster request's body, handed to a route handler in place of the HTTP
    request (QAIngress._body and _auth tell the two apart)."""

    data: dict[str, Any]


def _body(status: int, kind: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": status, "param": param}}


class InClusterCalls:
    """QAIngress's `call` (a mixin: QAIngress provides cfg and the route handlers)."""

    cfg: Any

    async def call(self, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            method = ROUTES.get(path)
            if method is None:
                raise APIError(404, "not_found", f"{path}: not callable in-cluster; "
                               f"known: {', '.join(ROUTES)}")
            data = payload or {}
            if not isinstance(data, dict):
                raise APIError(422, "invalid_request_error", "request body must be an object")
            size = len(json.dumps(data, ensure_ascii=False).encode("utf-8", "surrogatepass"))
            if size > self.cfg.max_body_bytes:
                raise APIError(413, "request_too_large", f"request body has {size} bytes; "
                               f"limit is {self.cfg.max_body_bytes}")
            check_text(data)
            result = await getattr(self, method)(Payload(data))
        except APIError as err:
            return {"status": err.status, "body": _body(err.status, err.kind, err.message,
                                                        err.param)}
        except Exception as exc:  # noqa: BLE001 -- as the HTTP route's 500, never a traceback
            log.exception("unhandled error in the ingress: %s", type(exc).__name__)
            return {"status": 500, "body": _body(500, "internal_error",
                                                 f"internal error ({type(exc).__name__})")}
        return {"status": 200, "body": result.model_dump(mode="json")}
