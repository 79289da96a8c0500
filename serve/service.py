"""The model behind the routes: loads the export, validates requests, streams engine events.

:class:`Service` owns the tokenizer, the ONNX decoder and the :class:`~serve.batching.BatchScheduler`
thread. Routes call :meth:`Service.prompt_ids` and :meth:`Service.sampling_params` (request -> token
ids + :class:`SamplingParams`, or an :class:`APIError`) and iterate :meth:`Service.stream` (engine
events, on the event loop; leaving the iteration early cancels the sequences, so a disconnected
client stops its generation).

    python -c "from prodip.serve.service import APIError; print(APIError(400, 'bad').body)"
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Mapping
from collections.abc import Sequence as Seq
from functools import lru_cache
from typing import Any, Optional, Union

from tokenizers import Tokenizer

from prodip.base.chat import CHAT_TEMPLATE, MessageError, render, template_variables_of
from prodip.base.files import read_json_or_none
from prodip.base.jsontypes import JSONObject, integer
from prodip.serve.batching import BatchScheduler, PromptScores, SamplingParams, Sequence, TokenOut
from prodip.serve.config import ServeConfig
from prodip.serve.engine import ExportInfo, load_tokenizer, open_decoder
from prodip.serve.memory import use_huge_pages
from prodip.serve.metrics import ServeMetrics
from prodip.serve.schemas import SamplingRequest, error_body
from prodip.serve.text import composition_sets

log = logging.getLogger(__name__)
#: what a sequence emits: a generated token, or (once, first) the prompt's logprobs
StreamEvent = Union[TokenOut, PromptScores]
#: the one answer to a token-id prompt without ids, whatever the route and nesting
EMPTY_PROMPT = 'prompt has no token ids; send at least one id, or the text "" to start at the document start'
#: most sequences (prompts x n) one request may start.
MAX_SEQUENCES_PER_REQUEST = 256
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # a byte-fallback token's vocabulary form


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-unicode map inverted: the character a byte-level BPE vocabulary writes for
    each byte -> that byte (HF ``tokenizers`` ``ByteLevel``)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_LEVEL = _byte_level_alphabet()


def bytes_piece(raw: bytes) -> str:
    """OpenAI's name for a token that is not whole UTF-8 characters: ``bytes:\\xe0\\xa6``."""
    return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _is_byte_level(tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer's decoder is (or contains) HF ``ByteLevel``: its vocabulary then
    writes bytes in GPT-2's byte-to-unicode alphabet."""
    decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
    steps = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    return any((d or {}).get("type") == "ByteLevel" for d in steps)


class APIError(Exception):
    """An error answered in OpenAI's form with HTTP ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: Optional[str] = None,
        code: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, type_, param, code)


class Service:
    """Everything a request needs; :meth:`load` runs once, off the event loop.

    Args:
        info: the checked export (``prodip.serve.engine.load_export``).
        config: server settings.
        metrics: where counters go.
    """

    def __init__(self, info: ExportInfo, config: ServeConfig, metrics: ServeMetrics) -> None:
        self.info = info
        self.config = config
        self.metrics = metrics
        self.model_name = config.model_name or info.export_dir.resolve().name
        self.tokenizer: Tokenizer  # set by load(); every request checks require_ready() first
        self.scheduler: Optional[BatchScheduler] = None
        self.ready = threading.Event()
        self.load_error: Optional[str] = None
        self.created = int(time.time())
        self.eos_id = info.config.eos_token_id
        self.bos_id = info.config.bos_token_id
        self.pad_id = info.config.pad_token_id
        self.vocab_size = info.config.vocab_size
        #: the export's tokenizer_config.json ({} if absent): add_bos_token, chat_template, ...
        self.tokenizer_config: JSONObject = (
            read_json_or_none(info.tokenizer_path.parent / "tokenizer_config.json") or {}
        )
        self.adds_bos = False
        self._byte_level = False  # tokenizer.json's decoder is ByteLevel (set by load)
        self.document_start: list[int] = [self.eos_id]
        gen = read_json_or_none(info.export_dir / "generation_config.json") or {}
        eos = gen.get("eos_token_id", self.eos_id)
        #: ids that end generation: generation_config.json's eos_token_id (a chat model's lists its
        #: end of turn <|im_end|> beside <|eos|>), and config.json's eos_token_id
        where = f"{info.export_dir / 'generation_config.json'} eos_token_id"
        self.stop_ids = frozenset(
            {self.eos_id, *(integer(e, where=where) for e in (eos if isinstance(eos, list) else [eos]))}
        )
        #: the export's chat template (tokenizer_config.json ``chat_template``), None for a base model
        template = self.tokenizer_config.get("chat_template")
        self.chat_template: Optional[str] = template if isinstance(template, str) and template else None
        #: the special-token strings an imported model's own template reads (bos_token, eos_token, ...)
        self.template_variables = template_variables_of(self.tokenizer_config)
        #: one per event loop that streams (the engine thread flushes them all at each step)
        self._posters: list[LoopPoster] = []
        self._posters_lock = threading.Lock()
        self._wake = threading.Event()
        self._waker = threading.Thread(target=self._wake_loops, name="prodip-loop-waker", daemon=True)
        self._stopping = False

    # ---- lifecycle ------------------------------------------------------------------------
    def load(self) -> None:
        """Load tokenizer and ONNX session, start the engine thread; errors go to ``load_error``."""
        try:
            self.tokenizer = load_tokenizer(self.info)
            decoder = open_decoder(
                self.info, self.config.intra_op_threads, self.config.shared_kv_buffer, self.config.intra_op_spinning
            )
            if self.config.huge_pages:  # the weights are in memory now (prepacked at the session's creation)
                log.info("%s", use_huge_pages())
            self.scheduler = BatchScheduler(
                decoder,
                self.config.max_batch_size,
                self.config.batch_wait_ms,
                self.metrics.set_queue,
                self.metrics.batch_rows.observe,
                self._flush_events,
                self.config.stream_interval_ms,
            )
            self._waker.start()
            self.scheduler.start()
            self._token_text = lru_cache(maxsize=65536)(self._token_text_uncached)
            self._special_ids = frozenset(
                i for i, tok in self.tokenizer.get_added_tokens_decoder().items() if tok.special
            )
            self.document_start, self.adds_bos = self._document_start()
            self._byte_level = _is_byte_level(self.tokenizer)
            composition_sets()  # stop-string matching's Unicode tables, built once here (serve.text)
            self.ready.set()
            log.info("serving %s variant %s from %s", self.model_name, self.info.variant, self.info.onnx_path)
        except Exception as err:  # reported by /health; the process stays up to say why
            log.exception("loading the export failed")
            self.load_error = f"{type(err).__name__}: {err}"

    def shutdown(self) -> None:
        """Stop the engine thread; running sequences end with finish_reason "cancelled"."""
        if self.scheduler is not None:
            self.scheduler.shutdown()
        self._stopping = True  # after the engine's last events: the waker flushes them, then ends
        self._wake.set()

    def require_ready(self) -> None:
        """Raises: APIError 503 while the model is loading or after a failed load."""
        if not self.ready.is_set():
            raise APIError(
                503,
                self.load_error or "the model is still loading; retry shortly",
                "service_unavailable",
                code="model_not_ready",
            )

    def _document_start(self) -> tuple[list[int], bool]:
        """The ids a document starts with, as the training shards have them, and whether the
        tokenizer adds them itself.

        1. What the tokenizer's post-processor adds to an empty text (the ``<|bos|>`` convention:
           shards hold ``<|bos|> ids <|eos|>``, tokenizer.json prepends ``<|bos|>``);
        2. else, ``tokenizer_config.json`` ``add_bos_token: true``: its ``bos_token``;
        3. else ``[eos_token_id]`` (generation_config.json, else config.json): the older convention,
           documents separated by ``<|eos|>`` and no ``<|bos|>`` (GPT-2 starts from ``<|endoftext|>``).
        """
        added = self.tokenizer.encode("", add_special_tokens=True).ids
        if added:
            return list(added), True
        cfg = self.tokenizer_config
        bos = cfg.get("bos_token")
        bos = bos.get("content") if isinstance(bos, dict) else bos
        bos_id = self.tokenizer.token_to_id(bos) if isinstance(bos, str) else None
        if cfg.get("add_bos_token") and bos_id is not None:
            return [bos_id], False
        gen = read_json_or_none(self.info.export_dir / "generation_config.json") or {}
        eos = gen.get("eos_token_id", self.eos_id)
        where = f"{self.info.export_dir / 'generation_config.json'} eos_token_id"
        return [integer(eos[0] if isinstance(eos, list) else eos, where=where)], False

    # ---- text helpers -----------------------------------------------------------------------
    def normalize(self, text: str) -> str:
        """``text`` in the tokenizer's normal form (its normaliser: NFC for prodip's; none leaves it
        as written), the form a prompt is tokenised in (serve/README.md "Text normalisation"). Stop
        strings do not go through it: they are matched in NFC whatever the tokenizer
        (:class:`~serve.text.StopMatcher`)."""
        norm = self.tokenizer.normalizer
        return norm.normalize_str(text) if norm is not None else text

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. Through ``encode_batch``, which releases the GIL while the Rust
        tokenizer works (``encode`` holds it: 0.3-0.6 s for 900 KB of Bangla, during which no other
        Python thread, the event loop included, runs); the ids are the same, the cost ~3 us more."""
        return self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: Seq[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (``decode_batch``: the GIL released, as in :meth:`encode`)."""
        return self.tokenizer.decode_batch([list(ids)], skip_special_tokens=skip_special_tokens)[0]

    def token_bytes(self, token_id: int) -> Optional[bytes]:
        """The bytes one token adds to the text, or None for a special token or an id the
        tokenizer lacks (they add no text). A byte-level BPE token may be part of a UTF-8
        character (a Bangla letter is 3 bytes), so this is bytes, not text."""
        if token_id in self._special_ids:
            return None
        form = self.tokenizer.id_to_token(token_id)
        if form is None:
            return None
        if self._byte_level and all(c in _BYTE_LEVEL for c in form):
            return bytes(_BYTE_LEVEL[c] for c in form)
        byte = _BYTE_TOKEN.fullmatch(form)
        if byte:
            return bytes([int(byte.group(1), 16)])
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode()

    def _token_text_uncached(self, token_id: int) -> str:
        raw = self.token_bytes(token_id)
        if raw is None:  # a special token keeps its name; an id the tokenizer lacks gets one
            return self.tokenizer.id_to_token(token_id) or f"<|id_{token_id}|>"
        try:
            return raw.decode("utf-8") or (self.tokenizer.id_to_token(token_id) or "")
        except UnicodeDecodeError:
            return bytes_piece(raw)

    def token_text(self, token_id: int) -> str:
        """How one token is named in ``logprobs.top_logprobs``: its own decode, OpenAI's
        ``bytes:\\xe0\\xa6`` for a token that is not whole UTF-8 characters, ``<|eos|>`` for a
        special token."""
        return self._token_text(token_id)

    def token_piece(self, token_id: int) -> str:
        """How one token is shown in ``logprobs.tokens``: the text it adds when that is whole UTF-8
        characters, else ``bytes:\\xNN...``; a special token or an id the tokenizer lacks by its name, as
        :meth:`token_text` names it in ``top_logprobs`` (``<|im_end|>``), though it adds no text."""
        return PieceWalk(self).add(token_id)[0]

    def piece_walk(self, context_ids: Seq[int] = ()) -> PieceWalk:
        """A :class:`PieceWalk` for tokens that follow ``context_ids`` (a prompt: if it ends inside
        a UTF-8 character, the generated text starts with that whole character)."""
        walk = PieceWalk(self)
        for t in list(context_ids)[-8:]:  # enough for an unfinished character at the end
            walk.add(t)
        walk.restart()
        return walk

    def echo(self, ids: list[int], raw: Optional[str]) -> tuple[str, list[str], list[int]]:
        """The echoed prompt and its ``logprobs`` pieces and character offsets into it.

        The text is the decode of the prompt's tokens: for a text prompt, what the model saw, in the
        tokenizer's normal form (NFC; the one normalisation rule, serve/README.md). Special-token
        text typed in a text prompt (``"<|eos|>"``) is echoed as typed (its piece is that text);
        a special token the tokenizer added (``<|bos|>``) is not in the text and its piece is its name. Each token's piece is the
        text it adds, or ``bytes:\\xNN...`` when that is not whole UTF-8 characters (at the offset
        of the character it starts in), so ``text[offset[i]:]`` starts with every other piece.
        """
        typed: dict[int, str] = {}
        if raw is not None:
            # encoded as prompt_ids encodes it, from the text as sent: the tokenizer normalises it once and its
            # offsets point into the text as sent (normalising first would apply a normaliser twice, and one
            # that is not idempotent, Llama 2's Prepend("▁"), then gives other ids); prompt_ids may have put
            # the document start before them (add_bos_token without a post-processor that adds it)
            enc = self.tokenizer.encode(raw)
            lead = len(ids) - len(enc.ids)
            if lead >= 0 and list(ids[lead:]) == enc.ids:
                typed = {
                    lead + i: raw[a:b]
                    for i, (t, (a, b)) in enumerate(zip(enc.ids, enc.offsets))
                    if t in self._special_ids and 0 <= a < b <= len(raw)
                }
        walk = PieceWalk(self)
        pieces, offsets = [], []
        for i, t in enumerate(ids):
            piece, offset = walk.add(t, typed.get(i))
            pieces.append(piece)
            offsets.append(offset)
        return walk.text(), pieces, offsets

    # ---- request checks ---------------------------------------------------------------------
    def check_model(self, model: Optional[str]) -> None:
        """Raises: APIError 404 for a model id that is not this server's."""
        if model and model != self.model_name:
            raise APIError(
                404,
                f"model {model!r} does not exist; this server serves {self.model_name!r} (GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    def prompt_ids(self, prompt: Union[str, list[str], list[int], list[list[int]]]) -> list[list[int]]:
        """Token ids of each prompt. A text prompt is encoded with the tokenizer's special tokens
        (its post-processor prepends ``<|bos|>`` where the export's tokenizer does). An empty prompt
        becomes the document start (:meth:`_document_start`: ``[<|bos|>]`` under the BOS
        convention, ``[<|eos|>]`` under the older one). Special-token text typed in a prompt
        (``"<|eos|>"``) is encoded as that control token, as vLLM and HF tokenizers do. A token-id
        prompt with no ids (``[]``, ``[[]]``, ``[[5], []]``; on every route) is a 400, as in vLLM: the
        ids are taken as sent, so there is nothing to continue.

        Raises:
            APIError 400: an empty prompt list, a token-id prompt without ids, or a token id outside
                [0, vocab_size).
        """
        prompts = self._prompt_list(prompt)
        if not prompts or any(not isinstance(p, str) and not p for p in prompts):
            raise APIError(400, EMPTY_PROMPT, param="prompt")
        out = []
        for p in prompts:
            ids = self.encode(p) if isinstance(p, str) else list(p)
            if isinstance(p, str) and ids and not self.adds_bos and self.tokenizer_config.get("add_bos_token"):
                ids = self.document_start + ids  # add_bos_token without a post-processor that adds it
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise APIError(
                    400, f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})", param="prompt"
                )
            out.append(ids or list(self.document_start))
        return out

    @staticmethod
    def _prompt_list(prompt: Any) -> list[Any]:
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [prompt]
        return list(prompt)

    def prompt_texts(self, prompt: Any) -> list[Optional[str]]:
        """Each prompt as sent when it is text (for echo), ``None`` for a token-id prompt."""
        return [p if isinstance(p, str) else None for p in self._prompt_list(prompt)]

    def require_chat(self) -> None:
        """Raises: APIError 400 ``chat_not_supported`` when the export has no chat template (a base
        model) or, for a prodip tokenizer, one other than the chat contract's (an imported model's
        own template is served as it is; read from tokenizer_config.json at start, so
        answered while the model loads too)."""
        if not self.chat_template:
            raise APIError(
                400,
                "/v1/chat/completions is not served: this model has no chat template (a base language model). "
                "Send text to POST /v1/completions with a prompt instead",
                param="messages",
                code="chat_not_supported",
            )
        if self.chat_template != CHAT_TEMPLATE and "format_version" in self.tokenizer_config:
            raise APIError(
                400,
                "this export's chat_template (tokenizer_config.json) is not prodip's chat contract "
                "(prodip.base.chat.CHAT_TEMPLATE); re-export the model with `prodip export`",
                param="messages",
                code="chat_not_supported",
            )

    def chat_prompt(self, req: Any) -> list[int]:
        """The prompt ids of a chat request (or of ``/tokenize`` with ``messages``): its ``messages`` rendered
        with the chat contract's template (``prodip.base.chat.render``, jinja2's sandbox) and encoded without
        added special tokens (the template writes ``<|bos|>``; ``/tokenize`` may ask for them). Text is
        normalised by the tokenizer (NFC), as /v1/completions'. vLLM's extras: ``add_generation_prompt``
        (default true), ``continue_final_message`` (the prompt ends inside the final message, so the reply
        continues it), ``chat_template_kwargs`` (more template variables; prodip's own template reads none).

        ``req`` is a :class:`~prodip.serve.schemas.ChatCompletionRequest`, whose validators refused what a
        request alone may not hold (tool fields, non-text parts, other message fields) and joined text parts.

        Raises:
            APIError 400: the export has no chat template (a base model: code ``chat_not_supported``); a
                message breaking a rule of every chat message (:func:`prodip.base.chat.check_message`, the
                one ``prodip sft`` applies to its records): a role outside system/user/assistant (code
                ``unsupported_content``), a content holding a special token's text, such as ``<|im_end|>``
                (code ``special_token_in_content``: it would forge a turn); ``continue_final_message`` with
                ``add_generation_prompt``, ``chat_template_kwargs`` naming ``messages`` or either flag.
        """
        self.require_chat()
        kwargs = _template_kwargs(req)
        specials = [self.tokenizer.id_to_token(i) for i in sorted(self._special_ids)]
        messages = [{"role": m.role, "content": m.content} for m in req.messages]
        own = None if self.chat_template == CHAT_TEMPLATE else self.chat_template  # an imported model's
        variables = {**(self.template_variables if own else {}), **kwargs}
        try:
            if req.continue_final_message:
                text = _continue_final(messages, own, variables, specials)
            else:
                text = render(
                    messages,
                    add_generation_prompt=req.add_generation_prompt,
                    template=own,
                    variables=variables,
                    specials=specials,
                )
        except MessageError as err:
            raise APIError(400, str(err), param=err.param, code=err.code) from None
        ids = self.encode(text, add_special_tokens=bool(getattr(req, "add_special_tokens", None)))
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:  # pragma: no cover (a tokenizer larger than the model: refused by export)
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})", param="messages")
        return ids

    def sampling_params(
        self,
        req: SamplingRequest,
        max_new_tokens: int,
        prompts: list[list[int]],
        n: int = 1,
        logprobs: Optional[int] = None,
        echo: bool = False,
        max_tokens_field: str = "max_tokens",
    ) -> SamplingParams:
        """Check limits that need the model, then build :class:`SamplingParams`.

        ``req`` is a :class:`~serve.schemas.CompletionRequest` or :class:`~serve.schemas.GenerateRequest`
        (ranges and the form of ``logit_bias`` already checked there); ``presence_penalty``,
        ``frequency_penalty`` and ``logit_bias`` (string keys -> int ids) pass to the sequences.

        ``max_tokens_field`` names the request's field for the tokens to generate in errors
        (``max_tokens``; ``max_new_tokens`` for /v1/generate).

        Raises:
            APIError 400: prompt + max tokens beyond the context window (both numbers named; param
                ``prompt`` when the prompt alone leaves no room, else the max tokens field), too many
                sequences (param ``n``, or ``prompt`` for too many prompts at n = 1), bad stop
                strings, a ``logit_bias`` id outside [0, vocab_size).
        """
        limit = self.info.max_model_len
        for ids in prompts:
            if len(ids) + max_new_tokens > limit:
                raise APIError(
                    400,
                    f"this model's context window is {limit} tokens, but the request asks for "
                    f"{len(ids) + max_new_tokens} tokens ({len(ids)} prompt tokens + "
                    f"{max_new_tokens} max tokens); shorten the prompt or lower {max_tokens_field}",
                    param="prompt" if len(ids) >= limit else max_tokens_field,
                    code="context_length_exceeded",
                )
        if n > self.config.max_n or len(prompts) * n > MAX_SEQUENCES_PER_REQUEST:
            raise APIError(
                400,
                f"n={n} x {len(prompts)} prompts exceeds the limit (n <= {self.config.max_n}, "
                f"n x prompts <= {MAX_SEQUENCES_PER_REQUEST})",
                param="n" if n > 1 else "prompt",
            )
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stop) > 16 or any(not s for s in stop):
            raise APIError(400, "stop must be at most 16 non-empty strings", param="stop")
        outside = [int(key) for key in (req.logit_bias or {}) if int(key) >= self.vocab_size]
        if outside:
            raise APIError(
                400,
                f"logit_bias token id {outside[0]} is outside the vocabulary [0, {self.vocab_size})",
                param="logit_bias",
                code="invalid_value",
            )
        return req.to_sampling_params(max_new_tokens, logprobs, echo and logprobs is not None, stop)

    # ---- generation -------------------------------------------------------------------------
    def stream(self, prompts: list[list[int]], params: SamplingParams, n: int = 1) -> EventStream:
        """Run ``n`` sequences per prompt as one batch of arrivals; iterate ``(choice_index, event)``.

        Choice ``index = prompt_index * n + j``. Every sequence ends with a :class:`TokenOut`
        whose ``finish_reason`` is set. Closing the iterator early cancels all its sequences. The
        sequences are submitted at the first iteration. :meth:`EventStream.batches` gives the events as
        they arrive, several at a time.
        """
        queue: asyncio.Queue[tuple[int, StreamEvent]] = asyncio.Queue()
        return EventStream(self._events(queue, prompts, params, n), queue)

    async def _events(
        self, queue: asyncio.Queue[tuple[int, StreamEvent]], prompts: list[list[int]], params: SamplingParams, n: int
    ) -> AsyncGenerator[list[tuple[int, StreamEvent]], None]:
        """:meth:`stream`'s events, through ``queue``, as lists of those that arrived together: the loop's
        Python for a hand-over runs while the model does, on its cores (at 2 threads on 2 cores each
        hand-over cost the engine ~1.7 ms, most of it the ~0.5 ms of the loop's Python per hand-over
        stealing a core: bench/results/serve_engine_2026-12-02.md), and an event taken and passed on alone
        costs an await and an async generator step at every layer."""
        self.require_ready()
        poster = self._poster(asyncio.get_running_loop())
        post, every_step = poster.post_later, self.config.stream_interval_ms == 0

        def emitter(index: int) -> Callable[[StreamEvent], None]:
            started = False

            def emit(event: StreamEvent) -> None:  # engine thread
                # a sequence's first token, its end and prompt scores go out at the engine's next step (it has
                # the loop woken: Service._flush_events); the tokens between them, which the scheduler emits
                # every stream_interval_ms, when the loop polls (LoopPoster.watch)
                nonlocal started
                if isinstance(event, TokenOut):
                    urgent = every_step or not started or event.finish_reason is not None
                    started = True
                else:
                    urgent = True
                post(queue, (index, event), urgent)

            return emit

        seqs = [
            Sequence(ids, params, self.tokenizer, emitter(p * n + j), self.stop_ids, stream_index=j)
            for p, ids in enumerate(prompts)
            for j in range(n)
        ]
        self.metrics.prompt_tokens.inc(sum(len(ids) for ids in prompts) * n)
        first_token_s: dict[int, float] = {}
        counts = [0] * len(seqs)
        start = time.perf_counter()
        assert self.scheduler is not None  # load() starts it before require_ready() passes
        try:
            self.scheduler.submit(seqs)
        except RuntimeError as err:
            raise APIError(503, str(err), "service_unavailable") from None
        remaining = len(seqs)
        poster.watch()
        try:
            while remaining:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                now, tokens = time.perf_counter(), 0
                for i, (index, event) in enumerate(batch):
                    if not isinstance(event, TokenOut):
                        continue
                    if event.token_id is not None:
                        counts[index] += 1
                        tokens += 1
                        if index not in first_token_s:
                            first_token_s[index] = now
                            self.metrics.time_to_first_token.observe(now - start)
                    if event.finish_reason:
                        remaining -= 1
                        self.metrics.request_latency.observe(now - start)
                        if counts[index] > 1:
                            self.metrics.tokens_per_second.observe(
                                (counts[index] - 1) / max(now - first_token_s[index], 1e-9)
                            )
                        if event.finish_reason == "error":
                            self.metrics.generated_tokens.inc(tokens)
                            if i:
                                yield batch[:i]  # what came before the error goes out first
                            raise APIError(500, f"generation failed: {event.error}", "server_error")
                self.metrics.generated_tokens.inc(tokens)
                yield batch
        finally:
            poster.unwatch()
            for seq in seqs:
                seq.cancel()

    def _poster(self, loop: asyncio.AbstractEventLoop) -> LoopPoster:
        """The :class:`LoopPoster` of ``loop`` (made on first use; those of closed loops dropped)."""
        with self._posters_lock:
            poster = next((p for p in self._posters if p.loop is loop), None)
            if poster is None:
                poster = LoopPoster(loop, self.config.stream_interval_ms / 1000.0)
                self._posters = [p for p in self._posters if not p.loop.is_closed()] + [poster]
            return poster

    def _flush_events(self, idle: bool = False) -> None:
        """The engine's ``on_step`` (engine thread, after each step, before an ONNX Runtime call or a
        wait): have the events that must not wait (a sequence's first token, its end: :attr:`LoopPoster.urgent`)
        delivered, with everything emitted before them, and all of them when the engine is about to wait
        (``idle``), through the waker thread (:meth:`_wake_loops`), so the engine thread makes no system call
        for it: a write to a loop's self-pipe releases the GIL, the woken loop takes it, and the engine thread
        waited for it before its next ONNX Runtime call (bench/results/serve_profile_2026-12-01.md).

        The tokens in between are not the engine's business: the loop takes them when it polls
        (:meth:`LoopPoster.watch`, every ``stream_interval_ms``). Waking it from here cost the engine ~0.1 ms
        per hand-over for the wake alone, and the waker's and loop's Python in the middle of the next run
        (bench/results/serve_engine_2026-12-02.md); a hand-over per token cost 10-15 % of the decode speed
        of one stream at 2 threads on 2 cores (bench/results/serve_engine_2026-12-01.md)."""
        posters = self._posters  # a list replaced, never changed in place: safe unlocked
        if not any(p.urgent or (idle and p.fresh) for p in posters):
            return
        for poster in posters:
            poster.urgent = poster.fresh = False  # set and cleared on the engine thread only
        self._wake.set()

    def _wake_loops(self) -> None:
        """The waker thread: flush every loop's poster each time the engine asks (:meth:`_flush_events`)."""
        while not self._stopping:
            self._wake.wait()
            self._wake.clear()  # before flushing: a request from here on is seen next round
            for poster in self._posters:
                poster.flush()


