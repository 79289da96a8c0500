"""Timed greedy generation: what every runtime's timing method is given (:class:`SpeedJob`) and returns
(:class:`Timing`), and the one rule that turns a round's clock readings into its figures (:func:`round_figures`).

Each runtime times generation inside itself (Node scripts with ``performance.now()``, Python runtimes with
``time.perf_counter()``) around one greedy generation of ``new_tokens`` tokens after a fixed prompt, end of
sequence ignored so every runtime decodes the same count:

- time to first token (TTFT, seconds): from the generate call (prompt already tokenised, model loaded) to the
  first new token, so the prompt's prefill is in it;
- decode rate (tokens/s): ``(new tokens - 1) / (time of the last new token - time of the first)``, the steady
  one-token steps after the first (the definition llama.cpp's ``llama-bench`` ``tg`` and the export's web page
  use).

A round is one generation; a variant is timed over several rounds after one untimed warm-up generation (the
first run of a session pays for allocations and kernel selection), and the card shows the median of the rounds.

    python -c "from prodip.conformance.runtimes.timing import round_figures; print(round_figures(0.0, [0.5, 0.6, 0.7]))"
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypedDict

import numpy as np


@dataclass
class SpeedJob:
    """What a runtime times: each candidate it runs, greedily, from one prompt.

    Attributes:
        export_dir: the export dir.
        candidates: the candidates of the formats the runtime runs (``name``, ``variant``, ``kind``, ``path``
            relative to the export dir).
        prompt: the prompt's token ids (the export's tokenizer, BOS included).
        prompt_text: the same prompt as text (for a runtime that tokenises it itself: the web page).
        new_tokens: new tokens per round (>= 2: the decode rate needs a step after the first token).
        rounds: timed rounds per candidate (after one untimed warm-up).
        threads: CPU threads the runtime may use (0 = its own default).
        model_cfg: the model's ``ModelConfig`` (layers, kv heads, head dim: the KV-cache inputs' shapes).
    """

    export_dir: Path
    candidates: Sequence[Any]
    prompt: list[int]
    prompt_text: str
    new_tokens: int
    rounds: int
    threads: int
    model_cfg: Any


@dataclass
class Timing:
    """One runtime's timed generation of one candidate: the figures of each timed round, or why it failed.

    Attributes:
        ttft_s: time to first token per round (seconds).
        decode_tokens_per_s: decode rate per round (new tokens after the first per second).
        new_tokens: new tokens each round generated.
        threads: CPU threads the runtime was given (0 = its own default).
        version: the runtime's version (e.g. ``onnxruntime-genai 0.18.0``).
        error: why it could not be timed (then the lists are empty).
    """

    ttft_s: list[float] = field(default_factory=list)
    decode_tokens_per_s: list[float] = field(default_factory=list)
    new_tokens: int = 0
    threads: int = 0
    version: str = ""
    error: Optional[str] = None

    def add_round(self, t0: float, stamps: Sequence[float]) -> None:
        """Add one round from its clock readings (:func:`round_figures`)."""
        ttft, rate = round_figures(t0, stamps)
        self.add_figures(ttft, rate, len(stamps))

    def add_figures(self, ttft_s: float, decode_tokens_per_s: float, new_tokens: int = 0) -> None:
        """Add one round a runtime measured itself (the web page reports its own figures).

        Raises:
            ValueError: a figure that is not a positive finite number.
        """
        for what, x in (("ttft_s", ttft_s), ("decode_tokens_per_s", decode_tokens_per_s)):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not (math.isfinite(x) and x > 0):
                raise ValueError(f"{what} {x!r} is not a positive finite number")
        self.ttft_s.append(float(ttft_s))
        self.decode_tokens_per_s.append(float(decode_tokens_per_s))
        self.new_tokens = new_tokens or self.new_tokens

    @property
    def median_ttft_s(self) -> float:
        """Median time to first token over the rounds (s). Raises ValueError when no round was timed."""
        return _median(self.ttft_s, "ttft_s")

    @property
    def median_decode_tokens_per_s(self) -> float:
        """Median decode rate over the rounds (tokens/s). Raises ValueError when no round was timed."""
        return _median(self.decode_tokens_per_s, "decode_tokens_per_s")


def _median(values: Sequence[float], what: str) -> float:
    if not values:
        raise ValueError(f"Timing.{what}: no timed round")
    return float(statistics.median(values))


def round_figures(t0: float, stamps: Sequence[float]) -> tuple[float, float]:
    """One round's time to first token and decode rate from its clock readings.

    Args:
        t0: the clock when generation was called (seconds, any monotonic origin).
        stamps: the clock when each new token was available, in order (seconds, same origin); at least two.
    Returns:
        ``(ttft_s, decode_tokens_per_s)``: ``stamps[0] - t0`` and ``(len(stamps) - 1) / (stamps[-1] - stamps[0])``.
    Raises:
        ValueError: fewer than two stamps, stamps out of order, or a figure that is not positive and finite
            (a clock too coarse for the steps: the message names the readings).
    """
    if len(stamps) < 2:
        raise ValueError(f"a timed round needs at least 2 new tokens, got {len(stamps)}")
    if any(b < a for a, b in zip([t0, *stamps], stamps)):
        raise ValueError(f"clock readings out of order: t0={t0}, first stamps {list(stamps[:4])}")
    ttft = stamps[0] - t0
    span = stamps[-1] - stamps[0]
    rate = (len(stamps) - 1) / span if span > 0 else math.inf
    if not (ttft > 0 and math.isfinite(ttft) and math.isfinite(rate)):
        raise ValueError(f"round not measurable: ttft {ttft} s, {len(stamps) - 1} steps in {span} s")
    return ttft, rate


class NodeRound(TypedDict):
    """One timed round of a Node timing script: ``performance.now()`` at the generate call and at each new token
    (milliseconds)."""

    t0: float
    stamps: list[float]


class NodeTimingAnswer(TypedDict, total=False):
    """A Node timing script's answer for one file: its rounds, or the error that stopped it."""

    rounds: list[NodeRound]
    error: str


