"""The OpenAPI document of the ingress: request and response bodies of every route (the
routes read their bodies themselves, after auth and size checks, so FastAPI cannot infer
them), the bearer security scheme, and the error responses.

Request bodies are the models the ingress validates with, built from its config
(`Router.use`), so the document states the deployment's own limits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from medray.serve.errors import openapi_errors

REF = "#/components/schemas/{model}"


# One server-sent event of a streamed answer (as a schema describes SSE: each event's fields).
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {
    "data": {"type": "string", "description": (
        "a chunk of the answer as JSON (vLLM's stream response), an `{\"error\": ...}` "
        "object after a failure mid-stream, or `[DONE]` at the end")},
    "event": {"type": "string"}, "id": {"type": "string"}}}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": REF.format(model=name)}


def _vllm_responses() -> dict[str, type[BaseModel]]:
    from ray.serve.llm import openai_api_models as m

    return {"CompletionResponse": m.CompletionResponse,
            "ChatCompletionResponse": m.ChatCompletionResponse}


class Router:
    """`route.post(path, body="Model name", response=...)`: app.post plus the docs."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.bodies: dict[str, str] = {}
        self.public: set[str] = set()
        self.models: dict[str, type[BaseModel]] = {}

    def use(self, models: dict[str, type[BaseModel]]) -> None:
        """The request models of this deployment (by name); the document is rebuilt."""
        self.models = dict(models)
        self.app.openapi_schema = None

    def _extra(self, path: str, body: Any, response: str | None, public: bool) -> dict:
        extra: dict[str, Any] = {}
        if not public:
            extra["security"] = [{"bearer": []}]
        else:
            self.public.add(path)
        if body is not None:
            self.bodies[path] = body
            extra["requestBody"] = {"required": True,
                                    "content": {"application/json": {"schema": _ref(body)}}}
        if response is not None:
            self.bodies[f"{path}#response"] = response
            extra["responses"] = {"200": {"description": "OK (with `stream`: server-sent "
                                                         "events of chunks, then [DONE])",
                                          "content": {"application/json": {
                                              "schema": _ref(response)},
                                              "text/event-stream": {"schema": SSE_EVENT}}}}
        return extra

    def post(self, path: str, *, body: str | None = None, response_model: Any = None,
             response: str | None = None, public: bool = False) -> Callable:
        return self.app.post(path, response_model=response_model, responses=openapi_errors(),
                             openapi_extra=self._extra(path, body, response, public))

    def get(self, path: str, *, response_model: Any = None, public: bool = False) -> Callable:
        errors = {k: v for k, v in openapi_errors().items() if k in (401, 503)}
        return self.app.get(path, response_model=response_model, responses=errors,
                            openapi_extra=self._extra(path, None, None, public))


def document(app: FastAPI) -> Router:
    router = Router(app)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version="1", description=app.description,
                          routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        classes = {**_vllm_responses(), **router.models}
        for name in sorted(set(router.bodies.values())):
            cls = classes.get(name)
            try:
                schema = cls.model_json_schema(ref_template=REF)  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001 -- an engine type pydantic cannot describe
                schema = {"type": "object", "description": f"vLLM's {name}"}
            schemas.update(schema.pop("$defs", {}))
            schemas[name] = schema
        doc["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "one of the keys in the configured api_keys_env / "
                                      "api_keys_file"}}
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
    return router
