"""The HTTP routes of prodip serve: thin handlers from the request models (serve/schemas.py) to the
service (serve/service.py) and back; streaming over SSE; cancellation when the client goes away.

    python -c "from prodip.serve.routes import ROUTES; print(ROUTES)"
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from prodip.serve import completions as fmt
from prodip.serve.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    GenerateRequest,
    TokenizeRequest,
)
from prodip.serve.service import APIError, Service

log = logging.getLogger("prodip.serve.app")


_DISCONNECT_POLL_S = 0.05
#: Paths with their own metrics label (others count as "other").
ROUTES = (
    "/v1/completions",
    "/v1/generate",
    "/v1/models",
    "/v1/models/{model}",
    "/health",
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/tokenizer_info",
    "/v1/chat/completions",
)
#: answered without the API key: liveness probes, and the API's documentation (a browser cannot send
#: the key to read it; it holds no secret)
OPEN_ROUTES = ("/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/playground")
#: The playground page (GET /playground): a prompt box streaming from /v1/completions (or chat).
PLAYGROUND = Path(__file__).with_name("playground.html")


def route_label(path: str) -> str:
    """The metrics label of a request path: the route it matches in :data:`ROUTES`, else "other"."""
    if path in ROUTES:
        return path
    if path.startswith("/v1/models/") and "/" not in path[len("/v1/models/") :]:
        return "/v1/models/{model}"
    return "other"


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


def _printable(text: str) -> str:
    """``text`` with lone surrogates escaped (``\\ud800``) so the JSON answer can be UTF-8 encoded."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _sse(chunks: AsyncIterator[str], request: Request) -> StreamingResponse:
    return StreamingResponse(
        _sse_guard(chunks, request),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _conformance_body(svc: Service) -> dict[str, Any]:
    """``{verified, loosened_tolerances: [{table, metric, shipped, used}]}`` of the served variant:
    loosened = bounds of the tolerance file its verdict was made with that are looser than the shipped
    conformance/tolerances.toml (empty: the shipped bounds or stricter)."""
    return {"verified": svc.info.verified, "loosened_tolerances": svc.info.loosened_tolerances}


def add_routes(app: FastAPI, svc: Service) -> None:
    @app.get("/playground", include_in_schema=False)
    async def playground() -> HTMLResponse:
        """A small page (no scripts from elsewhere) that streams completions from this server; the
        API key, when the server has one, is typed into the page (the page itself is open)."""
        return HTMLResponse(PLAYGROUND.read_text(encoding="utf-8"))

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {
            "status": "ok" if svc.ready.is_set() else ("error" if svc.load_error else "loading"),
            "model": svc.model_name,
            "variant": svc.info.variant,
            "verified": svc.info.verified,
            "conformance": _conformance_body(svc),
        }
        if svc.load_error:
            body["error"] = svc.load_error
        return JSONResponse(body, status_code=200 if svc.ready.is_set() else 503)

    def model_card() -> dict[str, Any]:
        return {
            "id": svc.model_name,
            "object": "model",
            "created": svc.created,
            "owned_by": "prodip",
            "variant": svc.info.variant,
            "max_model_len": svc.info.max_model_len,
            "conformance": _conformance_body(svc),
        }

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model}")
    async def model(model: str) -> dict:
        """OpenAI's "retrieve model" (the ``openai`` client's ``models.retrieve``); 404 for another id."""
        svc.check_model(model)
        return model_card()

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
            return _sse(
                fmt.completion_stream(svc, events, prompts, req.n, req.echo, want_lp, include_usage, texts), request
            )
        return await _until_disconnect(request, fmt.completion(svc, events, prompts, req.n, req.echo, want_lp, texts))

    @app.post("/v1/generate")
    async def generate(req: GenerateRequest, request: Request) -> Any:
        svc.require_ready()
        svc.check_model(req.model)
        prompts = svc.prompt_ids(req.prompt if isinstance(req.prompt, str) else [req.prompt])
        max_new = svc.config.default_max_tokens if req.max_new_tokens is None else req.max_new_tokens
        params = svc.sampling_params(req, max_new, prompts, 1, req.logprobs, max_tokens_field="max_new_tokens")
        events = svc.stream(prompts, params, 1)
        if req.stream:
            return _sse(fmt.generate_stream(svc, events, prompts[0], req.logprobs is not None), request)
        return await _until_disconnect(request, fmt.generate(svc, events, prompts[0], req.logprobs is not None))

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict:
        """vLLM's shape: ``{count, max_model_len, tokens[, token_strs]}``."""
        svc.require_ready()
        svc.check_model(req.model)
        ids = svc.encode(req.content, req.add_special_tokens)
        body: dict[str, Any] = {"count": len(ids), "max_model_len": svc.info.max_model_len, "tokens": ids}
        if req.return_token_strs:
            body["token_strs"] = [svc.tokenizer.id_to_token(t) for t in ids]
        return body

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> dict:
        """vLLM's shape ``{prompt}``, plus ``text`` (prodip's older name, the same string)."""
        svc.require_ready()
        svc.check_model(req.model)
        bad = [t for t in req.tokens if not 0 <= t < svc.vocab_size]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {svc.vocab_size})", param="tokens")
        text = svc.decode(req.tokens, req.skip_special_tokens)
        return {"prompt": text, "text": text}

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict:
        """vLLM's keys (``tokenizer_class``, ``bos_token``, ``eos_token``, ``pad_token``,
        ``model_max_length``, ``add_bos_token``, ``chat_template``: what lm-eval's remote tokenizer
        reads), then prodip's: vocabulary sizes, ids of the special tokens, sha256, normaliser."""
        svc.require_ready()
        tok = svc.tokenizer
        specials = {
            name: {"id": tid, "text": tok.id_to_token(tid)}
            for name, tid in (("pad", svc.pad_id), ("bos", svc.bos_id), ("eos", svc.eos_id))
        }
        return {
            "tokenizer_class": svc.tokenizer_config.get("tokenizer_class", "PreTrainedTokenizerFast"),
            "bos_token": specials["bos"]["text"],
            "eos_token": specials["eos"]["text"],
            "pad_token": specials["pad"]["text"],
            "model_max_length": svc.info.max_model_len,
            "add_bos_token": svc.adds_bos,
            "chat_template": svc.tokenizer_config.get("chat_template"),
            "vocab_size": tok.get_vocab_size(),
            "model_vocab_size": svc.vocab_size,
            "max_model_len": svc.info.max_model_len,
            "tokenizer_sha256": svc.info.tokenizer_sha256,
            "special_tokens": specials,
            "normalizer": type(tok.normalizer).__name__ if tok.normalizer is not None else None,
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Any:
        """OpenAI chat completions: ``messages`` rendered with the export's chat template (the chat
        contract, prodip.base.chat), then generated as /v1/completions does, stopping at the end of
        turn ``<|im_end|>``. A base model (no template) answers 400 ``chat_not_supported``."""
        svc.require_chat()
        svc.require_ready()
        svc.check_model(req.model)
        prompt = svc.chat_prompt(req)
        field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = svc.config.default_max_tokens if max_tokens is None else max_tokens
        top = req.top_logprobs or 0
        params = svc.sampling_params(
            req, max_tokens, [prompt], req.n, top if req.logprobs else None, max_tokens_field=field
        )
        events = svc.stream([prompt], params, req.n)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return _sse(
                fmt.chat_completion_stream(svc, events, prompt, req.n, req.logprobs, top, include_usage), request
            )
        return await _until_disconnect(request, fmt.chat_completion(svc, events, prompt, req.n, req.logprobs, top))
