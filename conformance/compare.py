"""Metric functions comparing a candidate's logits with the reference's, on numpy arrays.

Every function takes logits already restricted to the positions that count (padding removed),
shaped (N, V) float32 with N positions and V the vocabulary, and returns plain Python numbers
so that the report is JSON as is. KL divergences are in nats, computed in float64.

    python -c "import numpy as np; from prodip.conformance.compare import logit_stats; \
a = np.random.randn(4, 8).astype('f4'); print(logit_stats(a, a + 1e-5))"
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from prodip.base.errors import InvalidInput
from prodip.base.jsontypes import JSONObject
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


def tie_margin(table: Optional[Mapping[str, object]]) -> float:
    """The reference margin (logits) below which a candidate's greedy ids may part from the reference's.

    Twice the table's ``max_abs_logit`` bound, else 0 (ids must be identical). Why twice: a candidate whose
    every logit is within ε of the reference's can rank token b above the reference's pick a only where
    ``ref[a] - ref[b] <= 2ε``; parting where the reference led by more proves an error over the bound at
    that step, so the rule refuses exactly what the logits bound refuses. fp32 (1e-4) allows 2e-4, float16
    GGUF (5e-2) 0.1; a table without a logits bound (int8, int4 ...) demands identical ids.

    Args:
        table: a tolerance table (metric -> bound), or None.
    Returns:
        The margin in logits, >= 0.
    """
    bound = (table or {}).get("max_abs_logit")
    return 2.0 * float(bound["max"]) if isinstance(bound, dict) and "max" in bound else 0.0


@dataclass(frozen=True)
class GreedyAgreement:
    """The verdict of :func:`greedy_agreement`.

    Attributes:
        agreed: the candidate's ids are the reference's, or parted from them only at a near tie.
        step: the new-token index (0-based, after the prompt) where the ids parted; None if they did not.
        margin: the reference's logit of its own pick minus its logit of the candidate's pick at ``step``
            (the reference's top-2 margin when the candidate took its runner-up), in logits; None if no parting.
        reason: one line for the report naming the step, both ids, the margin and the bound.
    """

    agreed: bool
    step: Optional[int]
    margin: Optional[float]
    reason: str

    def to_dict(self) -> JSONObject:
        return {"agreed": self.agreed, "step": self.step, "margin": self.margin, "reason": self.reason}


def greedy_agreement(
    ref_ids: Sequence[int],
    cand_ids: Sequence[int],
    ref_step_logits: Sequence[np.ndarray],
    tie: float,
    prompt_len: int = 0,
) -> GreedyAgreement:
    """The one rule for comparing greedy ids: the candidate may part from the reference only where the
    reference itself nearly tied, and after parting nothing further is compared.

    Two correct programs round differently (summation order, float16 weights, another kernel); where the
    reference's two best logits are closer than that rounding, either pick is right, and every token after
    it follows from a different prefix. So the ids are walked step by step: equal ids go on; at the first
    difference the reference's margin ``ref[a] - ref[b]`` (a its pick, b the candidate's) is read from its
    logits at that step, and the ids agree iff ``margin <= tie``. ``tie`` comes from the tolerance table
    (:func:`tie_margin`); with ``tie = 0`` only an exact tie is accepted.

    Args:
        ref_ids, cand_ids: token ids, prompt + new tokens (``prompt_len`` > 0) or new tokens only (0).
        ref_step_logits: the reference's next-token logits (V,) at each new step, as it decoded (step i
            chose ``ref_ids[prompt_len + i]``); only the step where the ids part is read.
        tie: the margin in logits (>= 0).
        prompt_len: tokens of the prompt at the start of both sequences (they must be equal).
    Returns:
        A :class:`GreedyAgreement`. Different prompts, a parting step without reference logits or an id
        outside them, and sequences that agree but have different lengths (one stopped, one went on) are
        refused.
    Raises:
        ValueError (``InvalidInput``): ``tie`` negative or not finite.
    """
    if not (math.isfinite(tie) and tie >= 0):
        raise InvalidInput(f"greedy tie margin must be a finite number >= 0, got {tie!r}")
    want, got = [int(i) for i in ref_ids], [int(i) for i in cand_ids]
    if want[:prompt_len] != got[:prompt_len]:
        return GreedyAgreement(False, None, None, "the prompts' ids differ")
    for step, (a, b) in enumerate(zip(want[prompt_len:], got[prompt_len:])):
        if a == b:
            continue
        if step >= len(ref_step_logits):
            return GreedyAgreement(False, step, None, f"parted at new token {step}: no reference logits there")
        row = np.asarray(ref_step_logits[step], np.float64)
        if not 0 <= b < row.shape[-1]:
            return GreedyAgreement(False, step, None, f"parted at new token {step}: id {b} outside the vocabulary")
        margin = float(row[a] - row[b])
        ok = margin <= tie
        verdict = "a near tie" if ok else "a clear choice"
        return GreedyAgreement(
            ok,
            step,
            margin,
            f"parted at new token {step}: reference {a} vs {b}, reference margin {margin:.3g} "
            f"({verdict}; tie margin {tie:.3g})",
        )
    if len(want) != len(got):
        return GreedyAgreement(False, None, None, f"same ids but lengths differ: {len(want)} vs {len(got)}")
    return GreedyAgreement(True, None, None, "identical ids")


@dataclass(frozen=True)
class HeldoutShift:
    """How a candidate's held-out NLL differs from the reference's, split into two parts (nats, summed).

    At position t with reference log-probabilities ``lp``, candidate ``lq`` and the token ``y`` that
    follows in the text, let ``d = lq - lp`` (a vector over the vocabulary). The candidate's NLL minus the
    reference's is ``-d[y]``, which is exactly ``KL_t + M_t`` with ``KL_t = -E_p[d]`` = KL(p || q) (>= 0)
    and ``M_t = -(d[y] - E_p[d])``. If the text were drawn from the reference itself, ``M_t`` would have
    mean 0 and variance ``Var_p(d)`` at each step, and since the ``M_t`` are then martingale differences
    the variance of their sum is the sum of those variances. So ``kl`` is the shift rounding costs on text
    the reference predicts well (what the KL gates already bound), and ``text`` is the part that comes from
    where the text departs from the reference's own predictions: on a language the reference predicts
    badly (held-out NLL far above its own entropy) it is large, of either sign, even when ``kl`` is small.

    Attributes:
        nll_delta: candidate NLL - reference NLL over the targets (nats) = ``kl + text``.
        kl: sum of KL(p || q) over the targets (nats).
        text: sum of ``M_t`` (nats).
        text_sd: sqrt(sum of Var_p(d)): ``text``'s standard deviation on text drawn from the reference (nats).
        ref_entropy: sum of the reference's entropy H(p) over the targets (nats); the reference's NLL
            minus this is its calibration gap on the text (0 in expectation on its own samples).
    """

    nll_delta: float
    kl: float
    text: float
    text_sd: float
    ref_entropy: float


def heldout_shift(ref_logits: np.ndarray, cand_logits: np.ndarray, targets: np.ndarray) -> HeldoutShift:
    """:class:`HeldoutShift` of the candidate against the reference at the positions given.

    Args:
        ref_logits, cand_logits: (N, V) next-token logits at the N scored positions.
        targets: (N,) int64 the tokens that follow in the text.
    Returns:
        The decomposition, in nats summed over the N positions (float64 arithmetic).
    Raises:
        InvalidInput: shapes differ.
    """
    if ref_logits.shape != cand_logits.shape or ref_logits.shape[:1] != targets.shape:
        raise InvalidInput(
            f"shapes differ: reference {ref_logits.shape}, candidate {cand_logits.shape}, targets {targets.shape}"
        )
    at_y, mean_d, var_d, entropy = [], [], [], 0.0
    for lo in range(0, len(targets), _ROWS):  # a few float64 (rows, V) arrays at a time: V is 150k for some bases
        lp, lq = log_softmax(ref_logits[lo : lo + _ROWS]), log_softmax(cand_logits[lo : lo + _ROWS])
        p = np.exp(lp)
        d = lq - lp
        m = (p * d).sum(axis=-1)  # E_p[d] = -KL(p || q)
        mean_d.append(m)
        var_d.append(np.maximum((p * d * d).sum(axis=-1) - m * m, 0.0))
        at_y.append(d[np.arange(len(d)), targets[lo : lo + _ROWS]])
        entropy -= float((p * lp).sum())
    y, m, v = np.concatenate(at_y), np.concatenate(mean_d), np.concatenate(var_d)
    return HeldoutShift(
        nll_delta=float(-y.sum()),
        kl=float(-m.sum()),
        text=float(-(y - m).sum()),
        text_sd=float(np.sqrt(v.sum())),
        ref_entropy=entropy,
    )


#: Positions per chunk in :func:`heldout_shift`.
_ROWS = 128


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
