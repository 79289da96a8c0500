"""OpenAI ``/v1/completions`` and native ``/v1/generate`` bodies, streamed (SSE) or whole.

Each choice's text is the concatenation of the engine's text deltas, so the streamed chunks
always join to exactly the non-streamed text. ``logprobs`` follow the legacy completions form
(``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``); with ``echo`` the prompt comes
first, its first token scored ``null``, which is what lm-evaluation-harness ``local-completions``
reads for log-likelihood tasks (``echo=True, max_tokens=0|1, logprobs=1``). ``text_offset`` indexes
the returned text (echo included, cumulative over a stream), ``tokens`` are the pieces of that text
(``bytes:\\xNN...`` for a token that is not whole UTF-8 characters, at the offset of the
character it starts in; a special token by its name, as ``top_logprobs`` names it, though it adds no
text), and tokens from a stop string on are left out
(serve/README.md). A text prompt is echoed in the tokenizer's normal form (NFC).
Logprobs are natural logs of the model's own distribution (before penalties, logit_bias,
temperature, top-k and top-p).

    python -c "from prodip.serve.completions import sse; print(sse({'a': 1}))"
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from typing_extensions import NotRequired, TypedDict

from prodip.serve.batching import PromptScores, TokenOut
from prodip.serve.service import EventStream, PieceWalk, Service, StreamEvent

#: what prodip.serve.service.Service.stream yields: ``(choice index, event)``
Events = EventStream
#: per prompt with echo: (echoed text, logprobs pieces, their offsets); None without echo
Echo = Optional[tuple[str, list[str], list[int]]]
#: the logprobs of some tokens: one value per token (None for a prompt's first token)
Logprobs = list[Optional[float]]
#: the alternatives of some tokens: ``{text: logprob}`` per token (None for a prompt's first token)
Tops = list[Optional[dict[str, float]]]


class LogprobsBlock(TypedDict):
    """The legacy completions ``logprobs`` object: one entry per token in each list."""

    tokens: list[str]
    token_logprobs: Logprobs
    top_logprobs: Sequence[Optional[dict[str, float]]]
    #: character offset of each token in the returned text
    text_offset: list[int]


class Usage(TypedDict):
    """A body's ``usage``: token counts."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(TypedDict):
    """One choice of a ``text_completion`` (whole, or one chunk of a stream)."""

    index: int
    text: str
    logprobs: Optional[LogprobsBlock]
    finish_reason: Optional[str]


class CompletionBody(TypedDict):
    """The whole ``text_completion`` object of ``/v1/completions``."""

    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class GenerateBody(TypedDict):
    """The native ``/v1/generate`` body (``logprobs``: of every generated token, or None)."""

    model: str
    text: str
    token_ids: list[int]
    finish_reason: Optional[str]
    logprobs: Optional[Logprobs]
    usage: Usage


class GenerateEvent(TypedDict):
    """One event of a ``/v1/generate`` stream (``usage`` with the last token only)."""

    text: str
    token_id: Optional[int]
    logprob: Optional[float]
    finish_reason: Optional[str]
    usage: NotRequired[Usage]


class ChatTopLogprob(TypedDict):
    """One alternative of a token in chat's ``logprobs.content``."""

    token: str
    logprob: float
    #: the UTF-8 bytes of ``token``
    bytes: list[int]


class ChatTokenLogprob(TypedDict):
    """One token of chat's ``logprobs.content``, with its ``top_logprobs`` alternatives."""

    token: str
    logprob: Optional[float]
    bytes: list[int]
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(TypedDict):
    """Chat's ``logprobs`` object (``refusal`` always null)."""

    content: list[ChatTokenLogprob]
    refusal: None


class ChatMessage(TypedDict):
    """The assistant message of a whole ``chat.completion`` choice."""

    role: str
    content: str
    refusal: None


class ChatChoice(TypedDict):
    """One choice of a whole ``chat.completion``."""

    index: int
    message: ChatMessage
    logprobs: Optional[ChatLogprobs]
    finish_reason: Optional[str]


class ChatDelta(TypedDict, total=False):
    """What a ``chat.completion.chunk`` choice adds: the role first, then content (empty at the end)."""

    role: str
    content: str


class ChatDeltaChoice(TypedDict):
    """One choice of a ``chat.completion.chunk``."""

    index: int
    delta: ChatDelta
    logprobs: Optional[ChatLogprobs]
    finish_reason: Optional[str]


class ChatCompletionBody(TypedDict):
    """The whole ``chat.completion`` object of ``/v1/chat/completions``."""

    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


#: ``json.dumps(obj, ensure_ascii=False)`` without making an encoder per call (json.dumps builds one whenever an
#: argument is not its default): 2.1 -> 1.5 us a chunk, made for every token of every stream on the event loop
_to_json = json.JSONEncoder(ensure_ascii=False).encode


