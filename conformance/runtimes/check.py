"""The runtime axis of conformance as one loop: every ONNX candidate in every on-device runtime chosen, its
greedy ids (and, where the runtime's row has a logits metric, its logits) against ONNX Runtime's on the same file,
judged by the row's rule for the variant (identical, or parted only at a near tie: :mod:`.agreement`).

    python -c "from prodip.conformance.runtimes.check import check_runtimes; help(check_runtimes)"
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from prodip.base.runtimes import Runtime, by_name
from prodip.conformance.compare import check_value, greedy_agreement, kl_per_position, tie_margin
from prodip.conformance.results import Check
from prodip.conformance.runners import TorchRunner
from prodip.conformance.runtimes.adapters import adapter_for
from prodip.conformance.runtimes.agreement import greedy_agrees
from prodip.conformance.runtimes.common import (
    GreedyJob,
    GreedyOutput,
    error_text,
    ort_greedy,
    runner_greedy,
    stop_ids,
    truncate_at_eos,
)

#: fp32 only: ONNX Runtime's ids on the runtime prompts equal the training model's.
REFERENCE_METRIC = "runtime_prompts_reference_identical"


def planned_metrics(variant: str, runtimes: Sequence[str]) -> list[str]:
    """The runtime metrics gated for an ONNX ``variant`` (known before anything runs): each runtime's greedy
    metric, then the logits metrics, then (fp32) the reference check."""
    rows = [by_name(r) for r in runtimes]
    return (
        [r.greedy_metric for r in rows]
        + [r.logits_metric for r in rows if r.logits_metric]
        + ([REFERENCE_METRIC] if variant == "fp32" and runtimes else [])
    )


def logits_agreement(ref: Sequence[np.ndarray], cand: Sequence[Sequence[float]]) -> dict[str, float]:
    """max |logit difference| and mean KL(ref || cand) (nats) over the steps both decoded.

    ``ref``: ONNX Runtime's last-row logits per step; ``cand``: the runtime's, same steps (greedy
    paths that diverge are compared up to the shorter one; the ids check catches the divergence).
    """
    n = min(len(ref), len(cand))
    if n == 0:
        return {"max_abs_logit": math.inf, "kl_mean": math.inf}
    a, b = np.stack(ref[:n]).astype(np.float64), np.asarray(cand[:n], np.float64)
    return {"max_abs_logit": float(np.abs(a - b).max()), "kl_mean": float(kl_per_position(a, b).mean())}


@dataclass
class RuntimeResult:
    """One runtime on one candidate, as the report records it (``candidates.<name>.runtimes.runtimes.<runtime>``).

    ``margin``, ``agrees`` and ``agreement`` say the rule its ids were judged by (the row's ``greedy_margins``
    for the variant, else the tolerance table's tie margin; logits), whether they met it, and where they parted;
    set where the row names a margin for the variant or the ids were not identical, else None (identical ids
    need no rule)."""

    ids_identical: Optional[bool]
    ids: Optional[list[list[int]]]
    error: Optional[str]
    skipped: Optional[str] = None
    dtype: Optional[str] = None
    reference: Optional[str] = None
    logits: Optional[dict[str, float]] = None
    versions: Optional[dict[str, Any]] = None
    margin: Optional[float] = None
    agrees: Optional[bool] = None
    agreement: Optional[str] = None

    @property
    def passed(self) -> bool:
        """Its greedy ids met the row's rule (identical, or parted only at a near tie)."""
        return bool(self.ids_identical if self.agrees is None else self.agrees)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ids_identical": self.ids_identical, "ids": self.ids, "error": self.error}
        for key in ("skipped", "dtype", "reference", "logits", "versions", "margin", "agrees", "agreement"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass
class CandidateRuntimes:
    """Every runtime on one ONNX candidate: the prompts, ONNX Runtime's ids, each runtime's result, and the
    gated checks (one per runtime that ran, its logits check, and for fp32 the training model's ids)."""

    prompts: list[str]
    prompt_ids: list[list[int]]
    onnxruntime: list[list[int]]
    runtimes: dict[str, RuntimeResult] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    reference_identical: Optional[bool] = None

    def to_dict(self) -> dict[str, Any]:
        """The report's ``candidates.<name>.runtimes`` (the checks are the candidate's own)."""
        out: dict[str, Any] = {
            "prompts": self.prompts,
            "prompt_ids": self.prompt_ids,
            "onnxruntime": self.onnxruntime,
            "runtimes": {k: v.to_dict() for k, v in self.runtimes.items()},
        }
        if self.reference_identical is not None:
            out["reference_identical"] = self.reference_identical
        return out


def _decode(name: str, job: GreedyJob, missing: str) -> dict[str, GreedyOutput]:
    """Candidate name -> the runtime ``name``'s output: skipped (or failed, ``missing="fail"``) when it is not
    installed; an exception of its adapter is every candidate's error."""
    adapter = adapter_for(name)
    reason = adapter.available()
    if reason is not None:
        text = f"not installed: {reason.strip()[:300]}"
        return {
            c.name: GreedyOutput(skipped=text) if missing == "skip" else GreedyOutput(error=text)
            for c in job.candidates
        }
    try:
        got = adapter.greedy(job)
    except Exception as err:  # not runnable, node failed: every variant's check fails with it
        return {c.name: GreedyOutput(error=error_text(err)) for c in job.candidates}
    return {c.name: got.get(c.name) or GreedyOutput(error=f"{name}: no result") for c in job.candidates}


def _logits_check(
    row: Runtime, out: GreedyOutput, res: RuntimeResult, ort_logits: list[list[np.ndarray]], table: dict[str, Any]
) -> Check:
    """The runtime's logits vs ONNX Runtime's (or its own reference's), bounded by the variant's ``max_abs_logit``
    where its table has one, else ``kl_mean``; the max over prompts. Sets ``res.logits``."""
    metric = "max_abs_logit" if "max_abs_logit" in table else "kl_mean"
    bound = table.get(metric)
    value = None
    if out.logits is not None and out.error is None:
        ref = out.reference_logits if out.reference_logits is not None else ort_logits
        agreement = [logits_agreement(r, c) for r, c in zip(ref, out.logits)]
        value = max(a[metric] for a in agreement)
        res.logits = {m: max(a[m] for a in agreement) for m in ("max_abs_logit", "kl_mean")}
    passed = value is not None and (bound is None or check_value(value, bound))
    note = res.error or f"{metric} vs ONNX Runtime on the same file, max over prompts"
    return Check(row.logits_metric, value, bound or {}, passed, note)


def _judge(
    row: Runtime,
    variant: str,
    out: GreedyOutput,
    want: list[list[int]],
    ort_logits: list[list[np.ndarray]],
    table: dict[str, Any],
    prompt_lens: Sequence[int],
) -> tuple[RuntimeResult, list[Check]]:
    """One runtime's output on one candidate: its result and its checks (none when it was skipped).

    Its ids agree with its reference's (ONNX Runtime on the file, or the runtime's own) per
    :func:`~prodip.conformance.compare.greedy_agreement`: they may part only where the reference's margin is
    within the row's margin for ``variant`` (``Runtime.greedy_margin``), else the table's
    :func:`~prodip.conformance.compare.tie_margin`; the check's note says where they parted.
    """
    if out.skipped is not None:
        return RuntimeResult(None, None, None, skipped=out.skipped, dtype=out.dtype), []
    ref = out.reference_ids if out.reference_ids is not None else want
    steps = out.reference_logits if out.reference_logits is not None else ort_logits
    res = RuntimeResult(
        out.error is None and out.ids == ref,
        None if out.error else out.ids,
        out.error,
        dtype=out.dtype,
        reference=out.reference,
        versions=out.versions,
    )
    row_margin = row.greedy_margin(variant)
    margin = row_margin if row_margin is not None else tie_margin(table)
    agrees, why = (False, out.error) if out.error else greedy_agrees(ref, out.ids, steps, prompt_lens, margin)
    if row_margin is not None or (out.error is None and not res.ids_identical):
        # the rule decided (the row's margin, or ids that parted): the report says how, and the card's
        # "runtimes proven" reads ``agrees`` as the check does
        res.margin, res.agrees, res.agreement = margin, agrees, why
    checks = [Check(row.greedy_metric, agrees, {"equals": True}, agrees, None if why == "identical" else why)]
    if row.logits_metric:
        checks.append(_logits_check(row, out, res, ort_logits, table))
    return res, checks


def check_runtimes(
    export_dir: Path,
    candidates: Sequence[Any],
    prompts: dict[str, list[int]],
    reference: Any,
    model_cfg: Any,
    runtimes: Sequence[str],
    max_new_tokens: int,
    threads: int = 0,
    missing: str = "skip",
    tolerances: Optional[dict[str, dict[str, Any]]] = None,
) -> dict[str, CandidateRuntimes]:
    """Run every ONNX candidate in each runtime and compare greedy ids with ONNX Runtime's on the same file.

    A runtime that is not installed (its adapter's ``available()``) is, with ``missing="skip"``, listed as
    skipped (``skipped``: the reason) and no check (as the tokenizer's parity check does, and ``make
    RUNTIMES=0`` promises); with ``missing="fail"`` it fails every variant's check.

    Args:
        export_dir: the export dir.
        candidates: the suite's candidates (``kind == "onnx"`` ones are run; ``path`` relative to the dir).
        prompts: prompt name -> token ids (the training tokenizer's encoding, special tokens included);
            cut to ``max_position_embeddings - max_new_tokens`` tokens so that prompt + new tokens fit.
        reference: the training model (``prodip.train.model.LlamaForCausalLM``, fp32, eval).
        model_cfg: its ``ModelConfig`` (layers, kv heads, head dim, eos id).
        runtimes: on-device runtime names (``prodip.base.runtimes.on_device()``; empty: nothing is run).
        max_new_tokens: new tokens per prompt (tokens).
        threads: ONNX Runtime / onnxruntime-genai intra-op threads (0 = library default).
        tolerances: the tolerance file's tables (``candidate.tolerance_table`` -> metric -> bound): a runtime
            with a logits metric is held to the variant's ``max_abs_logit`` (else ``kl_mean``).
    Returns:
        candidate name -> :class:`CandidateRuntimes`. Never raises for a runtime's failure: it is a failed
        check with the error.
    """
    onnx_cands = [c for c in candidates if c.kind == "onnx"]
    if not runtimes or not onnx_cands:
        return {}
    # prompt + new tokens must fit the context (onnxruntime-genai refuses max_length > context_length)
    room = max(1, model_cfg.max_position_embeddings - max_new_tokens)
    names, ids = list(prompts), [list(prompts[k])[:room] for k in prompts]
    eos = stop_ids(export_dir) or [model_cfg.eos_token_id]  # a chat model's: <|eos|> and <|im_end|>
    job = GreedyJob(Path(export_dir), onnx_cands, ids, max_new_tokens, eos, model_cfg, threads)
    ref_logits: list[list[np.ndarray]] = [[] for _ in ids]
    ref_ids = [
        runner_greedy(TorchRunner(reference, "reference"), p, max_new_tokens, eos, s) for p, s in zip(ids, ref_logits)
    ]
    outputs = {name: _decode(name, job, missing) for name in runtimes}
    out: dict[str, CandidateRuntimes] = {}
    for cand in onnx_cands:
        want, ort_logits = ort_greedy(Path(export_dir) / cand.path, cand.name, job)
        table = (tolerances or {}).get(cand.tolerance_table, {})
        entry = CandidateRuntimes(names, ids, want)
        for name in runtimes:
            got = outputs[name][cand.name]
            lens = [len(p) for p in ids]
            entry.runtimes[name], checks = _judge(by_name(name), cand.variant, got, want, ort_logits, table, lens)
            entry.checks += checks
        if cand.variant == "fp32":  # ONNX Runtime's ids vs the training model's, parting only at its near ties
            verdicts = [
                greedy_agreement(truncate_at_eos(r, len(p), eos), w, s, tie_margin(table), len(p))
                for r, w, s, p in zip(ref_ids, want, ref_logits, ids)
            ]
            same = all(v.agreed for v in verdicts)
            parted = "; ".join(f"prompt {i}: {v.reason}" for i, v in enumerate(verdicts) if v.step is not None)
            entry.reference_identical = same
            entry.checks.append(Check(REFERENCE_METRIC, same, {"equals": True}, same, parted or None))
        out[cand.name] = entry
    return out
