"""The served OpenAPI document (``GET /openapi.json``) made to say what the server does.

Each fact is declared once, where it is made true:

- **on the route** (prodip.serve.routes, the decorator): its 200 body (``responses={200: {"model":
  ...}}``, a model of prodip.serve.schemas), other content types (:data:`SSE` for streams, Prometheus text),
  the errors only that route gives (:func:`errors`: 404 for another model id, 503 while the model loads),
  and ``openapi_extra=OPEN`` for a route answered without the API key;
- **here, for every route**, the answers of the middleware and exception handlers that stand in front
  of all routes (prodip.serve.middleware, prodip.serve.app): 500 on a bug; for a route with a request
  body, 400 in OpenAI's error form (never FastAPI's 422) and 413 above ``max_body_bytes``; 401 without
  the API key unless the route is ``OPEN`` (and, when the server has a key, a bearer security scheme); 403
  for a foreign ``Host`` when the server has no key (prodip.serve.config.HostCheck).

tests/serve/test_openapi.py runs schemathesis against a real server with this document.

    python -c "from prodip.serve.openapi import errors; print(errors(404))"
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any, Optional, Union

import fastapi.routing
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.routing import BaseRoute, compile_path

from prodip.base.jsontypes import JSONObject
from prodip.serve.config import HostCheck

#: OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}`` (prodip.serve.schemas.error_body).
ERROR_SCHEMA: JSONObject = {
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
_ERROR_REF: JSONObject = {"$ref": "#/components/schemas/ErrorResponse"}
#: why each error status is answered (the response's description)
WHY = {
    400: "invalid request (bad JSON, a field out of range or of the wrong type, a prompt beyond the context window)",
    401: "missing or wrong `Authorization: Bearer KEY` (only when the server has an API key)",
    403: "the Host header names neither this server's address, localhost nor an --allowed-hosts name "
    "(only when the server has no API key)",
    404: "the model id is not this server's",
    413: "request body larger than max_body_bytes",
    500: "internal error",
    503: "the model is still loading (or failed to load)",
}
#: ``openapi_extra`` of a route answered without the API key (OpenAPI: an empty security list): liveness
#: probes, the playground page. FastAPI's own documentation pages are open too (see :func:`is_open`).
OPEN: JSONObject = {"security": []}
#: the 200 content of a route that streams when the request says ``stream: true``
SSE: JSONObject = {
    "text/event-stream": {
        "schema": {
            "description": "when stream is true: server-sent events, each `data:` a JSON chunk, then `data: [DONE]`"
        }
    }
}
Responses = dict[Union[int, str], JSONObject]


def errors(*codes: int) -> Responses:
    """``responses=`` entries for error statuses, each in OpenAI's error form (:data:`ERROR_SCHEMA`).

    Raises:
        KeyError: a status without a description in :data:`WHY`.
    """
    return {code: {"description": WHY[code], "content": {"application/json": {"schema": _ERROR_REF}}} for code in codes}


def route_table(app: FastAPI) -> Iterator[tuple[str, BaseRoute]]:
    """``(path template, route)`` of every route of ``app`` in matching order, included routers' too.

    FastAPI up to about 0.12x copies an included router's routes into ``app.routes``; later versions
    keep the router as one lazy entry there and list the routes through ``iter_route_contexts``
    (what their own OpenAPI generator reads), so both are read here.
    """
    contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    if contexts is None:
        for route in app.routes:
            path = getattr(route, "path", None)
            if isinstance(path, str):
                yield path, route
        return
    for context in contexts(app.routes):
        if isinstance(context.path, str):
            yield context.path, context.original_route


@functools.lru_cache(maxsize=1024)
def _path_regex(template: str) -> re.Pattern[str]:
    regex: re.Pattern[str] = compile_path(template)[
        0
    ]  # Starlette's own: "/v1/models/{model}" -> ^/v1/models/(?P<model>[^/]+)$
    return regex


def find_route(app: FastAPI, path: str) -> Optional[tuple[str, BaseRoute]]:
    """The ``(path template, route)`` of ``app`` whose template matches a request path (any method),
    or None (a 404): the template is the request's metrics label (prodip.serve.middleware)."""
    for template, route in route_table(app):
        if _path_regex(template).match(path):
            return template, route
    return None


def is_open(app: FastAPI, template: str, route: BaseRoute) -> bool:
    """Whether a route of ``app`` (from :func:`route_table`) is answered without the API key: one
    declared with ``openapi_extra=OPEN``, or one of FastAPI's documentation pages (the document and
    the pages showing it hold no secret, and a browser cannot send the key to read them)."""
    if isinstance(route, APIRoute):
        return (route.openapi_extra or {}).get("security") == []
    return template in (app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)


def build_openapi(app: FastAPI) -> JSONObject:
    """FastAPI's document of ``app``'s routes with the statuses every route shares (see the module doc).

    Returns:
        The OpenAPI document (a JSON-ready dict), ``components.schemas.ErrorResponse`` included.
    """
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["ErrorResponse"] = ERROR_SCHEMA
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for model in _body_models(app):
        if model.__name__ in schemas:  # FastAPI's document model stores bounds as floats: 2**63 - 1 became 2**63
            _copy_int_bounds(model.model_json_schema(), schemas[model.__name__])
    config = getattr(app.state, "config", None)
    keyed = bool(config and config.api_key)
    hosts_checked = config is not None and HostCheck(config).active
    if keyed:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)  # validation errors are 400s (prodip.serve.app._install_errors)
            codes = [500, 403] if hosts_checked else [500]
            if "requestBody" in op:
                codes += [400, 413]
            if op.get("security") != []:  # not OPEN
                codes.append(401)
                if keyed:
                    op["security"] = [{"bearer": []}]
            for code, response in errors(*codes).items():
                responses.setdefault(str(code), response)
    return doc


def _body_models(app: FastAPI) -> list[type[BaseModel]]:
    """The pydantic models the app's routes take as request bodies (FastAPI's parse of the handlers)."""
    models: list[type[BaseModel]] = []
    for _, route in route_table(app):
        if isinstance(route, APIRoute):
            for param in route.dependant.body_params:
                hint = param.field_info.annotation
                if isinstance(hint, type) and issubclass(hint, BaseModel) and hint not in models:
                    models.append(hint)
    return models


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

    def openapi() -> JSONObject:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    # FastAPI's documented way to customise the document ("Extending OpenAPI"); mypy sees a method
    app.openapi = openapi  # type: ignore[method-assign]
