"""The language-model loss head without the (tokens x vocab) logits: a chunked, fused lm_head + cross-entropy.

``F.cross_entropy(lm_head(h).float(), targets)`` keeps the whole logits tensor, its fp32 copy and
the softmax gradient alive (micro-batch 16 x 2048 tokens x 32000 vocab: ~12 GiB). Here the tokens
go through the head in chunks; for each chunk the logits, log-sum-exp, loss and, when gradients
are wanted, the gradients with respect to the hidden states and the head weight are computed at
once in the forward pass (the algorithm of Liger-Kernel's ``LigerFusedLinearCrossEntropyFunction``,
Hsu et al. 2024, arXiv:2410.10989), so at most one chunk of logits exists at any time and nothing
is recomputed. ``backward`` only scales the stored gradients. The matmuls run in the autocast
dtype when autocast is on (as ``nn.Linear`` under autocast would), the softmax in fp32.

    python -c "import torch; from prodip.train.loss import linear_cross_entropy as f; \
h = torch.randn(8, 16, requires_grad=True); w = torch.randn(50, 16); print(f(h, w, torch.randint(0, 50, (8,))))"
"""

from __future__ import annotations

import torch

#: Target id that is not counted in the loss (F.cross_entropy's default ``ignore_index``): the
#: positions of a chat conversation outside the assistant's replies, and padding.
IGNORE_INDEX = -100


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    kind = t.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return t.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
    ) -> torch.Tensor:
        dtype = _compute_dtype(hidden)
        want_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            n = hidden.shape[0]
            # mean over the counted tokens (F.cross_entropy's ignore_index=-100 rule): a tensor, so no
            # host sync; 1 at least, so a batch with every target ignored gives loss 0, not NaN
            keep = targets != IGNORE_INDEX
            count = keep.sum().clamp(min=1).to(torch.float32)
            loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
            grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
            grad_w = (
                torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
                if ctx.needs_input_grad[1]
                else None
            )
            for start in range(0, n, chunk_tokens):
                h = hidden[start : start + chunk_tokens].to(dtype)  # (c, D)
                k = keep[start : start + chunk_tokens]  # (c,) counted tokens
                t = targets[start : start + chunk_tokens].clamp(min=0)  # (c,) ignored ones read id 0
                # one (c, V) fp32 buffer per chunk, transformed in place: logits -> shifted -> exp -> softmax
                logits = (h @ w.t()).float()  # (c, V): the softmax is taken in fp32
                logits.sub_(logits.amax(dim=-1, keepdim=True))  # shifted, so exp cannot overflow
                target = logits.gather(1, t[:, None])[:, 0]  # (c,) shifted target logit
                denom = logits.exp_().sum(dim=-1)  # (c,)
                loss += torch.where(k, denom.log() - target, 0.0).sum()  # -log softmax[target], summed
                if not want_grad:
                    continue
                # d(mean loss)/d(logits) = (softmax - onehot) / count, in the same buffer
                probs = logits.div_(denom[:, None])
                probs[torch.arange(len(t), device=t.device), t] -= 1.0
                probs.mul_(k[:, None])  # an ignored token's row has no gradient
                g = probs.div_(count).to(dtype)  # (c, V)
                if grad_h is not None:
                    grad_h[start : start + chunk_tokens] = (g @ w).to(hidden.dtype)
                if grad_w is not None and g.dtype == grad_w.dtype:
                    grad_w.addmm_(g.t(), h)  # in place: no (V, D) temporary per chunk
                elif grad_w is not None:
                    grad_w += (g.t() @ h).float()  # bf16 product, summed over chunks in fp32
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype, ctx.backward_done = weight.dtype, False
        return loss / count

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        if ctx.backward_done:
            raise RuntimeError("linear_cross_entropy: backward runs once (its stored gradients are scaled in place)")
        ctx.backward_done = True
        grad_h, grad_w = ctx.saved_tensors
        # scaled in place: the stored gradients are used once, and a (V, D) copy is what chunking saves
        gh = None if grad_h is None else grad_h.mul_(grad_out.to(grad_h.dtype))
        gw = None if grad_w is None else grad_w.mul_(grad_out).to(ctx.weight_dtype)
        return gh, gw, None, None


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int = 2048
) -> torch.Tensor:
    """Mean next-token cross-entropy of ``hidden @ weight.T`` without materialising all logits.

    Targets equal to :data:`IGNORE_INDEX` (-100) are left out of the mean and get no gradient.
    Equal to ``F.cross_entropy((hidden @ weight.T).float(), targets)`` (fp32: to rounding; under
    bf16 autocast the weight gradient is summed over chunks in fp32, so it is closer to exact).

    Args:
        hidden: (N, D) or (B, T, D) float, the final-norm output.
        weight: (V, D) float, the lm_head weight.
        targets: (N,) or (B, T) int64 token ids in [0, V), or -100 (not counted).
        chunk_tokens: tokens per chunk (>= 1); one chunk holds (chunk_tokens, V) fp32 logits.
    Returns:
        () float32, nats/token over the counted targets (0 when none is counted).
    Raises:
        ValueError: ``chunk_tokens`` < 1, or hidden and targets differ in token count.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if hidden.shape[0] != targets.shape[0]:
        raise ValueError(f"hidden has {hidden.shape[0]} tokens, targets {targets.shape[0]}")
    return _LinearCrossEntropy.apply(hidden, weight, targets, chunk_tokens)
