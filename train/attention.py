"""Which scaled-dot-product-attention kernel training uses, and which one actually ran.

``[train] attention_backend`` picks PyTorch's SDPA backend through
:func:`torch.nn.attention.sdpa_kernel` (auto = PyTorch's own priority order; on sm90 with
torch >= 2.11 that prefers cuDNN attention). :func:`probe` runs one forward + backward of the
model's attention shapes (1 sequence of ``seq_len`` tokens, H query / Hkv key-value heads of
width Dh, causal, ``enable_gqa``, the training dtype) under that choice with the profiler on,
and names the aten kernel the dispatcher chose (``aten::_scaled_dot_product_flash_attention``,
``..._cudnn_attention``, ``..._efficient_attention``, ``..._attention_math``, or on CPU
``..._flash_attention_for_cpu``). The choice depends on dtype, head width, masking, GQA and the
device, not on the batch size, so the probe names what training's first step runs; a compiled
model bakes the same choice into its graph when it is traced inside the same context.

    python -c "import torch; from prodip.train.attention import probe; \
print(probe('auto', torch.device('cpu'), torch.float32, heads=4, kv_heads=2, head_dim=8, seq_len=16))"
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from prodip.base.errors import InvalidInput
from prodip.base.files import native_stderr_to_log

log = logging.getLogger("prodip.train")

#: ``[train] attention_backend`` choices -> the SDPA backends allowed (``None``: PyTorch's choice).
BACKENDS: dict[str, tuple[SDPBackend, ...] | None] = {
    "auto": None,
    "flash": (SDPBackend.FLASH_ATTENTION,),
    "cudnn": (SDPBackend.CUDNN_ATTENTION,),
    "efficient": (SDPBackend.EFFICIENT_ATTENTION,),
    "math": (SDPBackend.MATH,),
}

#: aten op name (profiler event) -> kernel family, as reported in metrics and logs.
KERNEL_OPS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}


def context(backend: str) -> AbstractContextManager:
    """The ``sdpa_kernel`` context for ``backend`` (a no-op context for ``auto``)."""
    allowed = BACKENDS[backend]
    return nullcontext() if allowed is None else sdpa_kernel(list(allowed))


@dataclass(frozen=True)
class AttentionKernel:
    """What :func:`probe` found: the setting, the kernel family that ran and its aten op."""

    backend: str
    kernel: str
    op: str

    def describe(self) -> str:
        return f"attention_backend = {self.backend}: SDPA ran {self.kernel} ({self.op})"


def probe(
    backend: str,
    device: torch.device,
    dtype: torch.dtype,
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    seq_len: int,
) -> AttentionKernel:
    """Run causal GQA attention forward + backward under ``backend`` and name the kernel that ran.

    Args:
        backend: a key of :data:`BACKENDS`.
        device: the training device.
        dtype: the activation dtype (bf16 under autocast, else fp32).
        heads, kv_heads, head_dim, seq_len: the model's H, Hkv, Dh and the training sequence length.
    Returns:
        The kernel that ran (the first attention op the profiler saw).
    Raises:
        InvalidInput: ``backend`` is unknown, or it cannot run these shapes on this device
            (one line naming ``[train] attention_backend`` and PyTorch's reason).
    """
    if backend not in BACKENDS:
        raise InvalidInput(f"[train] attention_backend = {backend!r}: choose one of {', '.join(BACKENDS)}")
    shape = (1, heads, seq_len, head_dim)
    gen = torch.Generator(device="cpu").manual_seed(0)  # the probe leaves the global RNG untouched
    q = torch.randn(shape, generator=gen).to(device, dtype).requires_grad_()
    k = torch.randn((1, kv_heads, seq_len, head_dim), generator=gen).to(device, dtype).requires_grad_()
    v = torch.randn((1, kv_heads, seq_len, head_dim), generator=gen).to(device, dtype).requires_grad_()
    try:
        # the CPU build's profiler prints "USDT: ... profiler_start/stop" from C++ on every use: keep it in the log
        with native_stderr_to_log(log), context(backend), torch.profiler.profile() as prof:
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=heads != kv_heads).sum().backward()
    except RuntimeError as err:
        reason = " ".join(str(err).split())[:300]
        raise InvalidInput(
            f"[train] attention_backend = {backend} cannot run on {device.type} "
            f"({dtype}, H={heads}, Hkv={kv_heads}, Dh={head_dim}, T={seq_len}): {reason}"
        ) from None
    names = [e.name for e in prof.events()]
    for name in names:
        if name in KERNEL_OPS:
            return AttentionKernel(backend, KERNEL_OPS[name], name)
    return AttentionKernel(backend, "unknown", ",".join(n for n in names if "attention" in n) or "none seen")
