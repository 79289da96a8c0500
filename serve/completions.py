"""OpenAI ``/v1/completions`` and native ``/v1/generate`` bodies, streamed (SSE) or whole.

Each choice's text is the concatenation of the engine's text deltas, so the streamed chunks
always join to exactly the non-streamed text. ``logprobs`` follow the legacy completions form
(``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``); with ``echo`` the prompt comes
first, its first token scored ``null``, which is what lm-evaluation-harness ``local-completions``
reads for log-likelihood tasks (``echo=True, max_tokens=0|1, logprobs=1``).
Logprobs are natural logs of the model's own distribution (before penalties, logit_bias,
temperature, top-k and top-p).

    python -c "from serve.completions import sse; print(sse({'a': 1}))"
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from serve.batching import PromptScores, TokenOut
from serve.service import Service


def sse(payload: Any) -> str:
    """One server-sent event: ``data: <json>`` and a blank line (``[DONE]`` passed as the str)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


@dataclass
class _Choice:
    """What one choice accumulated."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[Optional[float]] = field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = field(default_factory=list)
    finish_reason: Optional[str] = None


def _top_dict(svc: Service, top: list[tuple[int, float]]) -> dict[str, float]:
    return {svc.token_text(t): lp for t, lp in top}


def _logprobs_block(tokens: list[str], lps: list, tops: list, offset0: int) -> dict[str, Any]:
    offsets, pos = [], offset0
    for tok in tokens:
        offsets.append(pos)
        pos += len(tok)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def _apply(svc: Service, choice: _Choice, event: Any, prompt_ids: list[int], want_lp: bool) -> tuple[str, dict]:
    """Fold one event into ``choice``; return (text delta, logprobs delta) for streaming."""
    if isinstance(event, PromptScores):
        toks = [svc.token_text(t) for t in prompt_ids]
        tops = [None] + [_top_dict(svc, t) for t in event.top[1:]]
        choice.tokens += toks
        choice.token_logprobs += event.logprobs
        choice.top_logprobs += tops
        return "", _logprobs_block(toks, event.logprobs, tops, 0)
    choice.text.append(event.text)
    lp_delta: dict = {}
    if event.token_id is not None:
        choice.token_ids.append(event.token_id)
        if want_lp:
            tok, top = svc.token_text(event.token_id), _top_dict(svc, event.top)
            choice.tokens.append(tok)
            choice.token_logprobs.append(event.logprob)
            choice.top_logprobs.append(top)
            lp_delta = _logprobs_block([tok], [event.logprob], [top], 0)
    if event.finish_reason:
        choice.finish_reason = "stop" if event.finish_reason == "stop" else "length"
    return event.text, lp_delta


def _usage(prompts: list[list[int]], choices: list[_Choice]) -> dict[str, int]:
    p = sum(len(ids) for ids in prompts)
    c = sum(len(ch.token_ids) for ch in choices)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


async def completion(svc: Service, events: AsyncIterator, prompts: list[list[int]], n: int, echo: bool,
                     want_lp: bool) -> dict[str, Any]:
    """The whole (non-streamed) ``text_completion`` object."""
    choices = [_Choice() for _ in range(len(prompts) * n)]
    async for index, event in events:
        _apply(svc, choices[index], event, prompts[index // n], want_lp)
    out = []
    for i, ch in enumerate(choices):
        text = "".join(ch.text)
        if echo:
            text = svc.decode(prompts[i // n]) + text
        lp = _logprobs_block(ch.tokens, ch.token_logprobs, ch.top_logprobs, 0) if want_lp else None
        out.append({"index": i, "text": text, "logprobs": lp, "finish_reason": ch.finish_reason})
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": svc.model_name, "choices": out, "usage": _usage(prompts, choices)}


async def completion_stream(svc: Service, events: AsyncIterator, prompts: list[list[int]], n: int, echo: bool,
                            want_lp: bool, include_usage: bool) -> AsyncIterator[str]:
    """SSE chunks of a ``text_completion`` stream, then ``data: [DONE]``."""
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    choices = [_Choice() for _ in range(len(prompts) * n)]

    def chunk(index: int, text: str, lp: Any, finish: Optional[str]) -> str:
        return sse({"id": cid, "object": "text_completion", "created": created, "model": svc.model_name,
                    "choices": [{"index": index, "text": text, "logprobs": lp, "finish_reason": finish}]})

    if echo:
        for i in range(len(choices)):
            if not want_lp:  # with logprobs the prompt comes with its scores (PromptScores event)
                yield chunk(i, svc.decode(prompts[i // n]), None, None)
    async with _closing(events):
        async for index, event in events:
            text, lp = _apply(svc, choices[index], event, prompts[index // n], want_lp)
            if isinstance(event, PromptScores):
                text = svc.decode(prompts[index // n])
            finish = choices[index].finish_reason if isinstance(event, TokenOut) and event.finish_reason else None
            if text or lp or finish:
                yield chunk(index, text, lp or None, finish)
    if include_usage:
        yield sse({"id": cid, "object": "text_completion", "created": created, "model": svc.model_name,
                   "choices": [], "usage": _usage(prompts, choices)})
    yield sse("[DONE]")


async def generate(svc: Service, events: AsyncIterator, prompt: list[int], want_lp: bool) -> dict[str, Any]:
    """The native ``/v1/generate`` body."""
    ch = _Choice()
    async for _, event in events:
        _apply(svc, ch, event, prompt, want_lp)
    return {"model": svc.model_name, "text": "".join(ch.text), "token_ids": ch.token_ids,
            "finish_reason": ch.finish_reason, "logprobs": ch.token_logprobs if want_lp else None,
            "usage": _usage([prompt], [ch])}


async def generate_stream(svc: Service, events: AsyncIterator, prompt: list[int], want_lp: bool
                          ) -> AsyncIterator[str]:
    """SSE events ``{"text", "token_id", "logprob", "finish_reason"}`` then ``data: [DONE]``."""
    ch = _Choice()
    async with _closing(events):
        async for _, event in events:
            text, _ = _apply(svc, ch, event, prompt, want_lp)
            if isinstance(event, TokenOut) and (text or event.token_id is not None or event.finish_reason):
                body = {"text": text, "token_id": event.token_id, "logprob": event.logprob if want_lp else None,
                        "finish_reason": ch.finish_reason if event.finish_reason else None}
                if event.finish_reason:
                    body["usage"] = _usage([prompt], [ch])
                yield sse(body)
    yield sse("[DONE]")


class _closing:
    """``async with`` that closes an async generator (cancelling its sequences) on any exit."""

    def __init__(self, agen: Any) -> None:
        self.agen = agen

    async def __aenter__(self) -> Any:
        return self.agen

    async def __aexit__(self, *exc: Any) -> None:
        await self.agen.aclose()
