"""FastAPI app over an export dir: ``create_app(export_dir)``; thin routes over ``prodip.serve.service``.

The endpoints are the routers of ``prodip.serve.routes`` (their list: ``GET /openapi.json``, or
``GET /docs`` in a browser). Every error is OpenAI's ``{"error": {"message", "type", "param", "code"}}``;
bad parameters are 400, never 500.

    python -c "from prodip.serve.app import create_app; app = create_app('EXPORT_DIR', allow_unverified=True)"
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from prodip.base.errors import InvalidInput
from prodip.serve.config import ServeConfig
from prodip.serve.engine import load_export
from prodip.serve.metrics import ServeMetrics
from prodip.serve.middleware import GuardMiddleware
from prodip.serve.openapi import install_openapi
from prodip.serve.protocol import deadline_protocol
from prodip.serve.routes import _printable, add_routes
from prodip.serve.schemas import error_body
from prodip.serve.service import APIError, Service

log = logging.getLogger(__name__)


def create_app(
    export_dir: str | os.PathLike[str] | None = None,
    variant: str = "fp32",
    *,
    config: Optional[ServeConfig] = None,
    **overrides: Any,
) -> FastAPI:
    """Build the app; the model loads in the background when the app starts (see ``/health``).

    Args:
        export_dir: dir written by ``prodip export`` (ignored when ``config`` is given).
        variant: ONNX variant to serve.
        config: full settings; otherwise built from ``export_dir``, ``variant`` and ``overrides``
            (any :class:`ServeConfig` field, e.g. ``allow_unverified=True, api_key="k"``).
    Returns:
        The FastAPI app, with ``app.state.service`` (:class:`Service`).
    Raises:
        FileNotFoundError / ValueError: from ``prodip.serve.engine.load_export`` (missing files, hash
            mismatch, missing or failing conformance verdict without ``allow_unverified``).
    """
    if config is None:
        config = ServeConfig(export_dir=str(export_dir), variant=variant, **overrides)
    if config.api_key is None and os.environ.get("PRODIP_API_KEY"):
        config = dataclasses.replace(config, api_key=os.environ["PRODIP_API_KEY"])
    info = load_export(config.export_dir, config.variant, allow_unverified=config.allow_unverified)
    if config.default_max_tokens >= info.max_model_len:  # no prompt would fit: refuse at startup, not per request
        raise InvalidInput(
            f"ServeConfig.default_max_tokens {config.default_max_tokens} leaves no room for a prompt in the "
            f"model's context window of {info.max_model_len} tokens (config.json max_position_embeddings)"
        )
    for warning in info.warnings:
        log.warning(warning)
    service = Service(info, config, ServeMetrics())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = threading.Thread(target=service.load, name="prodip-load", daemon=True)
        loader.start()  # not awaited: /health answers 503 until it finishes
        yield
        await asyncio.to_thread(loader.join)
        await asyncio.to_thread(service.shutdown)

    app = FastAPI(title="prodip serve", version="1", lifespan=lifespan)
    app.state.service = service
    app.state.config = config
    _install_errors(app)
    add_routes(app)
    install_openapi(app)
    app.add_middleware(GuardMiddleware, config=config, metrics=service.metrics, api=app)
    return app


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, err: APIError) -> JSONResponse:
        return JSONResponse(err.body, status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        if first.get("type") == "refused":  # prodip.serve.schemas.refused: the rule names param and code
            ctx = first.get("ctx", {})
            return JSONResponse(error_body(ctx["message"], param=ctx["param"], code=ctx["code"]), status_code=400)
        if first.get("type") == "json_invalid":  # loc = ("body", json's pos): a position, not a parameter
            pos = first.get("loc", ("body", "?"))[-1]  # index into the UTF-8-decoded body (= byte for ASCII)
            msg = f"invalid JSON body: {first.get('ctx', {}).get('error', 'JSON decode error')} at character {pos}"
            return JSONResponse(error_body(msg, code="invalid_json"), status_code=400)
        loc = list(first.get("loc", ()))
        if loc[:1] == ["body"]:
            loc = loc[1:]
        if not loc:  # the body itself: missing, or not a JSON object (e.g. sent without a JSON content type)
            msg = "the request body must be a JSON object, sent with Content-Type: application/json"
            return JSONResponse(error_body(msg, code="invalid_value"), status_code=400)
        members = _union_members(err.errors(), loc[0])
        field = loc[:1] if members else loc  # ["prompt", "str"] -> ["prompt"]: the field, not the member tag
        param = ".".join(_printable(str(p)) for p in field)
        msg = first.get("msg", "invalid request")
        if members:  # one error per union member: say what the field accepts, not the first member's rule
            either = ", ".join(members[:-1]) + f" or {members[-1]}" if len(members) > 1 else members[0]
            msg = f"got {_json_type(_field_value(err, loc[0]))}; expected {either}"
        if not msg.startswith(f"{param} "):
            msg = f"{param}: {msg}"
        return JSONResponse(error_body(msg, param=param, code="invalid_value"), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        """404/405 from routing in OpenAI's form, keeping the exception's headers (a 405 must name
        the methods the path allows in ``Allow``: RFC 9110 sec. 15.5.6)."""
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(err.detail), kind), status_code=err.status_code, headers=err.headers)


#: pydantic's tags of union members in a validation error's ``loc``, as the API's words
_MEMBER_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "list[str]": "a list of strings",
    "list[int]": "a list of integers (token ids)",
    "list[list[int]]": "a list of lists of integers",
}


def _union_members(errors: Sequence[Any], field: Any) -> list[str]:
    """What a union-typed body field accepts, in words, from pydantic's errors for it (one error
    per member, ``loc`` = ``("body", field, member tag, ...)``); [] when ``field`` is not a union."""
    tags: list[str] = []
    for e in errors:
        loc = list(e.get("loc", ()))
        tag = loc[2] if loc[:2] == ["body", field] and len(loc) > 2 and isinstance(loc[2], str) else None
        # a member tag is a type ("str", "list[int]"), not a nested field name ("include_usage")
        if tag is not None and (tag in _MEMBER_WORDS or "[" in tag) and tag not in tags:
            tags.append(tag)
    return [_MEMBER_WORDS.get(t, t) for t in tags]


def _field_value(err: RequestValidationError, field: Any) -> Any:
    """The value the request sent for a top-level body field (None when not found)."""
    body = getattr(err, "body", None)
    return body.get(field) if isinstance(body, dict) else None


def _json_type(value: Any) -> str:
    """The JSON type name of a request value (for messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list whose items are of mixed or other types"
    return "an object"


def check_bind(host: str, port: int) -> None:
    """Bind (and release) every address ``host`` resolves to, as uvicorn will (``SO_REUSEADDR``).

    Raises:
        OSError: ``cannot bind HOST:PORT (reason)``.
    """

    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise OSError(f"cannot bind {where} (host does not resolve: {reason})") from None
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(addr)
        except OSError as err:
            reason = err.strerror or str(err)
            raise OSError(f"cannot bind {where} ({reason})") from None


def run_server(config: ServeConfig) -> int:
    """Serve ``config.export_dir`` with uvicorn until SIGINT/SIGTERM (graceful shutdown).

    Returns:
        0 after a clean shutdown.
    Raises:
        FileNotFoundError / ValueError: see :func:`create_app` (raised before binding the port).
        OSError: "cannot bind HOST:PORT (reason)" when the address is in use, not local or does not
            resolve (checked before uvicorn starts, so ``prodip serve`` reports it in one line, exit 2).
    """

    app = create_app(config=config)
    check_bind(config.host, config.port)
    if config.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "binding to %s: the server is reachable from other machines%s",
            config.host,
            "" if app.state.config.api_key else " and has no API key",
        )
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        # uvicorn annotates these two as int, but uses them as asyncio timeouts, where seconds may be
        # fractional (a ServeConfig float such as 0.5 works): its annotation is narrower than its use
        timeout_graceful_shutdown=config.graceful_shutdown_s,  # type: ignore[arg-type]
        http=deadline_protocol(config.request_timeout_s),  # 408 for a request not received in time
        timeout_keep_alive=config.keep_alive_s,  # type: ignore[arg-type]
        limit_concurrency=config.max_connections,
        h11_max_incomplete_event_size=config.max_header_bytes,
        loop="auto",  # uvloop when installed (a default dependency on CPython outside Windows: pyproject.toml)
    )
    return 0
