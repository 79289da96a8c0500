"""Continuous batching on one background thread, batch-invariant: a request's tokens and logprobs
are bit-identical whatever else runs with it.

The rule: rows are batched only with rows of the SAME shape (same number of tokens in the cache,
same number of new tokens), never padded to each other. A row's numbers then do not depend on its
neighbours, because every op of the decoder computes each row on its own (the ONNX Runtime CPU
kernels of every served variant give a row the same bits in a batch of 1 or of 16 with equal
shapes: tests/export/test_onnx.py::test_rows_are_batch_invariant). Padding would not be: a
left-padded row's attention sums run over a longer, shifted axis, so SIMD lanes and GEMM K-blocks
split them differently (fp32 logits move by ~1e-6, enough to flip a seeded sample on a tie), and
the former int8 variant had one activation scale for the whole batch.

So the running rows form groups (:class:`_Batch`, no padding of the computation). Arrivals (within
``batch_wait_ms`` of an idle engine, or during any decode step) are prefilled together per prompt
length and join a running group. With the contract graph a group holds rows of one length (mask all
ones; a cache of P + 1 tokens per row), one ONNX Runtime call per group and step. With the
shared-buffer graph (serve's default) every running row is in ONE group whatever its length: a decode
step takes each row's own length from its mask (right-padded, ``seqlens_k`` = its ones - 1) and
position, and ONNX Runtime's GroupQueryAttention reads and writes each row's cache up to that length
alone, so a row gets the same bits as alone (tests/serve/test_batch_invariance.py) and a step is one
call however the arrivals were spread over prefills (bench/results/serve_profile_2026-12-01.md).
Finished or cancelled rows leave their group after the step in which they finish. Results go back
through each sequence's ``emit`` callback (called on this thread; a sequence's tokens between its first
and its end every ``stream_interval_ms``, several at once: :meth:`Sequence.render`). ``on_step(idle)`` is
called after each step, before a decode run that follows a prefill or a cancel (``idle`` False), and before
the thread waits for work (True): serve has the event loop woken there for what must not wait (through a
thread of its own: serve/service.py); the loop takes a stream's other tokens on its own timer.

    python -c "from prodip.serve.batching import SamplingParams; print(SamplingParams(max_new_tokens=8))"
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import numpy as np

from prodip.serve.engine import OnnxDecoder, to_numpy
from prodip.serve.sampling import TokenPenalties, log_softmax, make_rng, sample_token, top_logprobs
from prodip.serve.text import IncrementalDetokenizer, StopMatcher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingParams:
    """Per-sequence generation settings (validated by the HTTP layer)."""

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    logprobs: Optional[int] = None  # top-n alternatives per generated token; None = no logprobs
    prompt_logprobs: bool = False  # also score the prompt tokens (echo)
    ignore_eos: bool = False
    presence_penalty: float = 0.0  # OpenAI's, [-2, 2]: see serve.sampling.adjust_logits
    frequency_penalty: float = 0.0  # OpenAI's, [-2, 2]
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]), distinct ids < V


@dataclass
class TokenOut:
    """One event for a sequence: a generated token and/or the end of the sequence."""

    token_id: Optional[int]  # None for a final event that carries no token (e.g. max_new_tokens=0)
    text: str  # newly complete text (may be "" while bytes or a possible stop string are held)
    logprob: Optional[float] = None
    top: list[tuple[int, float]] = field(default_factory=list)
    finish_reason: Optional[str] = None  # "stop" | "length" | "cancelled" | "error"
    error: Optional[str] = None
    #: the detokeniser's text for this token, before stop strings are held back or cut ("" while the
    #: token only completes part of a character); the pieces of a sequence join to its full text.
    piece: str = ""
    #: on the final event: a stop string was found, and the text was cut where it starts.
    stop_string: bool = False


@dataclass
class PromptScores:
    """Per-token logprobs of the prompt (first token has none), for echo."""

    logprobs: list[Optional[float]]
    top: list[list[tuple[int, float]]]


class Sequence:
    """One prompt being generated (one OpenAI "choice").

    Args:
        prompt_ids: the prompt's token ids (>= 1 id).
        params: sampling settings.
        tokenizer: the export's tokenizer, for text deltas and stop strings.
        emit: called on the engine thread with each :class:`TokenOut` or :class:`PromptScores`.
        eos_id: the id, or the ids, that end generation (finish_reason "stop", unless ``ignore_eos``).
        stream_index: choice index within the request, used to derive the seeded RNG stream.
    """

    def __init__(
        self,
        prompt_ids: Seq[int],
        params: SamplingParams,
        tokenizer: Any,
        emit: Callable[[Any], None],
        eos_id: Union[int, Collection[int]],
        stream_index: int = 0,
    ) -> None:
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.emit = emit
        #: ids that end generation: <|eos|>, and a chat model's end of turn <|im_end|>
        self.eos_ids = frozenset([eos_id] if isinstance(eos_id, int) else eos_id)
        self.rng = make_rng(params.seed, stream_index)
        self.detok = IncrementalDetokenizer(tokenizer, self.prompt_ids)
        self.stopper = StopMatcher(params.stop)
        self.generated: list[int] = []
        #: chosen tokens not yet emitted, (id, logprob, top): see :meth:`render`
        self._pending: list[tuple[int, Optional[float], list[tuple[int, float]]]] = []
        #: its tokens may wait for :meth:`render`: with no stop strings only ids end it (eos, length)
        self.defers = not params.stop
        self.penalties = TokenPenalties(params.presence_penalty, params.frequency_penalty, params.logit_bias)
        #: the token is the raw logits' argmax (greedy, nothing added to the logits)
        self._greedy = (params.temperature == 0 or params.top_k == 1) and not self.penalties.active
        self.cancelled = threading.Event()
        self.finished = False
        self.submitted_s = time.perf_counter()

    def cancel(self) -> None:
        """Ask the engine to drop this sequence at its next step (thread-safe)."""
        self.cancelled.set()

    def finish(self, reason: str, error: Optional[str] = None) -> None:
        """Emit the final event once: reason "eos" | "length" | "stop" | "cancelled" | "error".

        On "eos"/"length" the held-back text is flushed (a stop string found in it turns the
        reason into "stop"); "eos" is reported as OpenAI's "stop".
        """
        if self.finished:
            return
        self.render()
        self.finished = True
        tail = ""
        if reason in ("eos", "length"):
            tail = self.stopper.feed(self.detok.flush())
            tail += self.stopper.flush()  # "" once stopped; else the held tail, cut at a stop string it completes
            if self.stopper.stopped:
                reason = "stop"
        self.emit(
            TokenOut(
                None,
                tail,
                finish_reason="stop" if reason == "eos" else reason,
                error=error,
                stop_string=self.stopper.stopped,
            )
        )

    def step(self, logits: np.ndarray) -> None:
        """Choose the next token from this row's last logits (V,) float32; emit it, or keep it for
        :meth:`render` when the sequence :attr:`defers` and it is not the first (time to first token is
        not delayed) nor the last (:meth:`finish` renders).

        The token is sampled from the logits after this sequence's penalties and logit_bias
        (:class:`~serve.sampling.TokenPenalties`); its logprobs are those of the raw logits, the
        model's own distribution.
        """
        p = self.params
        if self._greedy:  # sample_token's greedy choice, without its checks and calls between two runs
            token = int(logits.argmax())
        else:
            token = sample_token(self.penalties.apply(logits), p.temperature, p.top_k, p.top_p, self.rng)
        lp, top = None, []
        if p.logprobs is not None:
            row = log_softmax(logits)
            lp, top = float(row[token]), _with_chosen(top_logprobs(row, p.logprobs), token, row)
        self.generated.append(token)
        self.penalties.observe(token)
        if token in self.eos_ids and not p.ignore_eos:
            self.render()
            self.emit(TokenOut(token, "", lp, top))
            self.finish("eos")
            return
        self._pending.append((token, lp, top))
        if not self.defers or len(self.generated) == 1:
            self.render()
        if self.stopper.stopped:
            self.finish("stop")
        elif len(self.generated) >= p.max_new_tokens:
            self.finish("length")

    def render(self) -> None:
        """Emit the tokens chosen since the last call, in order, with their text (engine thread).

        Why tokens may wait: turning a token into text (two tokenizer decodes, stop strings, an event) between
        two ONNX Runtime runs costs the next run more than its own time, since the run evicted the caches it
        needs and it evicts what the run needs (bench/results/serve_engine_2026-12-02.md); the same work for
        several tokens in a row runs warm and disturbs one run. The scheduler calls this every
        ``stream_interval_ms`` (:class:`BatchScheduler`). A sequence with stop strings does not :attr:`defers`:
        it renders each token as it is chosen, so it ends at the token that completes a stop string (or at
        the next character's token when that one could still change the stop string's NFC, ``"e"`` then U+0301).
        """
        if not self._pending:
            return
        for token, lp, top in self._pending:
            piece = self.detok.add(token)
            self.emit(TokenOut(token, self.stopper.feed(piece), lp, top, piece=piece))
        self._pending.clear()


@dataclass
class _Batch:
    """A group of running rows: KV caches, no padding of the computation.

    Attributes:
        seqs: the rows' sequences.
        past: 2 * layers caches float32, numpy arrays or OrtValues: contract graph (B, Hkv, P, Dh),
            every row of one length P; shared-buffer graph (B, Hkv, capacity >= max P, Dh), row b's
            first ``lengths[b]`` slots valid. A lone row's cache may hold one more row, a twin of its
            last (:attr:`OnnxDecoder.row_rule`): rows ``[:B]`` count.
        lengths: the tokens in each row's cache = its next position id (B ints).
        next_ids: the last sampled token of each row, fed at the next step (B ints).
            Python lists, not arrays: a decode step updates both, and a numpy call between two ONNX Runtime
            runs costs ~10x its warm time (bench/results/serve_engine_2026-12-02.md).
        reserve: the most tokens any row can reach (prompt + max new tokens; rows that left may leave
            it high): what a cache the decoder allocates for this group is sized for, set once per
            group rather than recomputed at every decode step.
        uniform: every row holds as many tokens (a contract-graph group always does): known where rows
            come together or leave (:meth:`merge`, :meth:`select`) and kept by a decode step, rather
            than recomputed at every step.
    """

    seqs: list[Sequence]
    past: list[Any]
    lengths: list[int]
    next_ids: list[int]
    reserve: int = 0
    uniform: bool = True

    def select(self, keep: list[int]) -> _Batch:
        """The rows ``keep`` (indices); the same object when all are kept (no copy of the cache)."""
        if len(keep) == len(self.seqs):
            return self
        past = [to_numpy(p)[keep] for p in self.past]
        lengths = [self.lengths[i] for i in keep]
        uniform = self.uniform or _all_equal(lengths)
        next_ids = [self.next_ids[i] for i in keep]
        return _Batch([self.seqs[i] for i in keep], past, lengths, next_ids, self.reserve, uniform)

    @staticmethod
    def merge(a: _Batch, b: _Batch) -> _Batch:
        """Stack two groups; their caches padded to one capacity (shared-buffer caches: groups of
        different lengths may merge, each row keeps its length)."""
        # [:len(seqs)]: without the twin row a cache may carry (OnnxDecoder.row_rule)
        na, nb = len(a.seqs), len(b.seqs)
        past = [np.concatenate(_same_capacity(to_numpy(x)[:na], to_numpy(y)[:nb])) for x, y in zip(a.past, b.past)]
        lengths = a.lengths + b.lengths
        return _Batch(
            a.seqs + b.seqs, past, lengths, a.next_ids + b.next_ids, max(a.reserve, b.reserve), _all_equal(lengths)
        )


class BatchScheduler:
    """Owns the decoder and a worker thread; sequences go in with :meth:`submit`.

    Args:
        decoder: the ONNX decoder.
        max_batch_size: most rows decoded together (rows); further arrivals wait in a queue.
        batch_wait_ms: when idle, wait this long (milliseconds) after the first arrival for others.
        on_queue_depth: called (engine thread) with the waiting and running sequence counts when they change.
        on_decode_step: called (engine thread) with the number of rows of each decode step.
        on_step: called (engine thread) with False after each step, before each prefill run and before a
            decode run that follows a prefill or a cancel (so no emitted event waits out a run), with True
            before the thread waits for work (or ends): where the events emitted since are handed on.
        stream_interval_ms: the tokens of running sequences that :attr:`Sequence.defers` are emitted
            (:meth:`Sequence.render`) after the first decode step that ends at least this long (milliseconds)
            after the last such emission; 0: after every step. A sequence's first token and its end are
            emitted at once whatever this is.
    """

    def __init__(
        self,
        decoder: OnnxDecoder,
        max_batch_size: int = 32,
        batch_wait_ms: float = 5.0,
        on_queue_depth: Callable[[int, int], None] = lambda waiting, running: None,
        on_decode_step: Callable[[int], None] = lambda rows: None,
        on_step: Callable[[bool], None] = lambda idle: None,
        stream_interval_ms: float = 0.0,
    ) -> None:
        self.decoder = decoder
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.on_queue_depth = on_queue_depth
        self.on_decode_step = on_decode_step
        self.on_step = on_step
        self.stream_interval_s = stream_interval_ms / 1000.0
        self._rendered_s = 0.0  # when the running sequences' tokens were last emitted (time.perf_counter s)
        self._waiting: deque[Sequence] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._groups: list[_Batch] = []  # running rows, one group per length
        self._reported = (-1, -1)  # the (waiting, running) counts on_queue_depth was told last
        self._rows_left = False  # rows finished, were cancelled or failed since the counts were last reported
        self._thread = threading.Thread(target=self._run, name="prodip-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, seqs: list[Sequence]) -> None:
        """Queue sequences (thread-safe); they are prefilled together at the next step."""
        with self._cond:
            if self._stop:
                raise RuntimeError("the engine is shutting down")
            self._waiting.extend(seqs)
            self._cond.notify()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Cancel everything, stop the worker thread and wait for it (seconds)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _take_waiting(self) -> list[Sequence]:
        if self._groups and not self._waiting and not self._stop:
            return []  # the usual decode step: no lock (a submit that lands now is taken next step)
        with self._cond:
            running = self._running()
            while not self._waiting and running == 0 and not self._stop:
                self._cond.wait()
            if self._waiting and running == 0 and self.batch_wait_s > 0:
                deadline = time.monotonic() + self.batch_wait_s
                while len(self._waiting) < self.max_batch_size and not self._stop:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._cond.wait(left):
                        break
            room = self.max_batch_size - running
            taken = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
            self._tell_depth(len(self._waiting), running + len(taken))
            return taken

    def _tell_depth(self, waiting: int, running: int) -> None:
        """``on_queue_depth(waiting, running)`` when the counts changed since it was last told."""
        if (waiting, running) != self._reported:
            self._reported = (waiting, running)
            self.on_queue_depth(waiting, running)

    def _run(self) -> None:
        while True:
            if not self._groups:
                self.on_step(True)  # the thread may wait now: hand on what was emitted (errors, cancels)
            new = self._take_waiting()
            arrived = bool(new)  # _take_waiting told the counts with them; some may be cancelled before the prefill
            if self._stop:
                for seq in new:
                    seq.finish("cancelled")
                break
            try:
                if new:  # (a decode step with no arrival runs no Python it does not need: see _decode)
                    if not self._groups:
                        self._rendered_s = time.perf_counter()  # the interval counts from the first tokens
                    new = [s for s in new if not self._drop_if_cancelled(s)]
                    for group in self._prefill(new):
                        self._join(group)
                    self.on_step(False)  # the first tokens go out before the decode step
                self._groups = [g for g in (self._decode(g) for g in self._groups) if g.seqs]
                self._render_due()
                self.on_step(False)  # the step's tokens go out while the next step's inputs are made
            except Exception as err:  # never let one bad step kill the server: fail the rows in flight
                log.exception("engine step failed")
                for seq in [s for g in self._groups for s in g.seqs] + new:
                    seq.finish("error", error=f"{type(err).__name__}: {err}")
                self._groups = []
                self._rows_left = True
            if arrived or self._rows_left:
                self._rows_left = False
                self._report_depth()  # rows that finished or were cancelled this step have left
        for seq in list(self._waiting) + [s for g in self._groups for s in g.seqs]:
            seq.finish("cancelled")
        self._waiting.clear()
        self._groups = []
        self._report_depth()
        self.on_step(True)

    def _render_due(self) -> None:
        """Emit the running sequences' waiting tokens when ``stream_interval_ms`` has passed since the last
        time (:meth:`Sequence.render`)."""
        now = time.perf_counter()
        if now - self._rendered_s >= self.stream_interval_s:
            self._rendered_s = now
            for g in self._groups:
                for s in g.seqs:
                    s.render()

    def _running(self) -> int:
        return sum(len(g.seqs) for g in self._groups)

    def _join(self, group: _Batch) -> None:
        """Add a prefilled group to a running group: with the shared-buffer graph the one running
        group (rows of any length), else the group of its length; or as a new group."""
        if not group.seqs:
            return
        for i, g in enumerate(self._groups):
            if self.decoder.shared_buffer or g.lengths[0] == group.lengths[0]:
                self._groups[i] = _Batch.merge(g, group)
                return
        self._groups.append(group)

    def _forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[Any],
        reserve: int,
    ) -> tuple[np.ndarray, list[Any]]:
        """:meth:`OnnxDecoder.forward`, after ``on_step``; a cache it allocates is sized for ``reserve``
        tokens (:attr:`_Batch.reserve`)."""
        self.on_step(False)
        return self.decoder.forward(input_ids, attention_mask, position_ids, past, reserve)

    def _report_depth(self) -> None:
        """Tell ``on_queue_depth`` the current waiting and running counts (engine thread; the length of a
        deque is read atomically, no lock needed)."""
        self._tell_depth(len(self._waiting), self._running())

    @staticmethod
    def _drop_if_cancelled(seq: Sequence) -> bool:
        if seq.cancelled.is_set():
            seq.finish("cancelled")
            return True
        return False

    def _prefill(self, seqs: list[Sequence]) -> list[_Batch]:
        """Run the prompts of ``seqs``, one batch per prompt length (no padding); sample each
        row's first token. Returns the groups of rows still running."""
        by_len: dict[int, list[Sequence]] = {}
        for s in seqs:
            by_len.setdefault(len(s.prompt_ids), []).append(s)
        groups = []
        for T, same in by_len.items():
            ids = np.array([s.prompt_ids for s in same], np.int64)
            mask = np.ones(ids.shape, np.int64)
            pos = np.broadcast_to(np.arange(T, dtype=np.int64), ids.shape)
            reserve = T + max(s.params.max_new_tokens for s in same)
            logits, present = self._forward(ids, mask, pos, self.decoder.empty_past(len(same)), reserve)
            keep = []
            for r, s in enumerate(same):
                if s.params.prompt_logprobs:
                    s.emit(_prompt_scores(logits[r], s.prompt_ids, s.params.logprobs or 0))
                if s.params.max_new_tokens == 0:
                    s.finish("length")
                    continue
                s.step(logits[r, -1])
                if not s.finished:
                    keep.append(r)
            next_ids = [s.generated[-1] if s.generated else 0 for s in same]
            groups.append(_Batch(same, present, [T] * len(same), next_ids, reserve).select(keep))
        return groups

    def _decode(self, b: _Batch) -> _Batch:
        """One decode step for every row of group ``b``; returns the group without the rows that
        finished or were cancelled.

        The group is updated in place (its caches, lengths and next ids; the decoder copied the inputs
        into its own buffers before running): the Python between two ONNX Runtime runs slows the next run
        by more than its own time (bench/results/serve_engine_2026-12-01.md), so a step makes no new
        objects it does not need."""
        if any(s.cancelled.is_set() for s in b.seqs):
            b = b.select([i for i, s in enumerate(b.seqs) if not self._drop_if_cancelled(s)])
            self._rows_left = True
            self.on_step(False)  # their ends go out before the run
            if not b.seqs:
                return b
        self.on_decode_step(len(b.seqs))
        logits, b.past = self.decoder.decode(b.next_ids, b.lengths, b.past, b.reserve, b.uniform)
        b.lengths = [n + 1 for n in b.lengths]
        finished = False
        for r, s in enumerate(b.seqs):
            s.step(logits[r, -1])
            b.next_ids[r] = s.generated[-1]
            finished = finished or s.finished
        if finished:
            self._rows_left = True
            return b.select([i for i, s in enumerate(b.seqs) if not s.finished])
        return b


