"""The served OpenAPI document (``GET /openapi.json``) made to say what the server does.

FastAPI documents 200 and 422 for every route with a body. prodip answers request errors with 400
in OpenAI's error form (never 422: :func:`prodip.serve.app._install_errors`), 401 without the API
key (when one is set: the document then declares a bearer security scheme), 413 above
``max_body_bytes``, 404 for another model id, 503 while the model loads, 500 on a bug; ``/metrics``
is Prometheus text; completions stream as ``text/event-stream``; the 200 bodies of completions and
generate follow :data:`COMPLETION_SCHEMA` and :data:`GENERATE_SCHEMA`.
:func:`install_openapi` rewrites the generated document accordingly;
tests/serve/test_openapi.py runs schemathesis against a real server with it.

    python -c "from prodip.serve.openapi import ERROR_SCHEMA; print(ERROR_SCHEMA)"
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from prodip.serve.routes import OPEN_ROUTES
from prodip.serve.schemas import ChatCompletionRequest, CompletionRequest, GenerateRequest

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
_NUMBER_OR_NULL = {"type": ["number", "null"]}
_USAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {k: {"type": "integer"} for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
}
#: OpenAI's legacy ``text_completion`` object as prodip.serve.completions.completion returns it.
COMPLETION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["text_completion"]},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "text", "logprobs", "finish_reason"],
                "properties": {
                    "index": {"type": "integer"},
                    "text": {"type": "string"},
                    "finish_reason": {"type": ["string", "null"]},
                    "logprobs": {
                        "type": ["object", "null"],
                        "required": ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
                        "properties": {
                            "tokens": {"type": "array", "items": {"type": "string"}},
                            "token_logprobs": {"type": "array", "items": _NUMBER_OR_NULL},
                            "top_logprobs": {
                                "type": "array",
                                "items": {"type": ["object", "null"], "additionalProperties": {"type": "number"}},
                            },
                            "text_offset": {"type": "array", "items": {"type": "integer"}},
                        },
                    },
                },
            },
        },
        "usage": _USAGE_SCHEMA,
    },
}
#: the native ``/v1/generate`` body (prodip.serve.completions.generate).
GENERATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["model", "text", "token_ids", "finish_reason", "logprobs", "usage"],
    "properties": {
        "model": {"type": "string"},
        "text": {"type": "string"},
        "token_ids": {"type": "array", "items": {"type": "integer"}},
        "finish_reason": {"type": ["string", "null"]},
        "logprobs": {"type": ["array", "null"], "items": _NUMBER_OR_NULL},
        "usage": _USAGE_SCHEMA,
    },
}
_TOKEN_LOGPROB: dict[str, Any] = {
    "type": "object",
    "required": ["token", "logprob", "bytes"],
    "properties": {
        "token": {"type": "string"},
        "logprob": {"type": "number"},
        "bytes": {"type": ["array", "null"], "items": {"type": "integer"}},
    },
}
#: OpenAI's ``chat.completion`` object as prodip.serve.completions.chat_completion returns it.
CHAT_COMPLETION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["chat.completion"]},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "message", "logprobs", "finish_reason"],
                "properties": {
                    "index": {"type": "integer"},
                    "message": {
                        "type": "object",
                        "required": ["role", "content"],
                        "properties": {
                            "role": {"type": "string", "enum": ["assistant"]},
                            "content": {"type": "string"},
                            "refusal": {"type": "null"},
                        },
                    },
                    "finish_reason": {"type": ["string", "null"]},
                    "logprobs": {
                        "type": ["object", "null"],
                        "required": ["content"],
                        "properties": {
                            "content": {
                                "type": "array",
                                "items": {
                                    **_TOKEN_LOGPROB,
                                    "required": [*_TOKEN_LOGPROB["required"], "top_logprobs"],
                                    "properties": {
                                        **_TOKEN_LOGPROB["properties"],
                                        "top_logprobs": {"type": "array", "items": _TOKEN_LOGPROB},
                                    },
                                },
                            },
                            "refusal": {"type": "null"},
                        },
                    },
                },
            },
        },
        "usage": _USAGE_SCHEMA,
    },
}
_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_BODY_SCHEMAS = {
    "/v1/completions": "CompletionResponse",
    "/v1/generate": "GenerateResponse",
    "/v1/chat/completions": "ChatCompletionResponse",
}
_WHY = {
    "400": "invalid request (bad JSON, a field out of range or of the wrong type, a prompt beyond the context window)",
    "401": "missing or wrong `Authorization: Bearer KEY` (only when the server has an API key)",
    "404": "the model id is not this server's",
    "413": "request body larger than max_body_bytes",
    "500": "internal error",
    "503": "the model is still loading (or failed to load)",
}
#: paths answered before the model is ready (no 503) and without a body (no 400/413)
_NO_503 = {"/health", "/metrics", "/v1/models", "/v1/models/{model}"}
_STREAMING = {"/v1/completions", "/v1/generate", "/v1/chat/completions"}


def _error(code: str) -> dict[str, Any]:
    return {"description": _WHY[code], "content": {"application/json": {"schema": _ERROR_REF}}}


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document with the real status codes and content types (see the module doc)."""
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["ErrorResponse"] = ERROR_SCHEMA
    schemas["CompletionResponse"] = COMPLETION_SCHEMA
    schemas["GenerateResponse"] = GENERATE_SCHEMA
    schemas["ChatCompletionResponse"] = CHAT_COMPLETION_SCHEMA
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for name, model in (
        ("CompletionRequest", CompletionRequest),
        ("GenerateRequest", GenerateRequest),
        ("ChatCompletionRequest", ChatCompletionRequest),
    ):
        if name in schemas:  # FastAPI's document model stores bounds as floats: 2**63 - 1 became 2**63
            _copy_int_bounds(model.model_json_schema(), schemas[name])
    keyed = bool(getattr(app.state, "config", None) and app.state.config.api_key)
    if keyed:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            codes = ["500"]
            if method in ("post", "put", "patch"):
                codes += ["400", "413"]
            if path not in OPEN_ROUTES:
                codes.append("401")
                if keyed:
                    op["security"] = [{"bearer": []}]
            if path not in _NO_503:
                codes.append("503")
            if path in (
                "/v1/completions",
                "/v1/chat/completions",
                "/v1/generate",
                "/tokenize",
                "/detokenize",
                "/v1/models/{model}",
            ):
                codes.append("404")
            if path in _BODY_SCHEMAS and "200" in responses:
                ref = {"$ref": f"#/components/schemas/{_BODY_SCHEMAS[path]}"}
                responses["200"].setdefault("content", {})["application/json"] = {"schema": ref}
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


def _copy_int_bounds(src: Any, dst: Any) -> None:
    """Copy integer bounds (``maximum``, ``minimum``, ...) of pydantic's JSON schema ``src`` onto the
    same places of FastAPI's document ``dst``, recursively (``properties``, ``anyOf``), in place."""
    if isinstance(src, dict) and isinstance(dst, dict):
        for key in ("maximum", "minimum", "exclusiveMaximum", "exclusiveMinimum"):
            if isinstance(src.get(key), int) and key in dst:
                dst[key] = src[key]
        for key in ("properties", "anyOf"):
            a, b = src.get(key), dst.get(key)
            if isinstance(a, dict) and isinstance(b, dict):
                for name in a.keys() & b.keys():
                    _copy_int_bounds(a[name], b[name])
            elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
                for x, y in zip(a, b):
                    _copy_int_bounds(x, y)


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`build_openapi`'s document at ``/openapi.json`` (computed once)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