def timings_from_node(
    got: NodeTimingAnswer, key: str, threads: int, version: str, count: Optional[int] = None
) -> Timing:
    """A :class:`Timing` from a Node timing script's answer for one file: ``{"rounds": [{"t0": ms, "stamps": [ms,
    ...]}, ...]}`` (``performance.now()`` readings, milliseconds) or ``{"error": str}``; ``key`` names the file
    in the error."""
    if "error" in got:
        return Timing(threads=threads, version=version, error=f"{key}: {got['error']}")
    out = Timing(threads=threads, version=version)
    try:
        for rnd in got["rounds"]:
            out.add_round(rnd["t0"] / 1e3, [s / 1e3 for s in rnd["stamps"]])
    except (KeyError, TypeError, ValueError) as err:
        return Timing(threads=threads, version=version, error=f"{key}: {type(err).__name__}: {err}")
    if count is not None and out.new_tokens != count:
        out.error = f"{key}: generated {out.new_tokens} new tokens, asked for {count}"
    return out


def time_runner(runner: Any, prompt: Sequence[int], new_tokens: int, rounds: int, timing: Timing) -> Timing:
    """Time greedy generation on a conformance runner (``prodip.conformance.runners.Runner``'s ``forward``: ONNX
    Runtime, ExecuTorch) with ``time.perf_counter``: one untimed warm-up round, then ``rounds`` timed ones, each
    ``new_tokens`` argmax tokens after ``prompt`` (batch 1, KV cache, end of sequence ignored); each round starts
    from an empty cache (``state`` None).

    Args:
        runner: the runner; prompt: token ids; new_tokens: >= 2; rounds: >= 1.
        timing: where the rounds are added (its ``threads`` / ``version`` set by the caller).
    Returns:
        ``timing``.
    """
    ids = np.asarray([list(prompt)], np.int64)
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        logits, state = runner.forward(ids, np.ones_like(ids), np.arange(ids.shape[1], dtype=np.int64)[None])
        nxt = int(np.argmax(logits[0, -1]))
        stamps = [time.perf_counter()]
        for step in range(new_tokens - 1):
            n = ids.shape[1] + step + 1  # positions in the cache after this step's token
            logits, state = runner.forward(
                np.asarray([[nxt]], np.int64), np.ones((1, n), np.int64), np.asarray([[n - 1]], np.int64), state
            )
            nxt = int(np.argmax(logits[0, -1]))
            stamps.append(time.perf_counter())
        if r:  # round 0 warms the session up (allocations, kernel choice) and is not counted
            timing.add_round(t0, stamps)
    return timing