class EventStream:
    """One request's events, ``(choice index, event)``, as the engine hands them over (an async iterator;
    :meth:`aclose` cancels its sequences: :meth:`Service.stream`).

    :meth:`batches` gives them as they arrive, several at a time (a stream writer makes one chunk of each:
    serve/completions.py); iterating gives them one by one; a stream is read one way or the other.
    :meth:`ready` says whether the next event is here already, so that iterating would not wait: a stream
    writer joins what is ready into one write (serve/routes.py), since the engine hands a stream's tokens
    over several at a time (``stream_interval_ms``) and each socket write wakes the client.
    """

    def __init__(
        self,
        batches: AsyncGenerator[list[tuple[int, StreamEvent]], None],
        queue: asyncio.Queue[tuple[int, StreamEvent]],
    ) -> None:
        self._batches = batches
        self._queue = queue
        self._taken: deque[tuple[int, StreamEvent]] = deque()  # of the last batch, not iterated yet

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> tuple[int, StreamEvent]:
        while not self._taken:
            self._taken.extend(await self._batches.__anext__())
        return self._taken.popleft()

    def batches(self) -> AsyncGenerator[list[tuple[int, StreamEvent]], None]:
        """The events as lists of those that arrived together, in order."""
        return self._batches

    async def aclose(self) -> None:
        await self._batches.aclose()

    def ready(self) -> bool:
        """Whether an event has arrived that iterating has not taken yet."""
        return bool(self._taken) or not self._queue.empty()


