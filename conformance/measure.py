"""Measurements on one runner: logits on the input set, greedy decoding, KV-cache and padding checks.

Each function drives a :class:`prodip.conformance.runners.Runner`, so the reference and every
candidate go through exactly the same code. ``measure_candidate`` runs every phase, records a
phase that raises as an error (never a crash), and returns plain numbers for the report.

    python -m prodip.conformance EXPORT_DIR --checkpoint CKPT   # uses these
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from prodip.conformance.compare import (
    LogitAccumulator,
    bits_per_char,
    greedy_agreement,
    heldout_shift,
    identical_prefix,
    logit_stats,
    nll_per_position,
)
from prodip.conformance.inputs import InputSet, Item
from prodip.conformance.runners import Runner


def run_item(runner: Runner, item: Item) -> np.ndarray:
    """Logits (B, T, V) float32 of one item in a single pass (no cache)."""
    return runner.forward(item.input_ids, item.attention_mask, item.position_ids)[0]


def greedy_decode(
    runner: Runner, item: Item, new_tokens: int, step_logits: Optional[list[np.ndarray]] = None
) -> np.ndarray:
    """Greedy decoding with the runner's KV cache: one prefill, then one token per step.

    Args:
        runner: any runner.
        item: left-padded prompts (B, T).
        new_tokens: tokens to generate per row (no stopping at <|eos|>, so lengths are equal).
        step_logits: if given, each step's last-row logits (B, V) float32 are appended to it.
    Returns:
        (B, new_tokens) int64 generated ids.
    """
    mask = item.attention_mask
    logits, state = runner.forward(item.input_ids, mask, item.position_ids)
    nxt = logits[:, -1].argmax(-1).astype(np.int64)
    out = [nxt]
    if step_logits is not None:
        step_logits.append(np.asarray(logits[:, -1], np.float32))
    for _ in range(new_tokens - 1):
        mask = np.concatenate([mask, np.ones((mask.shape[0], 1), np.int64)], axis=1)
        pos = mask.sum(-1, keepdims=True).astype(np.int64) - 1
        logits, state = runner.forward(nxt[:, None], mask, pos, state)
        nxt = logits[:, -1].argmax(-1).astype(np.int64)
        out.append(nxt)
        if step_logits is not None:
            step_logits.append(np.asarray(logits[:, -1], np.float32))
    return np.stack(out, axis=1)


def kv_cache_logits(runner: Runner, ids: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Full recomputation vs incremental decoding of one sequence.

    The sequence (1, L) is fed once whole, and once as a prefill, then a chunk of up to 4
    tokens with past > 0 (a causal mask that ignores the cache offset shows here), then
    ``steps`` single tokens.

    Returns:
        (full (L, V), incremental (L, V)) float32 logits of the same positions.
    """
    L = ids.shape[1]
    steps = max(0, min(steps, L - 2))
    chunk = max(1, min(4, L - steps - 1))
    prefill = L - steps - chunk
    full = runner.forward(ids, np.ones_like(ids), np.arange(L, dtype=np.int64)[None])[0][0]
    parts, state, start = [], None, 0
    for length in [prefill, chunk] + [1] * steps:
        seg = ids[:, start : start + length]
        pos = np.arange(start, start + length, dtype=np.int64)[None]
        logits, state = runner.forward(seg, np.ones((1, start + length), np.int64), pos, state)
        parts.append(logits[0])
        start += length
    return full, np.concatenate(parts, axis=0)


@dataclass
class ReferenceOutputs:
    """What every candidate is compared with, computed once from the reference runner.

    ``greedy``: (B, n) int64 greedy ids; ``greedy_logits``: (B, n, V) float32, the logits each of those
    ids was chosen from (what :func:`prodip.conformance.compare.greedy_agreement` reads where ids part).
    """

    logits: dict[str, np.ndarray]
    greedy: np.ndarray
    nll: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    greedy_logits: Optional[np.ndarray] = None


def heldout_nll(item: Item, logits: np.ndarray) -> float:
    """Total NLL (nats) of an held-out item's targets under ``logits`` (B, T, V)."""
    sel = item.targets >= 0
    return float(nll_per_position(logits[sel], item.targets[sel]).sum())


def reference_outputs(runner: Runner, inputs: InputSet, greedy_tokens: int) -> ReferenceOutputs:
    """Run the reference on every item and decode the greedy batch."""
    t0 = time.perf_counter()
    logits = {item.name: run_item(runner, item) for item in inputs.items}
    nll = {item.lang: heldout_nll(item, logits[item.name]) for item in inputs.items if item.targets is not None}
    steps: list[np.ndarray] = []
    greedy = greedy_decode(runner, inputs.greedy, greedy_tokens, steps)
    return ReferenceOutputs(logits, greedy, nll, time.perf_counter() - t0, np.stack(steps, axis=1))


