"""FastAPI app over an export dir: ``create_app(export_dir)``; thin routes over ``prodip.serve.service``.

Endpoints: ``POST /v1/completions`` (OpenAI), ``POST /v1/generate`` (native), ``GET /v1/models``,
``GET /health`` (503 until the model is loaded), ``GET /metrics`` (Prometheus), ``POST /tokenize``,
``POST /detokenize``, ``GET /tokenizer_info``. Every error is OpenAI's
``{"error": {"message", "type", "param", "code"}}``; bad parameters are 400, never 500.

    python -c "from serve.app import create_app; app = create_app('EXPORT_DIR', allow_unverified=True)"
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import os
import threading
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from prodip.serve import completions as fmt
from prodip.serve.config import ServeConfig
from prodip.serve.engine import load_export
from prodip.serve.metrics import ServeMetrics
from prodip.serve.schemas import (CompletionRequest, DetokenizeRequest, GenerateRequest, TokenizeRequest,
                           error_body)
from prodip.serve.service import APIError, Service

log = logging.getLogger(__name__)
_ROUTES = ("/v1/completions", "/v1/generate", "/v1/models", "/health", "/metrics", "/tokenize",
           "/detokenize", "/tokenizer_info")
_OPEN_ROUTES = ("/health",)  # answered without the API key (liveness probes)
_DISCONNECT_POLL_S = 0.05


def create_app(export_dir: str | os.PathLike | None = None, variant: str = "fp32", *,
               config: Optional[ServeConfig] = None, **overrides: Any) -> FastAPI:
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
    _add_routes(app, service)
    app.add_middleware(_GuardMiddleware, config=config, metrics=service.metrics)
    return app


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, err: APIError) -> JSONResponse:
        return JSONResponse(err.body, status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        if first.get("type") == "json_invalid":  # loc = ("body", json's pos): a position, not a parameter
            pos = first.get("loc", ("body", "?"))[-1]  # index into the UTF-8-decoded body (= byte for ASCII)
            msg = f"invalid JSON body: {first.get('ctx', {}).get('error', 'JSON decode error')} at character {pos}"
            return JSONResponse(error_body(msg, code="invalid_json"), status_code=400)
        loc = [_printable(str(p)) for p in first.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        msg = first.get("msg", "invalid request")
        if param and not msg.startswith(f"{param} "):
            msg = f"{param}: {msg}"
        return JSONResponse(error_body(msg, param=param, code="invalid_value"), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(err.detail), kind), status_code=err.status_code)


def _printable(text: str) -> str:
    """``text`` with lone surrogates escaped (``\\ud800``) so the JSON answer can be UTF-8 encoded."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


