"""Training guards: the gradient-flow arbiter and its siblings, usable on any ``nn.Module``.

Defects that pass every loss-curve inspection (a fused op with no backward, a frozen layer, a
parameter left out of the optimizer, NaN from an op's backward, accumulation without loss
normalisation) are caught here before they cost a GPU-day:

- :func:`check_gradient_flow`: one forward/backward on a real batch; every trainable parameter
  has a finite, nonzero gradient, and no parameter is unexpectedly frozen.
- :func:`check_update_flow`: one optimizer step changes every trainable parameter and keeps it
  finite; every trainable parameter is in exactly one optimizer param group. Snapshots and
  restores model, optimizer, scheduler and RNG state, so the trainer can run it before step 1
  without perturbing training (bitwise).
- :func:`check_finite`: the per-step NaN/inf check, one fused ``isfinite`` on the loss and the
  grad norm the trainer already has (one device sync, not one per parameter).
- :func:`check_accumulation`: gradients of N accumulated micro-batches equal those of one batch
  N times the size (a missing ``/ N`` shows as a gradient-norm ratio of exactly N; micro-batches
  weighed equally instead of by their trained tokens, as a relative difference). The trainer runs
  it before step 1 whenever it accumulates (:func:`prodip.train.trainer._run_guards`), on the run's
  own batches: pretraining windows and packed chat rows alike.

Parameter names are reported without ``torch.compile`` (``_orig_mod.``) and DDP (``module.``)
prefixes, i.e. as the checkpoint/export keys.

    python -m pytest tests/train/test_guards.py -q
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from prodip.base.errors import StageFailed

_WRAPPER_PREFIXES = ("_orig_mod.", "module.")


class GuardError(StageFailed):
    """A training guard found a defect; the message names every offending parameter (a RuntimeError)."""

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


class NonFiniteError(GuardError):
    """The loss or the gradient norm is NaN/inf at some step (raised by :func:`check_finite`)."""


# ---- names and parameters ------------------------------------------------------------------


def clean_name(name: str) -> str:
    """Strip ``torch.compile`` (``_orig_mod.``) and DDP/FSDP-wrapper (``module.``) prefixes.

    Only leading wrapper prefixes are removed (in any nesting order), so a user module that is
    itself called ``module`` deep inside the model keeps its name.
    """
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix) :], True
    return name


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(clean name, parameter)`` for each parameter with ``requires_grad``, tied ones once."""
    return [(clean_name(n), p) for n, p in model.named_parameters() if p.requires_grad]


