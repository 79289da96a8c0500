"""Next-token selection from one row of logits: OpenAI penalties and logit_bias, then greedy,
temperature, top-k, top-p (nucleus).

Pure numpy, one row at a time, with a per-request ``numpy.random.Generator`` so that a request's
samples depend only on its seed, never on what else shares its batch. :class:`TokenPenalties` keeps
one sequence's generated-token counts incrementally and adjusts its raw logits before
:func:`sample_token`.

    python -c "import numpy as np; from prodip.serve.sampling import sample_token; \
print(sample_token(np.array([0., 2., 1.], np.float32), 0.0, 0, 1.0, None))"
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

import numpy as np

from prodip.base.errors import InvalidInput


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Natural-log probabilities along the last axis, computed in float64 for stable sums.

    Args:
        logits: (..., V) float32 raw model scores.
    Returns:
        (..., V) float64 log-probabilities (nats).
    """
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    out: np.ndarray = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return out


def make_rng(seed: Optional[int], stream: int = 0) -> np.random.Generator:
    """A private RNG for one sequence: ``seed`` (any int, or None for OS entropy) and ``stream``
    (the choice index, so n>1 choices of one seeded request differ but are reproducible)."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([seed % (1 << 64), stream])


def sample_token(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: Optional[np.random.Generator]
) -> int:
    """Choose the next token id.

    Greedy (argmax, first index on ties) when ``temperature == 0`` or ``top_k == 1``. Otherwise
    the scores are divided by ``temperature``, restricted to the ``top_k`` largest (ties at the
    k-th value kept; ``top_k <= 0`` = no limit), then to the smallest set of most likely tokens whose
    probability reaches ``top_p`` (Holtzman et al. 2019, arXiv:1904.09751; the top token is always
    kept, so a tiny ``top_p`` is greedy), renormalised, and sampled by inverse CDF with one
    ``rng.random()`` draw.

    Args:
        logits: (V,) float32 scores for one row: raw, or adjusted by :meth:`TokenPenalties.apply`.
        temperature: >= 0 (0 = greedy).
        top_k: number of candidates, <= 0 for all.
        top_p: in (0, 1].
        rng: the sequence's generator (unused when greedy).
    Returns:
        The token id (int in [0, V)).
    Raises:
        ValueError: temperature < 0 or top_p outside (0, 1].
    """
    if temperature < 0 or not 0 < top_p <= 1:
        raise InvalidInput(f"temperature must be >= 0 and top_p in (0, 1]; got {temperature}, {top_p}")
    if temperature == 0 or top_k == 1:
        return int(logits.argmax())  # the method: np.argmax's Python wrapper costs as much again
    x = logits.astype(np.float64) / temperature
    if 0 < top_k < x.shape[0]:
        kth = np.partition(x, -top_k)[-top_k]
        x = np.where(x < kth, -np.inf, x)
    order = np.argsort(-x, kind="stable")
    p = np.exp(x[order] - x[order[0]])
    p /= p.sum()
    if top_p < 1.0:
        n_keep = int(np.searchsorted(np.cumsum(p), top_p, side="left")) + 1
        p = p[: min(n_keep, p.shape[0])]
    cdf = np.cumsum(p)
    u = (rng if rng is not None else np.random.default_rng()).random() * cdf[-1]
    idx = min(int(np.searchsorted(cdf, u, side="right")), p.shape[0] - 1)
    return int(order[idx])


def top_logprobs(logprobs: np.ndarray, n: int) -> list[tuple[int, float]]:
    """The ``n`` most likely tokens of one row as (id, logprob) pairs, most likely first.

    Args:
        logprobs: (V,) float64 from :func:`log_softmax`.
        n: how many (0 gives []).
    """
    if n <= 0:
        return []
    n = min(n, logprobs.shape[0])
    idx = np.argpartition(-logprobs, n - 1)[:n]
    idx = idx[np.argsort(-logprobs[idx], kind="stable")]
    return [(int(i), float(logprobs[i])) for i in idx]


def adjust_logits(
    logits: np.ndarray,
    token_ids: np.ndarray,
    counts: np.ndarray,
    presence_penalty: float,
    frequency_penalty: float,
    bias_ids: Optional[np.ndarray] = None,
    bias_values: Optional[np.ndarray] = None,
) -> np.ndarray:
    """OpenAI's presence/frequency penalties and ``logit_bias`` applied to one row of raw logits.

    The formula of OpenAI's API reference ("frequency and presence penalties"), as vLLM implements it
    (``vllm.model_executor.layers.utils.apply_penalties`` and its logit-bias processor)::

        logits[j] += bias[j] - c[j] * frequency_penalty - (c[j] > 0) * presence_penalty

    where ``c[j]`` is how many times token ``j`` was generated so far in this sequence (the prompt
    does not count). Both terms are additive, so their order does not matter. The result is what
    :func:`sample_token` then divides by the temperature (and argmaxes when greedy).

    Args:
        logits: (V,) float32 raw scores of one row (not modified).
        token_ids: (K,) int64 distinct token ids with ``c[j] > 0`` (each in [0, V)).
        counts: (K,) float or int, ``c[token_ids[i]]`` (>= 1).
        presence_penalty, frequency_penalty: in [-2, 2] (OpenAI's range; not checked here).
        bias_ids: (B,) int64 distinct token ids in [0, V), or None.
        bias_values: (B,) float32 biases (OpenAI: [-100, 100]), or None.
    Returns:
        A new (V,) array of ``logits``' dtype (float32).
    """
    x = np.array(logits, copy=True)
    if token_ids.size and (presence_penalty or frequency_penalty):
        x[token_ids] -= np.asarray(counts, np.float64) * frequency_penalty + presence_penalty
    if bias_ids is not None and bias_ids.size:
        x[bias_ids] += bias_values
    return x


class TokenPenalties:
    """One sequence's penalty state: counts of its generated tokens, kept incrementally.

    :meth:`observe` is O(1) amortised per generated token (a dict lookup and one array write; the
    arrays double when full); :meth:`apply` costs O(distinct generated tokens + biased ids) numpy
    work per step, never a recount of the whole generation. With both penalties 0 and no bias it
    tracks nothing and :meth:`apply` returns its input unchanged (no copy).

    Args:
        presence_penalty, frequency_penalty: OpenAI's, in [-2, 2] (see :func:`adjust_logits`).
        logit_bias: (token id, bias) pairs with distinct ids in [0, V) (validated by the HTTP layer).
    """

    def __init__(
        self,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Iterable[tuple[int, float]] = (),
    ) -> None:
        self.presence_penalty = float(presence_penalty)
        self.frequency_penalty = float(frequency_penalty)
        pairs = list(logit_bias)
        self.bias_ids = np.array([t for t, _ in pairs], np.int64)
        self.bias_values = np.array([b for _, b in pairs], np.float32)
        self.tracking = bool(self.presence_penalty or self.frequency_penalty)
        self.active = self.tracking or bool(pairs)
        self._slot: dict[int, int] = {}  # token id -> index into _ids / _counts
        self._ids = np.zeros(16, np.int64)
        self._counts = np.zeros(16, np.int64)

    def observe(self, token: int) -> None:
        """Count one generated token (call after each step's choice)."""
        if not self.tracking:
            return
        slot = self._slot.get(token)
        if slot is None:
            slot = len(self._slot)
            if slot == self._ids.shape[0]:
                self._ids = np.concatenate([self._ids, np.zeros_like(self._ids)])
                self._counts = np.concatenate([self._counts, np.zeros_like(self._counts)])
            self._slot[token] = slot
            self._ids[slot] = token
        self._counts[slot] += 1

    def counts(self) -> dict[int, int]:
        """``{token id: times generated}`` so far (empty when no penalty is set)."""
        return {t: int(self._counts[s]) for t, s in self._slot.items()}

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """The (V,) float32 row to sample from: ``logits`` adjusted by :func:`adjust_logits` with
        this sequence's counts (``logits`` itself when nothing is set)."""
        if not self.active:
            return logits
        k = len(self._slot)
        return adjust_logits(
            logits,
            self._ids[:k],
            self._counts[:k],
            self.presence_penalty,
            self.frequency_penalty,
            self.bias_ids,
            self.bias_values,
        )