async def _until_disconnect(request: Request, work: Any) -> Any:
    """Await ``work`` but cancel it (and so its sequences) if the client goes away."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                return Response(status_code=499)
    finally:
        if not task.done():
            task.cancel()


async def _sse_guard(chunks: AsyncIterator[str], request: Request) -> AsyncIterator[str]:
    """Errors after the stream started cannot change the status: send them as an error event.

    Stops (closing ``chunks``, which cancels the sequences) as soon as the client is gone. Between
    chunks it yields to the event loop once, so the server learns of a failed socket write before
    the next chunk: without that, a burst of queued events is written to a dead socket, and asyncio
    logs "socket.send() raised exception." for every write past the fifth.
    """
    try:
        async for chunk in chunks:
            yield chunk
            await asyncio.sleep(0)
            if await request.is_disconnected():
                break
    except APIError as err:
        yield fmt.sse(err.body)
        yield fmt.sse("[DONE]")
    finally:
        await chunks.aclose()


def _sse(chunks: AsyncIterator[str], request: Request) -> StreamingResponse:
    return StreamingResponse(_sse_guard(chunks, request), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _conformance_body(svc: Service) -> dict[str, Any]:
    """``{verified, loosened_tolerances: [{table, metric, shipped, used}]}`` of the served variant:
    loosened = bounds of the tolerance file its verdict was made with that are looser than the shipped
    conformance/tolerances.toml (empty: the shipped bounds or stricter)."""
    return {"verified": svc.info.verified, "loosened_tolerances": svc.info.loosened_tolerances}


def _add_routes(app: FastAPI, svc: Service) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        body = {"status": "ok" if svc.ready.is_set() else ("error" if svc.load_error else "loading"),
                "model": svc.model_name, "variant": svc.info.variant, "verified": svc.info.verified,
                "conformance": _conformance_body(svc)}
        if svc.load_error:
            body["error"] = svc.load_error
        return JSONResponse(body, status_code=200 if svc.ready.is_set() else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": svc.model_name, "object": "model", "created": svc.created, "owned_by": "prodip",
            "variant": svc.info.variant, "max_model_len": svc.info.max_model_len,
            "conformance": _conformance_body(svc)}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = svc.metrics.render()
        return Response(body, media_type=content_type)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Any:
        svc.require_ready()
        svc.check_model(req.model)
        if req.suffix:
            raise APIError(400, "suffix is not supported (no fill-in-the-middle)", param="suffix", code="unsupported")
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of must equal n (no server-side reranking)", param="best_of")
        prompts = svc.prompt_ids(req.prompt)
        max_tokens = svc.config.default_max_tokens if req.max_tokens is None else req.max_tokens
        if req.echo and req.max_tokens is None:
            max_tokens = max(0, min(max_tokens, svc.info.max_model_len - max(map(len, prompts))))
        params = svc.sampling_params(req, max_tokens, prompts, req.n, req.logprobs, req.echo)
        events = svc.stream(prompts, params, req.n)
        want_lp = req.logprobs is not None
        texts = svc.prompt_texts(req.prompt) if req.echo else None
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return _sse(fmt.completion_stream(svc, events, prompts, req.n, req.echo, want_lp, include_usage,
                                              texts), request)
        return await _until_disconnect(request, fmt.completion(svc, events, prompts, req.n, req.echo, want_lp,
                                                               texts))

    @app.post("/v1/generate")
    async def generate(req: GenerateRequest, request: Request) -> Any:
        svc.require_ready()
        prompts = svc.prompt_ids(req.prompt if isinstance(req.prompt, str) else [req.prompt])
        max_new = svc.config.default_max_tokens if req.max_new_tokens is None else req.max_new_tokens
        params = svc.sampling_params(req, max_new, prompts, 1, req.logprobs)
        events = svc.stream(prompts, params, 1)
        if req.stream:
            return _sse(fmt.generate_stream(svc, events, prompts[0], req.logprobs is not None), request)
        return await _until_disconnect(request, fmt.generate(svc, events, prompts[0], req.logprobs is not None))

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict:
        svc.require_ready()
        ids = svc.encode(req.text, req.add_special_tokens)
        return {"tokens": ids, "count": len(ids), "max_model_len": svc.info.max_model_len}

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> dict:
        svc.require_ready()
        bad = [t for t in req.tokens if not 0 <= t < svc.vocab_size]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {svc.vocab_size})", param="tokens")
        return {"text": svc.decode(req.tokens, req.skip_special_tokens)}

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict:
        svc.require_ready()
        tok = svc.tokenizer
        return {"vocab_size": tok.get_vocab_size(), "model_vocab_size": svc.vocab_size,
                "max_model_len": svc.info.max_model_len, "tokenizer_sha256": svc.info.tokenizer_sha256,
                "special_tokens": {name: {"id": tid, "text": tok.id_to_token(tid)} for name, tid in
                                   (("pad", int(svc.info.config.get("pad_token_id", 0))), ("bos", svc.bos_id),
                                    ("eos", svc.eos_id))},
                "normalizer": type(tok.normalizer).__name__ if tok.normalizer is not None else None}


class _GuardMiddleware:
    """Pure ASGI middleware (so streaming and disconnects pass through untouched): body-size cap
    (413), bearer auth (401, constant-time compare), per-route request counter, and the 500 answer.

    An unhandled error is logged here, once, and answered with a 500 in OpenAI's form. It is not
    left to Starlette's ``ServerErrorMiddleware``: that one always re-raises after answering, so the
    server (uvicorn: "Exception in ASGI application") logged a second traceback of the same error.
    Only when the response has already started (a stream) is the error re-raised unlogged: the
    status line is gone, so the server must abort the connection, and its log is then the only one.
    """

    def __init__(self, app: Any, config: ServeConfig, metrics: ServeMetrics) -> None:
        self.app, self.config, self.metrics = app, config, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in _ROUTES else "other"
        status = {"code": 500, "started": False}

        async def send_counted(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
            await send(message)

        try:
            error = self._check(scope)
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
            await JSONResponse(error_body(f"internal error: {type(err).__name__}", "server_error"),
                               status_code=500)(scope, receive, send_counted)
        finally:
            self.metrics.requests.labels(route=route, status=str(status["code"])).inc()

    def _too_large(self) -> JSONResponse:
        return JSONResponse(error_body(f"request body exceeds {self.config.max_body_bytes} bytes",
                                       code="request_too_large"), status_code=413)

    def _check(self, scope: dict) -> Optional[JSONResponse]:
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.config.max_body_bytes:
            return self._too_large()
        if self.config.api_key and scope["path"] not in _OPEN_ROUTES:
            auth = headers.get(b"authorization", b"").decode("latin-1")
            token = auth[7:] if auth[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(token.encode(), self.config.api_key.encode()):
                return JSONResponse(error_body("missing or wrong API key (Authorization: Bearer KEY)",
                                               "authentication_error", code="invalid_api_key"),
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return None

    async def _buffered(self, receive: Any) -> Any:
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

        async def replay() -> dict:
            if not replayed["done"]:
                replayed["done"] = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()
        return replay

    def _capped(self, receive: Any) -> Any:
        seen = {"bytes": 0}

        async def capped() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                seen["bytes"] += len(message.get("body", b""))
                if seen["bytes"] > self.config.max_body_bytes:
                    raise _TooLarge()
            return message
        return capped


class _TooLarge(Exception):
    pass


def check_bind(host: str, port: int) -> None:
    """Bind (and release) every address ``host`` resolves to, as uvicorn will (``SO_REUSEADDR``).

    Raises:
        OSError: ``cannot bind HOST:PORT (reason)``.
    """
    import socket

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
    import uvicorn

    app = create_app(config=config)
    check_bind(config.host, config.port)
    if config.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("binding to %s: the server is reachable from other machines%s", config.host,
                    "" if app.state.config.api_key else " and has no API key")
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level,
                timeout_graceful_shutdown=config.graceful_shutdown_s)
    return 0
