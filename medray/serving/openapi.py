"""The OpenAPI document of the ingress: request and response bodies of every route (the
routes read their bodies themselves, after auth and size checks, so FastAPI cannot infer
them), the bearer security scheme, and the error responses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from medray.serving.errors import openapi_errors

REF = "#/components/schemas/{model}"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": REF.format(model=name)}


def _vllm_models() -> dict[str, type[BaseModel]]:
    from ray.serve.llm import openai_api_models as m

    return {"CompletionRequest": m.CompletionRequest, "CompletionResponse": m.CompletionResponse,
            "ChatCompletionRequest": m.ChatCompletionRequest,
            "ChatCompletionResponse": m.ChatCompletionResponse}


class Router:
    """`route.post(path, body=Model | "vLLM name", response=...)`: app.post plus the docs."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.bodies: dict[str, type[BaseModel] | str] = {}
        self.public: set[str] = set()

    def _extra(self, path: str, body: Any, response: str | None, public: bool) -> dict:
        extra: dict[str, Any] = {}
        if not public:
            extra["security"] = [{"bearer": []}]
        else:
            self.public.add(path)
        if body is not None:
            self.bodies[path] = body
            name = body if isinstance(body, str) else body.__name__
            extra["requestBody"] = {"required": True,
                                    "content": {"application/json": {"schema": _ref(name)}}}
        if response is not None:
            self.bodies[f"{path}#response"] = response
            extra["responses"] = {"200": {"description": "OK (with `stream`: server-sent "
                                                         "events of chunks, then [DONE])",
                                          "content": {"application/json": {
                                              "schema": _ref(response)},
                                              "text/event-stream": {"schema": {
                                                  "type": "string"}}}}}
        return extra

    def post(self, path: str, *, body: Any = None, response_model: Any = None,
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
        vllm = _vllm_models()
        for model in set(router.bodies.values()):
            cls = vllm[model] if isinstance(model, str) else model
            try:
                schema = cls.model_json_schema(ref_template=REF)
            except Exception:  # noqa: BLE001 -- an engine type pydantic cannot describe
                schema = {"type": "object", "description": f"vLLM's {cls.__name__}"}
            schemas.update(schema.pop("$defs", {}))
            schemas[model if isinstance(model, str) else model.__name__] = schema
        doc["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "one of the keys in the configured api_keys_env / "
                                      "api_keys_file"}}
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
    return router