def sse(payload: Any) -> str:
    """One server-sent event: ``data: <json>`` and a blank line (``[DONE]`` passed as the str)."""
    data = payload if isinstance(payload, str) else _to_json(payload)
    return f"data: {data}\n\n"


@dataclass
class _Choice:
    """What one choice accumulated.

    ``logprobs`` of generated tokens are released only once the text they start is returned:
    a token whose text is still held back (a possible stop string, an unfinished character) waits
    in ``pending``; when a stop string is found, the tokens starting at or after it are dropped.
    """

    base: int = 0  # characters before the completion in the returned text (the echoed prompt)
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    all_logprobs: list[Optional[float]] = field(default_factory=list)  # every generated token (/v1/generate)
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[Optional[float]] = field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)
    pending: list[tuple[str, Optional[float], dict[str, float], int]] = field(default_factory=list)
    walk: Optional[PieceWalk] = None  # pieces and offsets of the generated tokens, from their bytes
    returned: int = 0  # characters of completion text returned so far
    finish_reason: Optional[str] = None

    def add(self, tokens: list[str], lps: Logprobs, tops: Tops, offsets: list[int]) -> LogprobsBlock:
        self.tokens += tokens
        self.token_logprobs += lps
        self.top_logprobs += tops
        self.text_offset += offsets
        return _logprobs_block(tokens, lps, tops, offsets)

    def release(self, final: bool, cut: bool) -> LogprobsBlock:
        """Move the pending tokens whose text is returned into the logprobs (all of them at the
        end, unless a stop string cut the text); returns them as a logprobs block."""
        if final and not cut:
            n = len(self.pending)
        else:
            n = next((i for i, p in enumerate(self.pending) if p[3] >= self.returned), len(self.pending))
        out, self.pending = self.pending[:n], ([] if final else self.pending[n:])
        return self.add([p[0] for p in out], [p[1] for p in out], [p[2] for p in out], [self.base + p[3] for p in out])


def _top_dict(svc: Service, top: list[tuple[int, float]]) -> dict[str, float]:
    return {svc.token_text(t): lp for t, lp in top}


def _logprobs_block(
    tokens: list[str], lps: Logprobs, tops: Sequence[Optional[dict[str, float]]], offsets: list[int]
) -> LogprobsBlock:
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def _apply(
    svc: Service, choice: _Choice, event: StreamEvent, echo: Echo, want_lp: bool
) -> tuple[str, Optional[LogprobsBlock]]:
    """Fold one event into ``choice``; return (text delta, logprobs delta or None) for streaming."""
    if isinstance(event, PromptScores):
        assert echo is not None, "prompt logprobs are asked for only with echo (Service.sampling_params)"
        text, pieces, offsets = echo
        tops: Tops = [None] + [_top_dict(svc, t) for t in event.top[1:]]
        return text, choice.add(pieces, list(event.logprobs), tops, offsets)
    choice.text.append(event.text)
    choice.returned += len(event.text)
    if event.token_id is not None:
        choice.token_ids.append(event.token_id)
        choice.all_logprobs.append(event.logprob)
        if want_lp:
            assert choice.walk is not None, "a choice with logprobs has its piece walk (_choices)"
            piece, offset = choice.walk.add(event.token_id)
            choice.pending.append((piece, event.logprob, _top_dict(svc, event.top), offset))
    if event.finish_reason:
        choice.finish_reason = "stop" if event.finish_reason == "stop" else "length"
    lp = choice.release(bool(event.finish_reason), event.stop_string) if want_lp else None
    return event.text, lp


def _usage(prompts: list[list[int]], choices: list[_Choice]) -> Usage:
    p = sum(len(ids) for ids in prompts)
    c = sum(len(ch.token_ids) for ch in choices)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _echoes(svc: Service, prompts: list[list[int]], texts: Optional[list[Optional[str]]], echo: bool) -> list[Echo]:
    """Per prompt: (echoed text, logprobs pieces, offsets) with ``echo``, else None."""
    if not echo:
        return [None] * len(prompts)
    texts = texts or [None] * len(prompts)
    return [svc.echo(ids, raw) for ids, raw in zip(prompts, texts)]