def _rng_devices() -> list[int]:
    return [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []


@contextlib.contextmanager
def _preserved_grads(params: Iterable[nn.Parameter]) -> Iterator[None]:
    """Set ``.grad`` to None for the block, then put the caller's gradients back."""
    params = list(params)
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, g in zip(params, saved):
            p.grad = g


# ---- gradient flow -------------------------------------------------------------------------


@dataclass
class GradientFlowReport:
    """Result of :func:`check_gradient_flow`.

    Attributes:
        loss: the probe loss (float, whatever unit ``loss_fn`` returns; nats for cross-entropy).
        grad_norms: clean parameter name -> L2 norm of its gradient (NaN when there is none).
        problems: clean parameter name -> what is wrong ("no gradient ...", "zero gradient",
            "non-finite gradient ...", "frozen ...").
    """

    loss: float
    grad_norms: dict[str, float] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        head = (
            f"gradient flow: {len(self.grad_norms)} trainable parameters, loss {self.loss:.4g}, "
            f"{len(self.problems)} problem(s)"
        )
        return "\n".join([head] + [f"  {name}: {why}" for name, why in self.problems.items()])


def check_gradient_flow(
    model: nn.Module,
    loss_fn: Callable[[nn.Module], torch.Tensor],
    *,
    frozen_ok: Iterable[str] = (),
    raise_on_error: bool = True,
) -> GradientFlowReport:
    """One forward/backward; every trainable parameter must get a finite, nonzero gradient.

    The gradients the caller had are restored afterwards and the global RNG state is forked, so
    running the check before step 1 changes neither the model, nor its gradients, nor the
    random stream (buffers updated by ``forward``, e.g. BatchNorm statistics, are not restored;
    the Llama model has none). Works on eager, ``torch.compile``-d and DDP-wrapped modules; under
    DDP every rank must call it (the backward all-reduces).

    Semantics of "frozen": prodip trains every parameter, so a parameter with
    ``requires_grad=False`` is a problem unless its clean name matches a ``frozen_ok`` pattern.

    Args:
        model: any module (possibly wrapped by ``torch.compile`` / DDP).
        loss_fn: ``loss_fn(model) -> scalar tensor`` running the forward on a real batch, e.g.
            :func:`causal_lm_loss_fn`.
        frozen_ok: ``fnmatch`` patterns of clean names that are meant to be frozen.
        raise_on_error: raise :class:`GuardError` on any problem (else just return the report).

    Returns:
        The :class:`GradientFlowReport`.

    Raises:
        GuardError: the loss is not a scalar that requires grad, or any parameter has no
            gradient, a zero-norm gradient, a non-finite gradient, or is unexpectedly frozen.
    """
    params = trainable_parameters(model)
    if not params:
        raise GuardError("gradient flow: the model has no trainable parameters")
    frozen_ok = tuple(frozen_ok)
    problems: dict[str, str] = {}
    for name, p in model.named_parameters():
        name = clean_name(name)
        if not p.requires_grad and not any(fnmatch.fnmatchcase(name, pat) for pat in frozen_ok):
            problems[name] = "frozen (requires_grad=False) in a model being trained"
    with _preserved_grads(p for _, p in params), torch.random.fork_rng(devices=_rng_devices()):
        loss = loss_fn(model)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise GuardError(f"gradient flow: loss_fn must return a scalar tensor, got {loss!r}")
        if not loss.requires_grad:
            raise GuardError(
                "gradient flow: the loss does not require grad: the whole graph is "
                "detached (forward under torch.no_grad, or a fused op without backward)"
            )
        loss.backward()
        norms = _grad_norms(params)
        report = GradientFlowReport(loss=float(loss.detach()), grad_norms={}, problems=problems)
        for (name, p), norm in zip(params, norms):
            report.grad_norms[name] = norm
            if p.grad is None:
                problems[name] = (
                    "no gradient: not reached by backward (output detached, fused op "
                    "without backward, or parameter unused)"
                )
            elif not math.isfinite(norm):
                g = p.grad.detach()
                problems[name] = (
                    f"non-finite gradient ({int(g.isnan().sum())} NaN, {int(g.isinf().sum())} inf of {g.numel()})"
                )
            elif norm == 0.0:
                problems[name] = "zero gradient (norm 0): the path to the loss is cut or multiplied by 0"
    if not math.isfinite(report.loss):
        problems["<loss>"] = f"non-finite loss {report.loss}"
    if problems and raise_on_error:
        raise GuardError(report.format(), report)
    return report


def _full(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor: an FSDP2-sharded DTensor is all-gathered (every rank calls this in the same order)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def _grad_norms(params: list[tuple[str, nn.Parameter]]) -> list[float]:
    """L2 norm of each parameter's gradient (NaN for none), computed with one device sync."""
    have = [_full(p.grad.detach()).float().norm() for _, p in params if p.grad is not None]
    values = iter(torch.stack(have).cpu().tolist() if have else [])
    return [next(values) if p.grad is not None else math.nan for _, p in params]


def causal_lm_loss_fn(tokens: torch.Tensor) -> Callable[[nn.Module], torch.Tensor]:
    """A ``loss_fn`` for the guards: mean next-token cross-entropy (nats/token) of a causal LM.

    Args:
        tokens: (B, T+1) int64 token ids on the model's device; inputs are ``tokens[:, :-1]``,
            targets ``tokens[:, 1:]``.
    """

    def loss_fn(model: nn.Module) -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())

    return loss_fn


# ---- update flow ---------------------------------------------------------------------------


@dataclass
class UpdateFlowReport:
    """Result of :func:`check_update_flow`.

    Attributes:
        max_abs_update: clean parameter name -> max |p_after - p_before| over its elements.
        problems: clean parameter name -> what is wrong ("not in any optimizer param group",
            "in param groups [0, 1]", "unchanged after one step", "non-finite after one step").
        restored: whether model/optimizer/scheduler/RNG state were put back after the probe step.
    """

    max_abs_update: dict[str, float] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    restored: bool = True

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        head = f"update flow: {len(self.max_abs_update)} trainable parameters, {len(self.problems)} problem(s)"
        return "\n".join([head] + [f"  {name}: {why}" for name, why in self.problems.items()])


def optimizer_membership(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, str]:
    """Check that every trainable parameter is in exactly one optimizer param group (by identity).

    Returns:
        clean name (or ``"<optimizer group g, index i>"`` for a tensor the optimizer holds that is
        not a trainable parameter of ``model``) -> problem; empty when all is well.
    """
    groups_of: dict[int, list[int]] = {}
    foreign: dict[str, str] = {}
    trainable = {id(p) for _, p in trainable_parameters(model)}
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            groups_of.setdefault(id(p), []).append(g)
            if id(p) not in trainable:
                foreign[f"<optimizer group {g}, index {i}>"] = (
                    f"optimizer holds a tensor {tuple(p.shape)} that is not a trainable parameter of "
                    "the model (stale model, or a frozen parameter)"
                )
    problems: dict[str, str] = {}
    for name, p in trainable_parameters(model):
        groups = groups_of.get(id(p), [])
        if not groups:
            problems[name] = "not in any optimizer param group: it will never be updated"
        elif len(groups) > 1:
            problems[name] = f"in optimizer param groups {groups}: it is updated {len(groups)} times per step"
    problems.update(foreign)
    return problems


@dataclass
class _Snapshot:
    tensors: list[tuple[torch.Tensor, torch.Tensor]]  # (live tensor, saved copy)
    grads: list[Optional[torch.Tensor]]
    optimizer: dict
    scheduler: Optional[dict]
    lrs: list[Any]


def _snapshot(model: nn.Module, optimizer, scheduler) -> _Snapshot:
    live = [p for p in model.parameters()] + [b for b in model.buffers()]
    tensors = [(t, t.detach().clone()) for t in live]
    return _Snapshot(
        tensors=tensors,
        grads=[p.grad for p in model.parameters()],
        optimizer=copy.deepcopy(optimizer.state_dict()),
        scheduler=copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None,
        lrs=[g["lr"] for g in optimizer.param_groups],
    )


def _restore(snap: _Snapshot, model: nn.Module, optimizer, scheduler) -> None:
    with torch.no_grad():
        for live, saved in snap.tensors:
            live.copy_(saved)
    for p, g in zip(model.parameters(), snap.grads):
        p.grad = g
    optimizer.load_state_dict(copy.deepcopy(snap.optimizer))
    for group, lr in zip(optimizer.param_groups, snap.lrs):
        group["lr"] = lr
    if scheduler is not None:
        scheduler.load_state_dict(snap.scheduler)


def check_update_flow(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step_fn: Callable[[nn.Module, torch.optim.Optimizer], Any],
    *,
    scheduler: Any = None,
    probe_lr: Optional[float] = None,
    restore: bool = True,
    raise_on_error: bool = True,
) -> UpdateFlowReport:
    """After one optimizer step every trainable parameter changed and stayed finite, and every
    trainable parameter is in exactly one optimizer param group.

    Design: with ``restore=True`` (default) the model's parameters and buffers, gradients,
    optimizer state (Adam moments, step counts), learning rates, ``scheduler`` state and the
    global RNG are snapshotted before ``step_fn`` and put back after it, so the probe step leaves
    no trace and training after the check is bitwise identical to training without it. Cost: one
    copy of the parameters and of the optimizer state in device memory, once per run. With
    ``restore=False`` the probe step is kept (it counts as a real training step).

    Args:
        model: the (possibly compiled/DDP-wrapped) module being trained.
        optimizer: its optimizer.
        step_fn: ``step_fn(model, optimizer)`` does one full step: zero_grad, forward, backward,
            optimizer.step() (scheduler stepping is allowed; pass ``scheduler`` to restore it).
        scheduler: an LR scheduler with ``state_dict``/``load_state_dict``, restored with the rest.
        probe_lr: learning rate for every group during the probe step. Use it when the schedule
            starts at lr 0 (linear warmup from 0), where no parameter would change.
        restore: put everything back after the probe (see above).
        raise_on_error: raise :class:`GuardError` on any problem.

    Raises:
        GuardError: a parameter is in no group or in several, the optimizer holds foreign
            tensors, or a parameter is unchanged or non-finite after the step.
    """
    params = trainable_parameters(model)
    if not params:
        raise GuardError("update flow: the model has no trainable parameters")
    report = UpdateFlowReport(problems=optimizer_membership(model, optimizer), restored=restore)
    snap = _snapshot(model, optimizer, scheduler)
    before = {id(live): saved for live, saved in snap.tensors}
    try:
        with torch.random.fork_rng(devices=_rng_devices(), enabled=restore):
            if probe_lr is not None:
                for group in optimizer.param_groups:
                    group["lr"] = probe_lr
            step_fn(model, optimizer)
        with torch.no_grad():
            deltas = [(_full(p.detach()) - _full(before[id(p)])).abs().max().float() for _, p in params]
            finite = [torch.isfinite(_full(p.detach())).all() for _, p in params]
            deltas = torch.stack(deltas).float().cpu().tolist()
            finite = torch.stack(finite).cpu().tolist()
        for (name, _), delta, fin in zip(params, deltas, finite):
            report.max_abs_update[name] = delta
            if not fin:
                report.problems[name] = "non-finite after one optimizer step"
            elif delta == 0.0 and name not in report.problems:
                report.problems[name] = (
                    "unchanged after one optimizer step (no gradient, lr 0, or not in the optimizer)"
                )
    finally:
        if restore:
            _restore(snap, model, optimizer, scheduler)
    if report.problems and raise_on_error:
        raise GuardError(report.format(), report)
    return report


# ---- per-step finiteness -------------------------------------------------------------------


def check_finite(
    loss: torch.Tensor, grad_norm: Optional[torch.Tensor] = None, *, step: int, model: Optional[nn.Module] = None
) -> None:
    """Per-step NaN/inf check of the loss and the total gradient norm.

    Cheap: one fused ``isfinite`` over the (already computed) loss and grad-norm scalars and one
    device sync; the gradient norm from ``torch.nn.utils.clip_grad_norm_`` is non-finite iff some
    gradient element is. Only on failure, if ``model`` is given, the parameters with non-finite
    gradients are looked up (one pass) and named. Call it after clipping and before
    ``optimizer.step()``, so a bad step never touches the weights; the trainer then stops
    without writing a checkpoint, leaving the last good one untouched.

    Args:
        loss: scalar tensor (any device), the step's loss (nats/token for cross-entropy).
        grad_norm: scalar tensor, total L2 norm of the gradients (``clip_grad_norm_``'s return).
        step: the optimizer step number, for the message.
        model: optional; named in the message on failure.

    Raises:
        NonFiniteError: the loss or the gradient norm is NaN or inf.
    """
    values = (
        loss.detach().reshape(1)
        if grad_norm is None
        else torch.stack([loss.detach().reshape(()).float(), grad_norm.detach().reshape(()).float().to(loss.device)])
    )
    if bool(torch.isfinite(values).all()):
        return
    loss_v = float(loss.detach())
    parts = [f"step {step}: non-finite training state: loss {loss_v}"]
    if grad_norm is not None:
        parts.append(f"grad norm {float(grad_norm)}")
    if model is not None:
        bad = [
            clean_name(n)
            for n, p in model.named_parameters()
            if p.grad is not None and not bool(torch.isfinite(p.grad).all())
        ]
        if bad:
            shown = ", ".join(bad[:10]) + (f" (+{len(bad) - 10} more)" if len(bad) > 10 else "")
            parts.append(f"non-finite gradients in {len(bad)} parameter(s): {shown}")
    parts.append(
        "stopping; the last saved checkpoint is untouched (lower lr, check data and the "
        "ops named above, then resume with `prodip train --resume`)"
    )
    raise NonFiniteError("; ".join(parts))


# ---- gradient accumulation -----------------------------------------------------------------


@dataclass
class AccumulationReport:
    """Result of :func:`check_accumulation`.

    Attributes:
        norm_ratio: ||g_accumulated|| / ||g_one_batch|| over all parameters (1.0 when right;
            exactly N when the micro-batch losses are summed without dividing by N).
        max_abs_diff: max |g_accumulated - g_one_batch| over all elements.
        worst: clean name of the parameter with the largest relative difference.
        rel_diff: ||g_accumulated - g_one_batch|| / ||g_one_batch|| over all parameters.
    """

    norm_ratio: float
    max_abs_diff: float
    worst: str
    ok: bool
    rel_diff: float = 0.0


def check_accumulation(
    model: nn.Module,
    one_batch_backward: Callable[[nn.Module], Any],
    accumulated_backward: Callable[[nn.Module], Any],
    *,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    max_rel_diff: Optional[float] = None,
    raise_on_error: bool = True,
) -> AccumulationReport:
    """Gradients of N accumulated micro-batches must equal those of one batch N times the size.

    Each callable runs the backward pass(es) of the same examples, populating ``.grad``: the first
    on the whole batch at once, the second the way the trainer accumulates (``(loss / N).backward()``
    per micro-batch, with ``no_sync`` under DDP). No optimizer step is taken; the caller's
    gradients and the RNG are restored. Use a batch whose micro-batches hold the same number of
    target tokens, or the trainer's token-weighted normalisation, so that "one batch" is defined
    (:func:`prodip.train.loop.train_step`: the loss of one batch is the mean over its trained targets).

    Args:
        model: the module (fp32 on CPU recommended: the comparison is to ``rtol``/``atol``).
        one_batch_backward: ``f(model)`` doing backward on the whole batch.
        accumulated_backward: ``f(model)`` doing the trainer's accumulated backward passes.
        rtol, atol: tolerance of ``torch.allclose`` per parameter gradient.
        max_rel_diff: instead of ``allclose``, accept when the relative L2 difference over all
            gradients is at most this (for bf16 autocast or TF32 matmuls, whose rounding differs
            between a batch and its micro-batches element by element).
        raise_on_error: raise :class:`GuardError` when the gradients differ.

    Raises:
        GuardError: the gradients differ (the message gives the norm ratio: N means the loss is
            not divided by the number of micro-batches).
    """
    params = trainable_parameters(model)

    def grads_of(fn: Callable[[nn.Module], Any]) -> list[torch.Tensor]:
        with _preserved_grads(p for _, p in params), torch.random.fork_rng(devices=_rng_devices()):
            fn(model)
            return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for _, p in params]

    ref, acc = grads_of(one_batch_backward), grads_of(accumulated_backward)
    ref_norm = torch.linalg.vector_norm(torch.stack([g.float().norm() for g in ref])).item()
    acc_norm = torch.linalg.vector_norm(torch.stack([g.float().norm() for g in acc])).item()
    diffs = [(a - r).abs().max().item() for a, r in zip(acc, ref)]
    rel = [d / (r.abs().max().item() + 1e-30) for d, r in zip(diffs, ref)]
    worst = params[max(range(len(rel)), key=rel.__getitem__)][0] if params else ""
    diff_norm = torch.linalg.vector_norm(torch.stack([(a - r).float().norm() for a, r in zip(acc, ref)])).item()
    rel_diff = diff_norm / ref_norm if ref_norm else (0.0 if diff_norm == 0 else math.inf)
    if max_rel_diff is None:
        ok = all(torch.allclose(a, r, rtol=rtol, atol=atol) for a, r in zip(acc, ref))
    else:
        ok = rel_diff <= max_rel_diff
    report = AccumulationReport(
        norm_ratio=acc_norm / ref_norm if ref_norm else math.inf,
        max_abs_diff=max(diffs, default=0.0),
        worst=worst,
        ok=ok,
        rel_diff=rel_diff,
    )
    if not ok and raise_on_error:
        raise GuardError(
            f"gradient accumulation: accumulated gradients differ from one batch of the same examples "
            f"(relative difference {rel_diff:.3g}, norm ratio {report.norm_ratio:.4f}, max abs diff "
            f"{report.max_abs_diff:.3g}, worst parameter {worst}); a ratio equal to the number of micro-batches "
            "means the micro-batch losses are not divided by it, another difference that micro-batches are not "
            "weighed by their trained (not -100) targets",
            report,
        )
    return report