def _phase_logits(runner: Runner, inputs: InputSet, ref: ReferenceOutputs, out: dict, keep: dict) -> None:
    acc = LogitAccumulator()
    by_input, heldout = {}, {}
    for item in inputs.items:
        cand = run_item(runner, item)
        keep[item.name] = cand
        r, c = ref.logits[item.name][item.valid], cand[item.valid]
        acc.add(r, c)
        s = logit_stats(r, c)
        by_input[item.name] = {k: s[k] for k in ("max_abs_logit", "kl_mean", "top1")}
        if item.targets is not None:
            n_tok = int((item.targets >= 0).sum())
            nll_r, nll_c = ref.nll[item.lang], heldout_nll(item, cand)
            bpc_r, bpc_c = bits_per_char(nll_r, item.n_chars), bits_per_char(nll_c, item.n_chars)
            ppl_r, ppl_c = math.exp(nll_r / n_tok), math.exp(min(nll_c / n_tok, 700.0))
            sel = item.targets >= 0
            shift = heldout_shift(ref.logits[item.name][sel], cand[sel], item.targets[sel])
            heldout[item.lang] = {
                "tokens": n_tok,
                "chars": item.n_chars,
                "bpc_ref": bpc_r,
                "bpc": bpc_c,
                "bpc_delta": bpc_c - bpc_r,
                "ppl_ref": ppl_r,
                "ppl": ppl_c,
                "ppl_rel_delta": ppl_c / ppl_r - 1.0,
                # bpc_delta = bpc_delta_kl + bpc_delta_text (compare.HeldoutShift): what rounding costs on
                # text the reference predicts well, and what comes from where this text departs from it
                "bpc_delta_kl": bits_per_char(shift.kl, item.n_chars),
                "bpc_delta_text": bits_per_char(shift.text, item.n_chars),
                "bpc_delta_text_sd": bits_per_char(shift.text_sd, item.n_chars),
                "entropy_bpc_ref": bits_per_char(shift.ref_entropy, item.n_chars),
                # this language's positions alone: the quality card's per-language KL and top-1
                "kl_mean": s["kl_mean"],
                "kl_p999": s["kl_p999"],
                "top1": s["top1"],
            }
    out.update(acc.result())
    out["by_input"] = by_input
    if heldout:
        out["heldout"] = heldout
        out["bpc_delta_max"] = max(abs(h["bpc_delta"]) for h in heldout.values())


def _phase_greedy(runner: Runner, inputs: InputSet, ref: ReferenceOutputs, out: dict, n: int, tie: float) -> None:
    """Greedy ids vs the reference's: ``greedy_identical`` holds where every row agrees under
    :func:`~prodip.conformance.compare.greedy_agreement` (parting only at a reference margin <= ``tie``);
    ``greedy_partings`` gives each parted row's step, margin and reason."""
    toks = greedy_decode(runner, inputs.greedy, n)
    prefix = [identical_prefix(r, c) for r, c in zip(ref.greedy, toks)]
    steps: list[Any] = list(ref.greedy_logits) if ref.greedy_logits is not None else [[]] * len(toks)
    verdicts = [greedy_agreement(r, c, s, tie) for r, c, s in zip(ref.greedy, toks, steps)]
    out.update(
        greedy_tokens=n,
        greedy_prefix=prefix,
        greedy_prefix_min=min(prefix),
        greedy_identical=all(v.agreed for v in verdicts),
        greedy_tie_margin=tie,
    )
    parted = {str(row): v.to_dict() for row, v in enumerate(verdicts) if v.step is not None or not v.agreed}
    if parted:
        out["greedy_partings"] = parted


def _phase_kv(runner: Runner, inputs: InputSet, out: dict, steps: int) -> None:
    full, inc = kv_cache_logits(runner, inputs.kv_ids, steps)
    s = logit_stats(full, inc)
    out.update(kv_cache_max_abs=s["max_abs_logit"], kv_cache_kl_mean=s["kl_mean"], kv_cache_top1=s["top1"])


def _phase_padded(runner: Runner, inputs: InputSet, out: dict, keep: dict) -> None:
    batch = next(i for i in inputs.items if i.name == "padded_batch")
    padded = keep["padded_batch"] if "padded_batch" in keep else run_item(runner, batch)
    acc = LogitAccumulator()
    for r, row in enumerate(inputs.padded_rows):
        ids = np.asarray([row], np.int64)
        alone = runner.forward(ids, np.ones_like(ids), np.arange(len(row), dtype=np.int64)[None])[0][0]
        acc.add(alone, padded[r][batch.valid[r]])
    s = acc.result()
    out.update(padded_batch_max_abs=s["max_abs_logit"], padded_batch_kl_mean=s["kl_mean"], padded_batch_top1=s["top1"])


def measure_candidate(
    runner: Runner,
    inputs: InputSet,
    ref: ReferenceOutputs,
    *,
    greedy_tokens: int,
    kv_steps: int,
    tie: float = 0.0,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Every metric of one candidate.

    ``tie``: the reference margin (logits) at which greedy ids may part
    (:func:`prodip.conformance.compare.tie_margin` of the candidate's table).

    Returns:
        (metrics, errors): metrics as in the report (see ``conformance/report.py``); errors maps
        a phase name (logits, greedy, kv_cache, padded_batch) to the exception text it raised.
    """
    out: dict[str, Any] = {}
    errors: dict[str, str] = {}
    keep: dict[str, np.ndarray] = {}
    phases = [
        ("logits", lambda: _phase_logits(runner, inputs, ref, out, keep)),
        ("greedy", lambda: _phase_greedy(runner, inputs, ref, out, greedy_tokens, tie)),
        ("kv_cache", lambda: _phase_kv(runner, inputs, out, kv_steps)),
        ("padded_batch", lambda: _phase_padded(runner, inputs, out, keep)),
    ]
    phase_s = {}
    for name, fn in phases:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as err:  # a broken artifact must become a failed check, not a crash
            errors[name] = f"{type(err).__name__}: {str(err).strip()[:400]}"
        phase_s[name] = round(time.perf_counter() - t0, 3)
    out["phase_s"] = phase_s
    return out, errors
