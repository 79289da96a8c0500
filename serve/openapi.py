"""The served OpenAPI document (``GET /openapi.json``) made to say what the server does.

FastAPI documents 200 and 422 for every route with a body. prodip answers request errors with 400
in OpenAI's error form (never 422: :func:`prodip.serve.app._install_errors`), 401 without the API
key (when one is set), 413 above ``max_body_bytes``, 404 for another model id, 503 while the model
loads, 500 on a bug; ``/metrics`` is Prometheus text; completions stream as ``text/event-stream``.
:func:`install_openapi` rewrites the generated document accordingly;
tests/serve/test_openapi.py runs schemathesis against a real server with it.

    python -c "from prodip.serve.openapi import ERROR_SCHEMA; print(ERROR_SCHEMA)"
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

#: OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}`` (prodip.serve.schemas.error_body).
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
            },
        }
    },
}
_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_WHY = {
    "400": "invalid request (bad JSON, a field out of range or of the wrong type, a prompt beyond the context window)",
    "401": "missing or wrong `Authorization: Bearer KEY` (only when the server has an API key)",
    "404": "the model id is not this server's",
    "413": "request body larger than max_body_bytes",
    "500": "internal error",
    "503": "the model is still loading (or failed to load)",
}
#: paths answered before the model is ready (no 503) and without a body (no 400/413)
_NO_503 = {"/health", "/metrics", "/v1/models", "/v1/chat/completions"}
_OPEN = {"/health"}  # answered without the API key
_STREAMING = {"/v1/completions", "/v1/generate"}


def _error(code: str) -> dict[str, Any]:
    return {"description": _WHY[code], "content": {"application/json": {"schema": _ERROR_REF}}}


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document with the real status codes and content types (see the module doc)."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas["ErrorResponse"] = ERROR_SCHEMA
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            codes = ["500"]
            if method in ("post", "put", "patch"):
                codes += ["400", "413"]
            if path not in _OPEN:
                codes.append("401")
            if path not in _NO_503:
                codes.append("503")
            if path == "/v1/completions":
                codes.append("404")
            if path == "/v1/chat/completions":
                responses.pop("200", None)
                codes.append("400")
            for code in codes:
                responses[code] = _error(code)
            if path == "/metrics":
                responses["200"] = {
                    "description": "Prometheus text exposition format",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            if path == "/health":
                ok = responses.get("200", {}).get("content", {}).get("application/json", {"schema": {}})
                responses["503"] = {
                    "description": "loading, or the load failed (body says which)",
                    "content": {"application/json": ok},
                }
            if path in _STREAMING and "200" in responses:
                responses["200"].setdefault("content", {})["text/event-stream"] = {
                    "schema": {
                        "description": "when stream is true: server-sent events, each `data:` a JSON chunk, then `data: [DONE]`"
                    }
                }
    return doc


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`build_openapi`'s document at ``/openapi.json`` (computed once)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
