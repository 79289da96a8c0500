"""The HTTP routes of prodip serve: thin handlers from the request models (serve/schemas.py) to the
service (serve/service.py) and back; streaming over SSE; cancellation when the client goes away.

One :class:`~fastapi.APIRouter` per concern (:data:`ROUTERS`): status (health, models, metrics),
completions (OpenAI's and the native generate), chat, tokenizer, playground. Each route declares its
own OpenAPI facts on its decorator (prodip.serve.openapi says which ones and adds those every route
shares); the metrics label of a request is the path template of the route it matches in the app's own
route table (prodip.serve.openapi.find_route, used by prodip.serve.middleware), and the API key check skips the routes
declared ``OPEN``.

Work that grows with the request (rendering the chat template, tokenising, detokenising, checking ids)
runs in a worker thread (:func:`off_loop`), never on the event loop: a 900 KB prompt takes the tokenizer
~0.4 s, and on the loop that stalls /health and every stream for as long. The tokenizer releases the GIL
meanwhile (:meth:`~prodip.serve.service.Service.encode`).

Adding an endpoint: write the handler in the router of its concern (or a new router added to
:data:`ROUTERS`), with ``responses=`` for its 200 body (a model in serve/schemas.py) and the errors only
it gives (``errors(404, 503)``), and ``openapi_extra=OPEN`` if it needs no API key. Nothing else:
its metrics label, its 400/401/413/500 answers and their documentation follow from the app.

    python -c "from prodip.serve.routes import ROUTERS; print([r.path for x in ROUTERS for r in x.routes])"
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import Annotated, Optional, TypeVar, Union

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.concurrency import run_in_threadpool
from starlette.types import Message, Receive, Scope, Send
from typing_extensions import NotRequired, TypedDict

from prodip.base import jsontypes
from prodip.base.page import render_page
from prodip.serve import completions as fmt
from prodip.serve.batching import SamplingParams
from prodip.serve.openapi import OPEN, SSE, errors
from prodip.serve.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    Conformance,
    DetokenizeRequest,
    DetokenizeResponse,
    GenerateRequest,
    GenerateResponse,
    Health,
    ModelCard,
    ModelList,
    SpecialToken,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfo,
)
from prodip.serve.service import APIError, EventStream, Service

log = logging.getLogger("prodip.serve.app")


_DISCONNECT_POLL_S = 0.05
#: The playground page (GET /playground): a prompt box streaming from /v1/completions (or chat); its
#: head is the one every prodip page shares (:func:`prodip.base.page.render_page`).
PLAYGROUND = Path(__file__).with_name("playground.html")
T = TypeVar("T")


async def service(request: Request) -> Service:
    """The app's :class:`Service` (``app.state.service``), for handlers: ``svc: Svc``. A coroutine, so
    FastAPI calls it on the event loop, not in its thread pool."""
    svc: Service = request.app.state.service
    return svc


Svc = Annotated[Service, Depends(service)]


async def off_loop(work: Callable[[], T]) -> T:
    """``work()`` in Starlette's worker threads (anyio's, 40 at most), so the event loop keeps answering
    other requests and streams meanwhile; its exceptions (:class:`APIError`) propagate as raised."""
    return await run_in_threadpool(work)


async def _until_disconnect(request: Request, work: Awaitable[T]) -> Union[T, Response]:
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


async def _sse_guard(
    chunks: AsyncGenerator[str, None], gone: Callable[[], bool], ready: Callable[[], bool]
) -> AsyncGenerator[str, None]:
    """Errors after the stream started cannot change the status: send them as an error event.

    The chunks made from the events that are here already (``ready()``: the request's
    :meth:`~prodip.serve.service.EventStream.ready`) go out as one write: the engine hands a stream's
    tokens over several at a time, and each write wakes the client, whose work takes a core from the
    model's threads (one write per token cost ~5 % at one stream on 2 cores; bench/results/
    serve_engine_2026-12-01.md).

    Stops (closing ``chunks``, which cancels the sequences) as soon as ``gone()`` says the client left.
    Between writes it yields to the event loop once, so the server learns of a failed socket write before
    the next one: without that, a burst of queued events is written to a dead socket, and asyncio
    logs "socket.send() raised exception." for every write past the fifth.
    """
    try:
        async for chunk in chunks:
            joined = [chunk]
            try:
                while ready():  # the next chunk is made without waiting for the engine
                    joined.append(await chunks.__anext__())
            except StopAsyncIteration:
                pass
            except APIError:
                yield "".join(joined)  # what came before the error goes out first
                raise
            yield "".join(joined)
            await asyncio.sleep(0)
            if gone():
                break
    except APIError as err:
        yield fmt.sse(err.body)
        yield fmt.sse("[DONE]")
    finally:
        await chunks.aclose()


class _SSEResponse(StreamingResponse):
    """A text/event-stream response that learns of the client leaving from the ASGI messages Starlette's
    own listener already receives (``http.disconnect``), not from a receive call per chunk.

    Why: ``Request.is_disconnected`` after every chunk (an anyio cancel scope and a cancelled receive
    each time) was ~16 % of the event loop's Python per token at one stream
    (bench/results/serve_profile_2026-12-01.md); a flag costs nothing. Under uvicorn (ASGI spec 2.3)
    Starlette's listener receives the disconnect through :meth:`__call__`'s ``watched`` and cancels the
    body at once (its sequences are cancelled by the generators' ``finally``, even while no token flows);
    the flag stops the guard at its next chunk should that cancellation land later. A server of ASGI spec
    >= 2.4 has no listener: there a disconnect surfaces as the failed write of the next chunk (the
    per-chunk check also ran only between chunks: a stream waiting for its first token noticed neither way).
    """

    def __init__(self, chunks: AsyncGenerator[str, None], ready: Callable[[], bool]) -> None:
        self.client_gone = False
        super().__init__(
            _sse_guard(chunks, lambda: self.client_gone, ready),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watched() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.client_gone = True
            return message

        await super().__call__(scope, watched, send)


def _printable(text: str) -> str:
    """``text`` with lone surrogates escaped (``\\ud800``) so the JSON answer can be UTF-8 encoded."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _sse(chunks: AsyncGenerator[str, None], events: EventStream) -> StreamingResponse:
    """The SSE response of ``chunks``, made from ``events``."""
    return _SSEResponse(chunks, events.ready)


def _conformance(svc: Service) -> Conformance:
    """The served variant's ``{verified, loosened_tolerances: [{table, metric, shipped, used}]}``:
    loosened = bounds of the tolerance file its verdict was made with that are looser than the shipped
    conformance/tolerances.toml (empty: the shipped bounds or stricter)."""
    return Conformance.model_validate(
        {"verified": svc.info.verified, "loosened_tolerances": svc.info.loosened_tolerances}
    )


# ---- status: health, models, metrics ------------------------------------------------------------
status_routes = APIRouter()


@status_routes.get(
    "/health",
    response_model=None,
    responses={
        200: {"model": Health},
        503: {"model": Health, "description": "loading, or the load failed (body says which)"},
    },
    openapi_extra=OPEN,
)
async def health(svc: Svc) -> JSONResponse:
    """200 when the model is loaded; 503 while it loads or after a failed load (``status``, ``error``)."""
    body: _HealthBody = {
        "status": "ok" if svc.ready.is_set() else ("error" if svc.load_error else "loading"),
        "model": svc.model_name,
        "variant": svc.info.variant,
        "verified": svc.info.verified,
        "conformance": _conformance(svc).model_dump(mode="json"),
    }
    if svc.load_error:
        body["error"] = svc.load_error
    return JSONResponse(body, status_code=200 if svc.ready.is_set() else 503)


class _HealthBody(TypedDict):
    """``GET /health``'s body as built (the :class:`Health` schema, ``error`` only after a failed load)."""

    status: str
    model: str
    variant: str
    verified: bool
    conformance: jsontypes.JSONObject
    error: NotRequired[str]


class _TokenizeBody(TypedDict):
    """``POST /tokenize``'s body as built (the :class:`TokenizeResponse` schema)."""

    count: int
    max_model_len: int
    tokens: list[int]
    #: None for an id the tokenizer has no token for
    token_strs: NotRequired[list[Optional[str]]]


def _model_card(svc: Service) -> ModelCard:
    return ModelCard(
        id=svc.model_name,
        object="model",
        created=svc.created,
        owned_by="prodip",
        variant=svc.info.variant,
        max_model_len=svc.info.max_model_len,
        conformance=_conformance(svc),
    )


@status_routes.get("/v1/models", response_model=None, responses={200: {"model": ModelList}})
async def models(svc: Svc) -> ModelList:
    return ModelList(object="list", data=[_model_card(svc)])


@status_routes.get("/v1/models/{model}", response_model=None, responses={200: {"model": ModelCard}, **errors(404)})
async def model(model: str, svc: Svc) -> ModelCard:
    """OpenAI's "retrieve model" (the ``openai`` client's ``models.retrieve``); 404 for another id."""
    svc.check_model(model)
    return _model_card(svc)


@status_routes.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"description": "Prometheus text exposition format"}},
)
async def metrics(svc: Svc) -> Response:
    body, content_type = svc.metrics.render()
    return Response(body, media_type=content_type)