def _all_equal(lengths: list[int]) -> bool:
    """Whether every row holds as many tokens (``lengths``: B >= 1 ints)."""
    return lengths.count(lengths[0]) == len(lengths)


def _same_capacity(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two caches (B, Hkv, capacity, Dh) padded with zeros to the larger capacity (shared-buffer
    caches of groups that grew at different times; contract caches of one length pass unchanged)."""
    cap = max(x.shape[2], y.shape[2])

    def pad(a: np.ndarray) -> np.ndarray:
        return a if a.shape[2] == cap else np.pad(a, ((0, 0), (0, 0), (0, cap - a.shape[2]), (0, 0)))

    return pad(x), pad(y)


def _prompt_scores(logits: np.ndarray, prompt_ids: list[int], n_top: int) -> PromptScores:
    """Logprob of each prompt token given the ones before it (logits: (T, V) for the prompt rows)."""
    lps: list[Optional[float]] = [None]
    tops: list[list[tuple[int, float]]] = [[]]
    rows = log_softmax(logits[:-1])  # (T-1, V): row t predicts token t+1
    for t, tok in enumerate(prompt_ids[1:]):
        lps.append(float(rows[t, tok]))
        tops.append(_with_chosen(top_logprobs(rows[t], n_top), tok, rows[t]))
    return PromptScores(lps, tops)


def _with_chosen(top: list[tuple[int, float]], token: int, row: np.ndarray) -> list[tuple[int, float]]:
    """``top`` plus the chosen (sampled or echoed) token when it is not among them: up to
    ``logprobs + 1`` entries, as OpenAI's legacy completions and vLLM return."""
    if any(t == token for t, _ in top):
        return top
    return [*top, (int(token), float(row[token]))]