class LoopPoster:
    """Hands items from the engine thread to asyncio queues of one event loop, in batches.

    :meth:`post` (any thread) appends to an outbox; the first post after a delivery schedules one
    callback on the loop (``call_soon_threadsafe``: a write to the loop's self-pipe), which puts
    everything posted until then on its queue. So the loop wakes once per engine step however many
    tokens the step made (not once per token: bench/results/serve_speed_2026-12-01.md).
    :meth:`post_later` only appends; :meth:`flush` schedules the delivery (serve's engine has it called
    after an engine step that emitted an urgent item: :meth:`Service._flush_events`), and while streams
    run on the loop (:meth:`watch`) the loop takes the outbox itself every ``interval_s``, woken by its own
    timer rather than by the engine.

    Args:
        loop: the event loop whose queues the items go to.
        interval_s: how often the loop polls while :meth:`watch` counts a stream (seconds; 0: it does not
            poll, every item must be flushed).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float = 0.0) -> None:
        self.loop = loop
        self.interval_s = interval_s
        self._outbox: deque[tuple[asyncio.Queue[Any], Any]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False  # a _deliver is due and has not started draining
        #: items were posted with :meth:`post_later` since the owner last cleared this (and had them flushed)
        self.fresh = False
        #: one of them should not wait for the loop's poll (:meth:`post_later`)
        self.urgent = False
        self._streams = 0  # streams watching (loop thread only)
        self._poll_handle: Optional[asyncio.TimerHandle] = None

    def post(self, queue: asyncio.Queue[Any], item: Any) -> None:
        """Put ``item`` on ``queue`` (an asyncio.Queue of :attr:`loop`) soon; thread-safe."""
        self._outbox.append((queue, item))
        self.flush()

    def post_later(self, queue: asyncio.Queue[Any], item: Any, urgent: bool = False) -> None:
        """Put ``item`` on ``queue`` at the next :meth:`flush`, :meth:`post` or poll; thread-safe. Raises
        :attr:`fresh`, and :attr:`urgent` when ``urgent`` (whoever calls :meth:`flush` should not wait)."""
        self._outbox.append((queue, item))
        self.fresh = True
        if urgent:
            self.urgent = True

    def flush(self) -> None:
        """Have the loop take everything posted so far (one callback, none when nothing waits or
        one is due already); thread-safe."""
        if not self._outbox:
            return
        with self._lock:
            if self._scheduled:
                return  # the due _deliver takes this item
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is gone (server stopping); nobody is listening
            pass

    def watch(self) -> None:
        """A stream starts on this loop (loop thread): poll the outbox every :attr:`interval_s` until the
        last one :meth:`unwatch` es."""
        self._streams += 1
        if self.interval_s > 0 and self._poll_handle is None:
            self._poll_handle = self.loop.call_later(self.interval_s, self._poll)

    def unwatch(self) -> None:
        """A stream ended (loop thread); the poll stops at its next turn when it was the last."""
        self._streams -= 1

    def _poll(self) -> None:
        self._deliver()
        self._poll_handle = self.loop.call_later(self.interval_s, self._poll) if self._streams else None

    def _deliver(self) -> None:
        with self._lock:
            self._scheduled = False  # before draining: an item posted from here on schedules anew
        while self._outbox:
            queue, item = self._outbox.popleft()
            queue.put_nowait(item)


#: Stands for the final message's content while the template renders it (continue_final_message): private-use
#: code points, which no tokenizer's specials and no template write.
_FINAL_MARK = "\ue000prodip-final-message\ue001"


def _template_kwargs(req: Any) -> dict[str, object]:
    """``chat_template_kwargs`` (vLLM): more variables for the template. Names the request's own fields and
    the conversation are refused, so the kwargs cannot contradict them.

    Raises:
        APIError 400: ``add_generation_prompt`` and ``continue_final_message`` both set, or a kwarg named
            ``messages``, ``add_generation_prompt`` or ``continue_final_message`` (param named).
    """
    if req.add_generation_prompt and req.continue_final_message:
        raise APIError(
            400,
            "continue_final_message leaves the final message open, so it needs add_generation_prompt: false",
            param="continue_final_message",
        )
    kwargs = dict(getattr(req, "chat_template_kwargs", None) or {})
    for name in ("messages", "add_generation_prompt", "continue_final_message"):
        if name in kwargs:
            raise APIError(
                400,
                f"chat_template_kwargs.{name}: set by the request itself ({'the conversation' if name == 'messages' else 'its own field'})",
                param=f"chat_template_kwargs.{name}",
            )
    return kwargs


def _continue_final(
    messages: list[dict[str, str]],
    template: Optional[str],
    variables: Mapping[str, object],
    specials: Seq[Optional[str]] = (),
) -> str:
    """The prompt text that leaves the final message open, as transformers' ``continue_final_message`` (its
    text up to the end of the final message's content): the template renders a marker in place of that
    content, and everything from the marker on is replaced by the content itself.

    Raises:
        APIError 400: the template does not write the final message's content.
        MessageError: a message breaks a rule of every chat message (``specials``: the special tokens' text).
    """
    last = messages[-1]
    render(messages, add_generation_prompt=False, template=template, variables=variables, specials=specials)  # checks
    text = render(
        [*messages[:-1], {**last, "content": _FINAL_MARK}],
        add_generation_prompt=False,
        template=template,
        variables=variables,
    )
    cut = text.rfind(_FINAL_MARK)
    if cut < 0:
        raise APIError(
            400, "continue_final_message: the chat template does not write the final message", param="messages"
        )
    return text[:cut] + last["content"]


class PieceWalk:
    """``logprobs`` pieces and offsets of a run of tokens, from their bytes.

    ``add`` returns each token's piece and the character offset where it starts in the decoded
    text: the text it adds when that is whole UTF-8 characters, else OpenAI's ``bytes:\\xNN...``
    at the offset of the character it starts in (a byte-level token may hold a character and a
    half); a special token or an id the tokenizer lacks adds no text and is named at the current length
    as ``top_logprobs`` names it (``<|im_end|>``: one spelling, so the chosen token is found among its
    alternatives).
    """

    def __init__(self, svc: Service) -> None:
        self._svc = svc
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._parts: list[str] = []
        self.chars = 0  # complete characters so far (an unfinished one is held in the decoder)

    def restart(self) -> None:
        """Count from here on (keeping an unfinished character's bytes)."""
        self._parts, self.chars = [], 0

    def add(self, token_id: int, typed: Optional[str] = None) -> tuple[str, int]:
        """One token's (piece, offset); ``typed``: the text of a special token typed in a prompt."""
        offset = self.chars
        raw = typed.encode() if typed is not None else self._svc.token_bytes(token_id)
        if raw is None:
            return self._svc.token_text(token_id), offset
        held = self._utf8.getstate()[0]  # bytes of an unfinished character
        if held and codecs.getincrementaldecoder("utf-8")("replace").decode(held + raw[:1]).startswith("\ufffd"):
            offset += 1  # this token does not continue it: it becomes U+FFFD, then this token starts
        out = self._utf8.decode(raw)
        self._parts.append(out)
        self.chars += len(out)
        try:
            return raw.decode("utf-8"), offset
        except UnicodeDecodeError:
            return bytes_piece(raw), offset

    def text(self) -> str:
        """All the text so far, an unfinished character at the end shown as U+FFFD (as decode)."""
        held = self._utf8.getstate()[0]
        return "".join(self._parts) + held.decode("utf-8", "replace")