# ---- completions: OpenAI's /v1/completions and the native /v1/generate ---------------------------
completion_routes = APIRouter()


@completion_routes.post(
    "/v1/completions",
    response_model=None,
    responses={200: {"model": CompletionResponse, "content": SSE}, **errors(404, 503)},
)
async def completions(req: CompletionRequest, request: Request, svc: Svc) -> Response | fmt.CompletionBody:
    svc.require_ready()
    svc.check_model(req.model)
    if req.suffix:
        raise APIError(400, "suffix is not supported (no fill-in-the-middle)", param="suffix", code="unsupported")
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(400, "best_of must equal n (no server-side reranking)", param="best_of")

    def prepare() -> tuple[list[list[int]], SamplingParams]:
        prompts = svc.prompt_ids(req.prompt)
        max_tokens = svc.config.default_max_tokens if req.max_tokens is None else req.max_tokens
        if req.echo and req.max_tokens is None:
            max_tokens = max(0, min(max_tokens, svc.info.max_model_len - max(map(len, prompts))))
        return prompts, svc.sampling_params(req, max_tokens, prompts, req.n, req.logprobs, req.echo)

    prompts, params = await off_loop(prepare)
    events = svc.stream(prompts, params, req.n)
    want_lp = req.logprobs is not None
    texts = svc.prompt_texts(req.prompt) if req.echo else None
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return _sse(fmt.completion_stream(svc, events, prompts, req.n, req.echo, want_lp, include_usage, texts), events)
    return await _until_disconnect(request, fmt.completion(svc, events, prompts, req.n, req.echo, want_lp, texts))


