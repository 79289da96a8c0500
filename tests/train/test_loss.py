"""The loss inside the model's forward: chunked fused lm_head + cross-entropy, and GQA attention.

- ``linear_cross_entropy`` equals ``F.cross_entropy(h @ W.T)`` in value and gradients (fp64/fp32,
  any chunk size, also chunks that do not divide the token count), and under bf16 autocast stays
  close to the autocast reference;
- ``model(x, labels=y)`` equals the cross-entropy of ``model(x)``, also under torch.compile;
- attention with SDPA's ``enable_gqa`` saves K/V for backward at Hkv heads, never repeated copies.

    python -m pytest tests/train/test_loss.py -q
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from prodip.base.errors import InvalidInput
from prodip.train.loss import linear_cross_entropy
from prodip.train.model import LlamaAttention, LlamaForCausalLM, LlamaRotaryEmbedding
from tests.fixtures import tiny_config


def _reference(h, w, t):
    loss = F.cross_entropy((h @ w.t()).float(), t)
    loss.backward()
    return loss.detach(), h.grad.clone(), w.grad.clone()


@pytest.mark.parametrize("chunk", [1, 7, 37, 1000])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_equals_cross_entropy_values_and_gradients(chunk, dtype):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, dtype=dtype, requires_grad=True)
    w = torch.randn(50, 16, generator=g, dtype=dtype, requires_grad=True)
    t = torch.randint(0, 50, (37,), generator=g)
    ref, gh, gw = _reference(h, w, t)
    h.grad = w.grad = None
    loss = linear_cross_entropy(h, w, t, chunk)
    (loss * 3).backward()  # the upstream gradient scales the stored ones
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(h.grad, 3 * gh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad, 3 * gw, rtol=1e-5, atol=1e-6)
    assert h.grad.dtype == w.grad.dtype == dtype


def test_bf16_autocast_close_to_the_autocast_reference():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(64, 32, generator=g, requires_grad=True)
    w = (0.1 * torch.randn(300, 32, generator=g)).requires_grad_()
    t = torch.randint(0, 300, (64,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.cross_entropy(F.linear(h, w).float(), t)
    ref.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(h, w, t, 16)
    loss.backward()
    assert h.grad.dtype == w.grad.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(h.grad, gh, rtol=2e-2, atol=2e-4)
    torch.testing.assert_close(w.grad, gw, rtol=2e-2, atol=2e-4)


def test_no_gradients_computed_without_grad():
    h, w, t = torch.randn(8, 4), torch.randn(10, 4), torch.randint(0, 10, (8,))
    with torch.no_grad():
        loss = linear_cross_entropy(h.requires_grad_(), w, t, 3)
    torch.testing.assert_close(loss, F.cross_entropy(h.detach() @ w.t(), t))


def test_bad_arguments_named():
    h, w = torch.randn(8, 4), torch.randn(10, 4)
    with pytest.raises(ValueError, match="chunk_tokens"):
        linear_cross_entropy(h, w, torch.zeros(8, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="8 tokens, targets 7"):
        linear_cross_entropy(h, w, torch.zeros(7, dtype=torch.long))


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_model_labels_equal_cross_entropy_of_logits(compiled):
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config())
    model.loss_chunk_tokens = 5  # several chunks, the last one short
    x = torch.randint(0, 320, (2, 16))
    y = torch.randint(0, 320, (2, 16))
    ref = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    ref.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    fwd = torch.compile(model) if compiled else model
    loss = fwd(x, labels=y)
    loss.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_labels_with_cache_refused():
    model = LlamaForCausalLM(tiny_config())
    x = torch.randint(0, 320, (1, 4))
    with pytest.raises(InvalidInput, match="labels"):
        model(x, labels=x, use_cache=True)


def test_gqa_attention_saves_no_repeated_kv():
    """K and V are saved for backward at Hkv heads (B, Hkv, T, Dh); no (B, H, T, Dh) copy of them."""
    cfg = tiny_config(num_attention_heads=8, num_key_value_heads=2, hidden_size=64)
    attn, rope = LlamaAttention(cfg), LlamaRotaryEmbedding(cfg)
    B, T = 2, 16
    x = torch.randn(B, T, cfg.hidden_size, requires_grad=True)
    cos, sin = rope(x)
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y, _ = attn(x, cos, sin, None, None)
    y.sum().backward()
    kv_heads = (B, cfg.num_key_value_heads, T, cfg.head_dim)
    repeated = (B, cfg.num_attention_heads, T, cfg.head_dim)
    assert saved.count(kv_heads) >= 2  # k and v, as projected
    q_like = saved.count(repeated)  # q and the attention output are H-headed by nature
    assert q_like <= 2, f"{q_like} (B, H, T, Dh) tensors saved: repeated K/V? {saved}"
