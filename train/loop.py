"""The training step and its pieces: AdamW groups, warmup + cosine lr, accumulation, clipping, MFU.

Plain PyTorch, nothing hidden: ``train_step`` runs N micro-batches (each weighted by its share of
the step's trained target tokens, so the gradient equals that of one N-times-bigger batch), clips,
checks finiteness, steps.

    python -c "from prodip.train.loop import lr_at; print([round(lr_at(s, lr=1e-3, min_lr=1e-4, warmup_steps=2, total_steps=10), 5) for s in range(10)])"
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from prodip.train.guards import check_finite as _check
from prodip.train.loss import IGNORE_INDEX

# Peak dense bf16 tensor-core throughput (FLOP/s, no sparsity) by device-name substring; first
# match wins, so more specific names come first. Sources: NVIDIA datasheets - H100 SXM5/H200
# 989.4 TFLOPS, H100 PCIe 756 TFLOPS (H100 datasheet, 2023; H200 datasheet, 2024), A100 312
# TFLOPS (A100 datasheet, 2021), L40S 362.05 TFLOPS, L4 121 TFLOPS, A10 125 TFLOPS (product
# datasheets), B200 2.25 PFLOPS dense (DGX B200 datasheet, 72 PF sparse FP8/8 GPUs, bf16 = 1/4).
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100", 989.4e12),
    ("H200", 989.4e12),
    ("GH200", 989.4e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362.05e12),
    ("L4", 121e12),
    ("A10", 125e12),
)


def peak_flops(device: torch.device) -> Optional[float]:
    """Peak dense bf16 FLOP/s of a CUDA device from :data:`PEAK_BF16_FLOPS`; ``None`` if unknown/CPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS if key in name), None)


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup then cosine to ``min_lr``.

    Warmup: ``lr * (step + 1) / warmup_steps`` for ``step < warmup_steps`` (never 0, so step 0
    already moves every parameter). Then ``min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * p))``
    with ``p`` going 0 -> 1 over the remaining steps (Loshchilov & Hutter 2017, SGDR,
    arXiv:1608.03983; the schedule of nanoGPT's ``get_lr``).
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on 2-D+ weights (matmuls, embeddings), none on norms/biases.

    Each trainable parameter appears exactly once (tied weights are one Parameter).
    """
    seen, decay, no_decay = set(), [], []
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(
    model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float], eps: float, device: torch.device
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`, the fused CUDA kernel on GPU, the foreach path on CPU."""
    fused = device.type == "cuda"
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=eps, fused=fused or None)


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats/token.

    Args:
        logits: (B, T, V) any float dtype (upcast to fp32 for the softmax).
        targets: (B, T) int64.
    """
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    lr: float,
    grad_clip: float,
    device: torch.device,
    autocast_dtype: Optional[torch.dtype],
    step: int = 0,
    check_finite: bool = True,
    num_micro_batches: Optional[int] = None,
) -> dict[str, float]:
    """One optimizer step over N micro-batches.

    Token-weighted accumulation: the step's loss is the sum of the per-token losses of every
    trained target (targets not -100) in all N micro-batches on all ranks, divided by the number
    of those targets, G. So the gradient is exactly that of one batch holding all the rows, however
    unequally the trained targets fall between micro-batches and ranks (packed chat rows: a row
    with 3 assistant tokens weighs 3, one with 25 weighs 25; dividing each micro-batch's mean by N
    would weigh them equally, huggingface/transformers #24725). G is known only after the last
    micro-batch (and, across ranks, after an all-reduce), so micro-batch i's mean loss is scaled by
    ``n_i / D`` before ``backward`` with ``D = N x`` its target positions (the same on every rank),
    and the accumulated gradient by ``world_size x D / G`` after (DDP and FSDP2 average over
    ranks): exactly 1 when every target counts (pretraining windows), where it is skipped. Under
    DDP only the last micro-batch all-reduces (``no_sync``; FSDP2: ``set_requires_gradient_sync``).

    The loss is ``model(x, labels=y)``: the model computes it inside its forward, so it is part of
    a compiled graph (:meth:`prodip.train.model.LlamaForCausalLM.forward`). Micro-batch i+1 is
    drawn from ``micro_batches`` and its host-to-device copy queued (non-blocking; it overlaps
    only from pinned memory) right after micro-batch i's forward and backward were queued, so a
    lazy iterator (the trainer passes a generator over its loader) reads the next batch while
    the device computes, as nanoGPT's training loop does.

    Args:
        model: the (possibly compiled / DDP- or FSDP2-wrapped) model; ``model(x, labels=y)`` ->
            () loss in nats/token.
        optimizer: its optimizer; ``lr`` is written into every group.
        micro_batches: N pairs (inputs (B, T) int64, targets (B, T) int64), or packed chat rows
            (:func:`batch_loss`), any device; a sequence or a lazy iterator.
        lr: learning rate for this step.
        grad_clip: clip the global L2 gradient norm to this (<= 0: no clipping, norm still measured).
        device: where the model lives.
        autocast_dtype: ``torch.bfloat16`` for mixed precision on CUDA, ``None`` for fp32.
        step: 0-based step number, for error messages.
        check_finite: stop on a NaN/inf loss or gradient before the weights are touched.
        num_micro_batches: N; needed when ``micro_batches`` has no ``len``.

    Returns:
        {"loss": mean loss over the trained targets of all micro-batches and ranks (nats/token),
        "grad_norm": pre-clip L2 norm (of the token-weighted gradient), "lr": lr,
        "trained_tokens": G (all ranks)}.
    Raises:
        train.guards.NonFiniteError: NaN/inf loss or gradient (the optimizer step is skipped).
    """
    n = len(micro_batches) if num_micro_batches is None else num_micro_batches  # type: ignore[arg-type]
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = torch.zeros((), dtype=torch.float64, device=device)  # summed per-token losses (nats)
    batches = iter(micro_batches)
    nxt, count = _draw(batches, device)
    scale_d = n * nxt[1].numel()  # D: target positions of the step on one rank
    local = 0
    for i in range(n):
        batch, n_i = nxt, count
        last = i == n - 1
        with _grad_sync(model, last):
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                mean = batch_loss(model, batch)
                loss = mean * (n_i / scale_d)
            loss.backward()
        if not last:
            nxt, count = _draw(batches, device)
        total += mean.detach().double() * n_i
        local += n_i
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world > 1:  # G over all ranks, and the logged loss is the whole batch's, not rank 0's share
        both = torch.stack([total, torch.tensor(float(local), dtype=torch.float64, device=device)])
        dist.all_reduce(both)
        total, trained = both[0], int(both[1].item())
    else:
        trained = local
    params = [p for g in optimizer.param_groups for p in g["params"]]
    factor = world * scale_d / max(trained, 1)
    if factor != 1.0:  # exactly 1 when every target position counts (pretraining)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(factor)
    total = (total / max(trained, 1)).float()
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    if isinstance(grad_norm, DTensor):  # FSDP2: already reduced over the mesh; a plain tensor here
        grad_norm = grad_norm.full_tensor()
    if check_finite:
        _check(total, grad_norm, step=step, model=model)
    # Read the scalars before optimizer.step: they are ready (the finite check synced on them), so
    # the host does not wait for the optimizer kernels and can queue the next step behind them.
    loss_v, norm_v = torch.stack([total, grad_norm.to(total.device)]).tolist()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss_v, "grad_norm": norm_v, "lr": lr, "trained_tokens": trained}


def _draw(batches, device: torch.device) -> tuple[tuple[torch.Tensor, ...], int]:
    """The next micro-batch on ``device`` and its trained targets (not -100), counted on the host
    copy the loader made (no device sync)."""
    batch = next(batches)
    return _to_device(batch, device), int((batch[1] != IGNORE_INDEX).sum())


def _to_device(batch: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(device, non_blocking=True) for t in batch)


def batch_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The mean loss of one batch: ``(inputs, targets)`` from the pretraining loader, or
    ``(inputs, targets, position_ids, document_ids)`` of packed chat rows (targets -100 where not
    trained; ``prodip.train.chat``), each (B, T) int64."""
    if len(batch) == 2:
        x, y = batch
        return model(x, labels=y)
    x, y, pos, doc = batch
    return model(x, labels=y, position_ids=pos, document_ids=doc)


def _grad_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce on all but the last micro-batch: DDP ``no_sync``, FSDP2
    ``set_requires_gradient_sync(False)``; a plain module needs nothing."""
    if sync:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        return _fsdp_no_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(model: nn.Module):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    device: torch.device,
    autocast_dtype: Optional[torch.dtype],
) -> float:
    """Mean next-token NLL (nats/token) over fixed batches; the model is put back in train mode.

    The loss comes from ``model(x, labels=y)`` (the chunked loss head: no (B, T, V) logits); a
    batch is ``(x, y)`` or packed chat rows ``(x, y, position_ids, document_ids)`` (:func:`batch_loss`),
    and the mean is over the counted targets (not -100).
    """
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        batch = _to_device(batch, device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            mean = batch_loss(model, batch)
        counted = int((batch[1] != -100).sum())  # targets of -100 are not in the mean
        total += float(mean) * counted
        count += counted
    model.train()
    return total / max(1, count)


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer's activations in backward (``torch.utils.checkpoint``,
    non-reentrant), trading ~1/3 more compute for O(layers) less activation memory.

    The layer's ``forward`` is wrapped on the instance, so parameter names (and checkpoint
    keys) stay unchanged.
    """

    for layer in model.model.layers:
        inner = layer.forward

        def forward(*args, _inner=inner):
            return checkpoint(_inner, *args, use_reentrant=False)

        layer.forward = forward