@completion_routes.post(
    "/v1/generate",
    response_model=None,
    responses={200: {"model": GenerateResponse, "content": SSE}, **errors(404, 503)},
)
async def generate(req: GenerateRequest, request: Request, svc: Svc) -> Response | fmt.GenerateBody:
    svc.require_ready()
    svc.check_model(req.model)

    def prepare() -> tuple[list[list[int]], SamplingParams]:
        prompts = svc.prompt_ids(req.prompt if isinstance(req.prompt, str) else [req.prompt])
        max_new = svc.config.default_max_tokens if req.max_new_tokens is None else req.max_new_tokens
        return prompts, svc.sampling_params(req, max_new, prompts, 1, req.logprobs, max_tokens_field="max_new_tokens")

    prompts, params = await off_loop(prepare)
    events = svc.stream(prompts, params, 1)
    if req.stream:
        return _sse(fmt.generate_stream(svc, events, prompts[0], req.logprobs is not None), events)
    return await _until_disconnect(request, fmt.generate(svc, events, prompts[0], req.logprobs is not None))


# ---- chat: OpenAI's /v1/chat/completions ---------------------------------------------------------
chat_routes = APIRouter()


@chat_routes.post(
    "/v1/chat/completions",
    response_model=None,
    responses={200: {"model": ChatCompletionResponse, "content": SSE}, **errors(404, 503)},
)
async def chat_completions(req: ChatCompletionRequest, request: Request, svc: Svc) -> Response | fmt.ChatCompletionBody:
    """OpenAI chat completions: ``messages`` rendered with the export's chat template (the chat
    contract, prodip.base.chat), then generated as /v1/completions does, stopping at the end of
    turn ``<|im_end|>``. A base model (no template) answers 400 ``chat_not_supported``."""
    svc.require_chat()
    svc.require_ready()
    svc.check_model(req.model)
    field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = svc.config.default_max_tokens if max_tokens is None else max_tokens
    top = req.top_logprobs or 0

    def prepare() -> tuple[list[int], SamplingParams]:
        prompt = svc.chat_prompt(req)  # the template rendered and tokenised
        return prompt, svc.sampling_params(
            req, max_tokens, [prompt], req.n, top if req.logprobs else None, max_tokens_field=field
        )

    prompt, params = await off_loop(prepare)
    events = svc.stream([prompt], params, req.n)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return _sse(fmt.chat_completion_stream(svc, events, prompt, req.n, req.logprobs, top, include_usage), events)
    return await _until_disconnect(request, fmt.chat_completion(svc, events, prompt, req.n, req.logprobs, top))


# ---- tokenizer: vLLM's /tokenize, /detokenize, /tokenizer_info -----------------------------------
tokenizer_routes = APIRouter()