def _choices(svc: Service, prompts: list[list[int]], n: int, echoes: list[Echo]) -> list[_Choice]:
    """One :class:`_Choice` per prompt x n, its offsets after the echoed prompt."""
    return [
        _Choice(base=_echoed(echoes[i // n]), walk=svc.piece_walk(prompts[i // n])) for i in range(len(prompts) * n)
    ]


def _echo_text(echo: Echo) -> str:
    """The echoed prompt text ("" without echo)."""
    return echo[0] if echo is not None else ""


def _echoed(echo: Echo) -> int:
    """Characters of the echoed prompt (0 without echo): where the completion's offsets start."""
    return len(_echo_text(echo))


async def completion(
    svc: Service,
    events: Events,
    prompts: list[list[int]],
    n: int,
    echo: bool,
    want_lp: bool,
    prompt_texts: Optional[list[Optional[str]]] = None,
) -> CompletionBody:
    """The whole (non-streamed) ``text_completion`` object.

    ``prompt_texts``: each prompt as sent when it was text (echoed verbatim), else None.
    """
    echoes = _echoes(svc, prompts, prompt_texts, echo)
    choices = _choices(svc, prompts, n, echoes)
    async for index, event in events:
        _apply(svc, choices[index], event, echoes[index // n], want_lp)
    out: list[CompletionChoice] = []
    for i, ch in enumerate(choices):
        text = _echo_text(echoes[i // n]) + "".join(ch.text)
        lp = _logprobs_block(ch.tokens, ch.token_logprobs, ch.top_logprobs, ch.text_offset) if want_lp else None
        out.append({"index": i, "text": text, "logprobs": lp, "finish_reason": ch.finish_reason})
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": svc.model_name,
        "choices": out,
        "usage": _usage(prompts, choices),
    }


async def completion_stream(
    svc: Service,
    events: Events,
    prompts: list[list[int]],
    n: int,
    echo: bool,
    want_lp: bool,
    include_usage: bool,
    prompt_texts: Optional[list[Optional[str]]] = None,
) -> AsyncGenerator[str, None]:
    """SSE chunks of a ``text_completion`` stream, then ``data: [DONE]``.

    ``text_offset`` counts from the start of the choice's text over the whole stream (the echoed
    prompt included), so the offsets of all chunks equal those of the non-streamed answer.
    """
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    echoes = _echoes(svc, prompts, prompt_texts, echo)
    choices = _choices(svc, prompts, n, echoes)

    def chunk(index: int, text: str, lp: Optional[LogprobsBlock], finish: Optional[str]) -> str:
        return sse(
            {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": svc.model_name,
                "choices": [{"index": index, "text": text, "logprobs": lp, "finish_reason": finish}],
            }
        )

    if echo:
        for i in range(len(choices)):
            if not want_lp:  # with logprobs the prompt comes with its scores (PromptScores event)
                yield chunk(i, _echo_text(echoes[i // n]), None, None)
    async with _closing(events):
        async for batch in events.batches():  # one string of the chunks of what arrived together
            out = []
            for index, event in batch:
                text, lp = _apply(svc, choices[index], event, echoes[index // n], want_lp)
                finish = choices[index].finish_reason if isinstance(event, TokenOut) and event.finish_reason else None
                if text or (lp and lp["tokens"]) or finish:
                    out.append(chunk(index, text, lp, finish))
            if out:
                yield "".join(out)
    if include_usage:
        yield sse(
            {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": svc.model_name,
                "choices": [],
                "usage": _usage(prompts, choices),
            }
        )
    yield sse("[DONE]")


async def generate(svc: Service, events: Events, prompt: list[int], want_lp: bool) -> GenerateBody:
    """The native ``/v1/generate`` body."""
    ch = _Choice()
    async for _, event in events:
        _apply(svc, ch, event, None, False)
    return {
        "model": svc.model_name,
        "text": "".join(ch.text),
        "token_ids": ch.token_ids,
        "finish_reason": ch.finish_reason,
        "logprobs": ch.all_logprobs if want_lp else None,
        "usage": _usage([prompt], [ch]),
    }


async def generate_stream(svc: Service, events: Events, prompt: list[int], want_lp: bool) -> AsyncGenerator[str, None]:
    """SSE events ``{"text", "token_id", "logprob", "finish_reason"}`` then ``data: [DONE]``."""
    ch = _Choice()
    async with _closing(events):
        async for batch in events.batches():  # one string of the events of what arrived together
            out = []
            for _, event in batch:
                text, _ = _apply(svc, ch, event, None, False)
                if isinstance(event, TokenOut) and (text or event.token_id is not None or event.finish_reason):
                    body: GenerateEvent = {
                        "text": text,
                        "token_id": event.token_id,
                        "logprob": event.logprob if want_lp else None,
                        "finish_reason": ch.finish_reason if event.finish_reason else None,
                    }
                    if event.finish_reason:
                        body["usage"] = _usage([prompt], [ch])
                    out.append(sse(body))
            if out:
                yield "".join(out)
    yield sse("[DONE]")


class _closing:
    """``async with`` that closes a request's events (cancelling its sequences) on any exit."""

    def __init__(self, agen: Events) -> None:
        self.agen = agen

    async def __aenter__(self) -> Events:
        return self.agen

    async def __aexit__(self, *exc: object) -> None:
        await self.agen.aclose()


# ---- /v1/chat/completions ----------------------------------------------------------------------
# The same choices, events and stop handling as /v1/completions (``_Choice``, ``_apply``); only the
# shapes differ: ``message`` / ``delta`` instead of ``text``, and logprobs as ``content`` entries.


def _piece_bytes(piece: str) -> list[int]:
    """The UTF-8 bytes of a logprobs piece (``bytes:\\xe0\\xa6`` -> [224, 166])."""
    if piece.startswith("bytes:"):
        return list(piece[len("bytes:") :].encode("latin-1").decode("unicode_escape").encode("latin-1"))
    return list(piece.encode("utf-8"))


def chat_logprobs(block: LogprobsBlock) -> ChatLogprobs:
    """A legacy logprobs block (``tokens``, ``token_logprobs``, ``top_logprobs``) in the chat shape:
    ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}``."""
    return {
        "content": [
            {
                "token": tok,
                "logprob": lp,
                "bytes": _piece_bytes(tok),
                "top_logprobs": [{"token": t, "logprob": v, "bytes": _piece_bytes(t)} for t, v in (top or {}).items()],
            }
            for tok, lp, top in zip(block["tokens"], block["token_logprobs"], block["top_logprobs"])
        ],
        "refusal": None,
    }


async def chat_completion(
    svc: Service, events: Events, prompt: list[int], n: int, want_lp: bool, top: int
) -> ChatCompletionBody:
    """The whole (non-streamed) ``chat.completion`` object; ``top``: top_logprobs per token."""
    choices = _choices(svc, [prompt], n, [None])
    async for index, event in events:
        _apply(svc, choices[index], event, None, want_lp)
    out: list[ChatChoice] = []
    for i, ch in enumerate(choices):
        lp = None
        if want_lp:
            lp = chat_logprobs(_logprobs_block(ch.tokens, ch.token_logprobs, _cut(ch.top_logprobs, top), []))
        out.append(
            {
                "index": i,
                "message": {"role": "assistant", "content": "".join(ch.text), "refusal": None},
                "logprobs": lp,
                "finish_reason": ch.finish_reason,
            }
        )
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": svc.model_name,
        "choices": out,
        "usage": _usage([prompt], choices),
    }


def _cut(tops: Sequence[Optional[dict[str, float]]], top: int) -> list[dict[str, float]]:
    """The ``top`` most likely alternatives of each token (the engine adds the chosen token to its
    top-n when it is not among them; chat's ``top_logprobs`` is exactly n entries, 0 = none)."""
    return [dict(sorted((t or {}).items(), key=lambda kv: -kv[1])[:top]) for t in tops]


async def chat_completion_stream(
    svc: Service, events: Events, prompt: list[int], n: int, want_lp: bool, top: int, include_usage: bool
) -> AsyncGenerator[str, None]:
    """SSE ``chat.completion.chunk`` events: per choice a first ``delta: {"role": "assistant"}``,
    then text deltas (with their logprobs), then an empty delta with the finish reason; with
    ``include_usage`` a last chunk with ``choices: []`` and ``usage``; then ``data: [DONE]``."""
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    choices = _choices(svc, [prompt], n, [None])

    def chunk(body_choices: list[ChatDeltaChoice], usage: Optional[Usage] = None) -> str:
        return sse(
            {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": svc.model_name,
                "choices": body_choices,
                **({"usage": usage} if usage is not None else {}),
            }
        )

    for i in range(len(choices)):
        yield chunk(
            [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
        )
    async with _closing(events):
        async for batch in events.batches():  # one string of the chunks of what arrived together
            out = []
            for index, event in batch:
                text, lp = _apply(svc, choices[index], event, None, want_lp)
                finish = choices[index].finish_reason if isinstance(event, TokenOut) and event.finish_reason else None
                has_lp = lp is not None and bool(lp["tokens"])
                if text or has_lp:
                    lp_out = (
                        chat_logprobs({**lp, "top_logprobs": _cut(lp["top_logprobs"], top)})
                        if lp is not None and has_lp
                        else None
                    )
                    delta: ChatDeltaChoice = {
                        "index": index,
                        "delta": {"content": text},
                        "logprobs": lp_out,
                        "finish_reason": None,
                    }
                    out.append(chunk([delta]))
                if finish:
                    out.append(chunk([{"index": index, "delta": {}, "logprobs": None, "finish_reason": finish}]))
            if out:
                yield "".join(out)
    if include_usage:
        yield chunk([], usage=_usage([prompt], choices))
    yield sse("[DONE]")
