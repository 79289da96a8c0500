"""Next-token selection from one row of logits: greedy, temperature, top-k, top-p (nucleus).

Pure numpy, one row at a time, with a per-request ``numpy.random.Generator`` so that a request's
samples depend only on its seed, never on what else shares its batch.

    python -c "import numpy as np; from serve.sampling import sample_token; \
print(sample_token(np.array([0., 2., 1.], np.float32), 0.0, 0, 1.0, None))"
"""

from __future__ import annotations

from typing import Optional

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Natural-log probabilities along the last axis, computed in float64 for stable sums.

    Args:
        logits: (..., V) float32 raw model scores.
    Returns:
        (..., V) float64 log-probabilities (nats).
    """
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def make_rng(seed: Optional[int], stream: int = 0) -> np.random.Generator:
    """A private RNG for one sequence: ``seed`` (any int, or None for OS entropy) and ``stream``
    (the choice index, so n>1 choices of one seeded request differ but are reproducible)."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([seed % (1 << 64), stream])


def sample_token(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
                 rng: Optional[np.random.Generator]) -> int:
    """Choose the next token id.

    Greedy (argmax, first index on ties) when ``temperature == 0`` or ``top_k == 1``. Otherwise
    the scores are divided by ``temperature``, restricted to the ``top_k`` largest (ties at the
    k-th value kept; ``top_k <= 0`` = no limit), then to the smallest set of most likely tokens whose
    probability reaches ``top_p`` (Holtzman et al. 2019, arXiv:1904.09751; the top token is always
    kept, so a tiny ``top_p`` is greedy), renormalised, and sampled by inverse CDF with one
    ``rng.random()`` draw.

    Args:
        logits: (V,) float32 raw scores for one row.
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
        raise ValueError(f"temperature must be >= 0 and top_p in (0, 1]; got {temperature}, {top_p}")
    if temperature == 0 or top_k == 1:
        return int(np.argmax(logits))
    x = logits.astype(np.float64) / temperature
    if 0 < top_k < x.shape[0]:
        kth = np.partition(x, -top_k)[-top_k]
        x = np.where(x < kth, -np.inf, x)
    order = np.argsort(-x, kind="stable")
    p = np.exp(x[order] - x[order[0]])
    p /= p.sum()
    if top_p < 1.0:
        n_keep = int(np.searchsorted(np.cumsum(p), top_p, side="left")) + 1
        p = p[:min(n_keep, p.shape[0])]
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
