"""Metric functions comparing a candidate's logits with the reference's, on numpy arrays.

Every function takes logits already restricted to the positions that count (padding removed),
shaped (N, V) float32 with N positions and V the vocabulary, and returns plain Python numbers
so that the report is JSON as is. KL divergences are in nats, computed in float64.

    python -c "import numpy as np; from prodip.conformance.compare import logit_stats; \
a = np.random.randn(4, 8).astype('f4'); print(logit_stats(a, a + 1e-5))"
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from prodip.base.errors import InvalidInput
from prodip.conformance.tolerances import load_tolerances as _load


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64.

    Args:
        logits: (N, V) any float dtype.
    Returns:
        (N, V) float64 log-probabilities (nats).
    """
    x = logits.astype(np.float64, copy=False)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_per_position(ref_logits: np.ndarray, cand_logits: np.ndarray) -> np.ndarray:
    """KL(reference || candidate) at each position, ``sum_v p_ref (log p_ref - log p_cand)``.

    Args:
        ref_logits, cand_logits: (N, V) logits of the same positions.
    Returns:
        (N,) float64 KL in nats, clipped at 0 (rounding can make a ~1e-17 value negative).
    Raises:
        ValueError: shapes differ.
    """
    if ref_logits.shape != cand_logits.shape:
        raise InvalidInput(f"logits shapes differ: reference {ref_logits.shape}, candidate {cand_logits.shape}")
    lp, lq = log_softmax(ref_logits), log_softmax(cand_logits)
    return np.maximum((np.exp(lp) * (lp - lq)).sum(axis=-1), 0.0)


def nll_per_position(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of ``targets`` under ``logits``.

    Args:
        logits: (N, V) next-token logits.
        targets: (N,) int64 the tokens that actually follow.
    Returns:
        (N,) float64 NLL in nats.
    """
    lp = log_softmax(logits)
    return -lp[np.arange(len(targets)), targets]


@dataclass
class LogitAccumulator:
    """Running comparison of candidate vs reference logits over several batches of positions.

    ``add(ref, cand)`` with (N, V) arrays; ``result()`` gives max/mean |Δlogit| (absolute and
    relative to the reference's logit range max-min over all positions seen), mean and
    99.9th-percentile KL(ref || cand) in nats, and top-1 (argmax) agreement as a fraction.
    Non-finite candidate logits count as an infinite difference.
    """

    n_positions: int = 0
    max_abs: float = 0.0
    sum_abs: float = 0.0
    ref_min: float = math.inf
    ref_max: float = -math.inf
    top1_equal: int = 0
    kl: list = field(default_factory=list)

    def add(self, ref: np.ndarray, cand: np.ndarray) -> None:
        if ref.shape != cand.shape:
            raise InvalidInput(f"logits shapes differ: reference {ref.shape}, candidate {cand.shape}")
        if ref.size == 0:
            return
        diff = np.abs(ref.astype(np.float64) - cand.astype(np.float64))
        diff[~np.isfinite(diff)] = math.inf
        n = ref.shape[0]
        self.n_positions += n
        self.max_abs = max(self.max_abs, float(diff.max()))
        self.sum_abs += float(diff.mean(axis=-1).sum())
        self.ref_min = min(self.ref_min, float(ref.min()))
        self.ref_max = max(self.ref_max, float(ref.max()))
        self.top1_equal += int((ref.argmax(-1) == cand.argmax(-1)).sum())
        kl = kl_per_position(ref, cand) if np.isfinite(cand).all() else np.full(n, math.inf)
        self.kl.append(kl)

    def result(self) -> dict[str, float]:
        """Metrics over everything added (``n_positions`` = 0 gives NaNs).

        ``kl_p999`` is ``numpy.percentile(kl, 99.9)`` (linear interpolation).
        """
        if not self.n_positions:
            nan = float("nan")
            return {
                "n_positions": 0,
                "max_abs_logit": nan,
                "mean_abs_logit": nan,
                "rel_max_abs_logit": nan,
                "kl_mean": nan,
                "kl_p999": nan,
                "top1": nan,
            }
        kl = np.concatenate(self.kl)
        with np.errstate(invalid="ignore"):  # inf - inf when interpolating between two inf KLs
            p999 = float(np.percentile(kl, 99.9))
        span = self.ref_max - self.ref_min
        return {
            "n_positions": self.n_positions,
            "max_abs_logit": self.max_abs,
            "mean_abs_logit": self.sum_abs / self.n_positions,
            "rel_max_abs_logit": self.max_abs / span if span > 0 else math.inf,
            "kl_mean": float(kl.mean()),
            "kl_p999": math.inf if math.isnan(p999) else p999,
            "top1": self.top1_equal / self.n_positions,
        }


def logit_stats(ref: np.ndarray, cand: np.ndarray) -> dict[str, float]:
    """One-shot :class:`LogitAccumulator` over (N, V) arrays (see there for the metrics)."""
    acc = LogitAccumulator()
    acc.add(ref.reshape(-1, ref.shape[-1]), cand.reshape(-1, cand.shape[-1]))
    return acc.result()


def identical_prefix(ref_tokens: np.ndarray, cand_tokens: np.ndarray) -> int:
    """Length (tokens) of the longest common prefix of two generated sequences.

    Args:
        ref_tokens, cand_tokens: (N,) int token ids, generated greedily from the same prompt.
    Returns:
        The number of leading positions where both agree (0..min length).
    """
    n = min(len(ref_tokens), len(cand_tokens))
    unequal = np.nonzero(np.asarray(ref_tokens[:n]) != np.asarray(cand_tokens[:n]))[0]
    return int(unequal[0]) if len(unequal) else n


def bits_per_char(nll_nats: float, n_chars: int) -> float:
    """Bits per character: total NLL in nats / ln 2 / characters (Graves 2013, arXiv:1308.0850)."""
    return nll_nats / math.log(2) / max(n_chars, 1)


def check_value(value, tolerance: dict) -> bool:
    """Does ``value`` satisfy ``tolerance`` ({"max": x} and/or {"min": y} and/or {"equals": z})?

    NaN and non-finite values fail a max/min bound; a missing value (None) always fails.

    Raises:
        ValueError: the tolerance has none of the keys max, min, equals.
    """
    if not any(k in tolerance for k in ("max", "min", "equals")):
        raise InvalidInput(f"tolerance {tolerance!r} needs one of max, min, equals")
    if value is None:
        return False
    ok = True
    if "equals" in tolerance:
        ok &= value == tolerance["equals"]
    for key, cmp in (("max", lambda v, t: v <= t), ("min", lambda v, t: v >= t)):
        if key in tolerance:
            v = float(value)
            ok &= math.isfinite(v) and cmp(v, tolerance[key])
    return bool(ok)


def load_tolerances(path) -> dict:
    """Read a tolerance TOML file, strictly validated: ``{candidate: {metric: {"max"|"min"|"equals": value}}}``.

    See :mod:`prodip.conformance.tolerances` for the schema (known tables and metrics, the bound kind of
    each, the checks every table requires).

    Raises:
        FileNotFoundError: no such file.
        ValueError (``prodip.base.config.ConfigError``): not TOML, wrong ``format_version``, an unknown
            table/metric/bound key, a bound of the wrong kind or type, or a missing required check;
            the message names the file, the table and the key.
    """

    return _load(path)