@tokenizer_routes.post(
    "/tokenize", response_model=None, responses={200: {"model": TokenizeResponse}, **errors(404, 503)}
)
async def tokenize(req: TokenizeRequest, svc: Svc) -> JSONResponse:
    """vLLM's shape: ``{count, max_model_len, tokens[, token_strs]}``; ``messages`` are rendered with the chat
    template as /v1/chat/completions renders them (vLLM's chat form)."""
    svc.require_ready()
    svc.check_model(req.model)

    def work() -> JSONResponse:
        if req.messages is not None:
            ids = svc.chat_prompt(req)
        else:
            ids = svc.encode(req.content, req.add_special_tokens is not False)
        body: _TokenizeBody = {"count": len(ids), "max_model_len": svc.info.max_model_len, "tokens": ids}
        if req.return_token_strs:
            body["token_strs"] = [svc.tokenizer.id_to_token(t) for t in ids]
        return JSONResponse(body)  # serialised here too: 300,000 ids are ~0.1 s of json.dumps

    return await off_loop(work)


@tokenizer_routes.post(
    "/detokenize", response_model=None, responses={200: {"model": DetokenizeResponse}, **errors(404, 503)}
)
async def detokenize(req: DetokenizeRequest, svc: Svc) -> DetokenizeResponse:
    """vLLM's shape ``{prompt}``, plus ``text`` (prodip's older name, the same string)."""
    svc.require_ready()
    svc.check_model(req.model)

    def work() -> str:
        bad = next((t for t in req.tokens if not 0 <= t < svc.vocab_size), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary [0, {svc.vocab_size})", param="tokens")
        return svc.decode(req.tokens, req.skip_special_tokens)

    text = await off_loop(work)
    return DetokenizeResponse(prompt=text, text=text)


@tokenizer_routes.get("/tokenizer_info", response_model=None, responses={200: {"model": TokenizerInfo}, **errors(503)})
async def tokenizer_info(svc: Svc) -> TokenizerInfo:
    """vLLM's keys (``tokenizer_class``, ``bos_token``, ``eos_token``, ``pad_token``,
    ``model_max_length``, ``add_bos_token``, ``chat_template``: what lm-eval's remote tokenizer
    reads), then prodip's: vocabulary sizes, ids of the special tokens, sha256, normaliser."""
    svc.require_ready()
    tok = svc.tokenizer
    specials = {
        name: SpecialToken(id=tid, text=tok.id_to_token(tid))
        for name, tid in (("pad", svc.pad_id), ("bos", svc.bos_id), ("eos", svc.eos_id))
    }
    where = "the export's tokenizer_config.json chat_template"
    template = svc.tokenizer_config.get("chat_template")  # one template, or HF's list of named ones
    tok_class = svc.tokenizer_config.get("tokenizer_class", "PreTrainedTokenizerFast")
    return TokenizerInfo(
        tokenizer_class=jsontypes.text(tok_class, where="the export's tokenizer_config.json tokenizer_class"),
        bos_token=specials["bos"].text,
        eos_token=specials["eos"].text,
        pad_token=specials["pad"].text,
        model_max_length=svc.info.max_model_len,
        add_bos_token=svc.adds_bos,
        chat_template=(
            template
            if template is None or isinstance(template, str)
            else [jsontypes.obj(t, where=where) for t in jsontypes.arr(template, where=where)]
        ),
        vocab_size=tok.get_vocab_size(),
        model_vocab_size=svc.vocab_size,
        max_model_len=svc.info.max_model_len,
        tokenizer_sha256=svc.info.tokenizer_sha256,
        special_tokens=specials,
        normalizer=type(tok.normalizer).__name__ if tok.normalizer is not None else None,
    )


# ---- playground: a page for people (not part of the API document) -------------------------------
playground_routes = APIRouter()


@playground_routes.get("/playground", include_in_schema=False, openapi_extra=OPEN)
async def playground() -> HTMLResponse:
    """A small page (no scripts from elsewhere) that streams completions from this server: a conversation
    for a chat model (its /tokenizer_info has a chat template), a completion otherwise, with temperature,
    top-p and max tokens; the API key, when the server has one, is typed into the page (the page is open)."""
    return HTMLResponse(render_page(PLAYGROUND.read_text(encoding="utf-8")))


@playground_routes.get("/", include_in_schema=False, openapi_extra=OPEN)
async def root(request: Request) -> RedirectResponse:
    """The server's address in a browser leads to the playground (a person typing it wants the page), its
    query (the page's parameters) kept."""
    query = request.url.query
    return RedirectResponse("/playground" + (f"?{query}" if query else ""), status_code=307)


#: every router of the server, in the order of the OpenAPI document
ROUTERS = (status_routes, completion_routes, chat_routes, tokenizer_routes, playground_routes)


def add_routes(app: FastAPI) -> None:
    """Include :data:`ROUTERS` in ``app`` (its handlers find the service at ``app.state.service``)."""
    for router in ROUTERS:
        app.include_router(router)
