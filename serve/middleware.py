"""ASGI middleware of prodip serve: Host check, API key, body-size cap and per-route metrics, before any route
runs.

python -c "from prodip.serve.middleware import GuardMiddleware; help(GuardMiddleware)"
"""

from __future__ import annotations

import hmac
import logging
from typing import Optional

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prodip.serve.config import HostCheck, ServeConfig
from prodip.serve.metrics import ServeMetrics
from prodip.serve.openapi import find_route, is_open
from prodip.serve.routes import _printable
from prodip.serve.schemas import error_body

log = logging.getLogger("prodip.serve.app")  # one logger name for the server, as before the split


class GuardMiddleware:
    """Pure ASGI middleware (so streaming and disconnects pass through untouched): header-size cap
    (431), Host check without an API key (403, :class:`HostCheck`), body-size cap (413), bearer auth (401,
    constant-time compare), per-route request counter, and the 500 answer.

    An unhandled error is logged here, once, and answered with a 500 in OpenAI's form. It is not
    left to Starlette's ``ServerErrorMiddleware``: that one always re-raises after answering, so the
    server (uvicorn: "Exception in ASGI application") logged a second traceback of the same error.
    Only when the response has already started (a stream) is the error re-raised unlogged: the
    status line is gone, so the server must abort the connection, and its log is then the only one.

    Args:
        app: the next ASGI app.
        config: the server's settings (API key, size caps).
        metrics: where the per-route request counter goes.
        api: the FastAPI app whose route table names the routes: a request's metrics label is the
            path template of the route it matches ("other" for none), and the routes declared open
            (prodip.serve.openapi.is_open) need no API key.
    """

    def __init__(self, app: ASGIApp, config: ServeConfig, metrics: ServeMetrics, api: FastAPI) -> None:
        self.app, self.config, self.metrics, self.api = app, config, metrics, api
        self.hosts = HostCheck(config)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = find_route(self.api, scope["path"])
        label = route[0] if route is not None else "other"
        status = {"code": 500, "started": False}

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
            await send(message)

        try:
            error = self._check(scope, route is not None and is_open(self.api, *route))
            if error is not None:
                await error(scope, receive, send_counted)
                return
            headers = dict(scope.get("headers") or [])
            if b"content-length" not in headers and scope["method"] in ("POST", "PUT", "PATCH"):
                receive = await self._buffered(receive)  # chunked: read (up to the cap) before parsing
            await self.app(scope, self._capped(receive), send_counted)
        except _TooLarge:
            await self._too_large()(scope, receive, send_counted)
        except Exception as err:
            if status["started"]:
                raise
            log.exception("unhandled error in %s %s", scope.get("method"), _printable(scope["path"]))
            await JSONResponse(error_body(f"internal error: {type(err).__name__}", "server_error"), status_code=500)(
                scope, receive, send_counted
            )
        finally:
            self.metrics.requests.labels(route=label, status=str(status["code"])).inc()

    def _too_large(self) -> JSONResponse:
        return JSONResponse(
            error_body(f"request body exceeds {self.config.max_body_bytes} bytes", code="request_too_large"),
            status_code=413,
        )

    def _check(self, scope: Scope, open_route: bool) -> Optional[JSONResponse]:
        """The answer that stops the request before any route runs (431, 403, 413, 401), or None."""
        head = len(scope.get("raw_path") or b"") + sum(len(k) + len(v) + 4 for k, v in scope.get("headers") or [])
        if head > self.config.max_header_bytes:  # h11 caps only headers still arriving; this, the whole
            return JSONResponse(
                error_body(
                    f"request line and headers exceed {self.config.max_header_bytes} bytes",
                    code="headers_too_large",
                ),
                status_code=431,
            )
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host")  # none: HTTP/1.0 without one, never a browser (browsers always send it)
        if host is not None and not self.hosts.allows(host.decode("latin-1")):
            return JSONResponse(
                error_body(
                    f"Host {_printable(host.decode('latin-1'))[:100]!r} is not served: this server has no API key, "
                    "so it answers only for its own address and localhost (a page whose name is rebound to this "
                    "address must not use it); start it with --allowed-hosts NAME to serve that name, or --api-key",
                    "permission_error",
                    code="host_not_allowed",
                ),
                status_code=403,
            )
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.config.max_body_bytes:
            return self._too_large()
        if self.config.api_key and not open_route:
            auth = headers.get(b"authorization", b"")  # bytes as sent; the key is printable ASCII (ServeConfig)
            token = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
            if not hmac.compare_digest(token, self.config.api_key.encode("ascii")):
                return JSONResponse(
                    error_body(
                        "missing or wrong API key (Authorization: Bearer KEY)",
                        "authentication_error",
                        code="invalid_api_key",
                    ),
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return None

    async def _buffered(self, receive: Receive) -> Receive:
        """Read a body of unknown length whole; raise _TooLarge past the cap; replay it after."""
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.config.max_body_bytes:
                raise _TooLarge()
        replayed = {"done": False}

        async def replay() -> Message:
            if not replayed["done"]:
                replayed["done"] = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        return replay

    def _capped(self, receive: Receive) -> Receive:
        seen = {"bytes": 0}

        async def capped() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                seen["bytes"] += len(message.get("body", b""))
                if seen["bytes"] > self.config.max_body_bytes:
                    raise _TooLarge()
            return message

        return capped


class _TooLarge(Exception):
    pass
