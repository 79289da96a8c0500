"""The decoder graph on ONNX Runtime's fused operators: what its own model builder emits, traced from our model.

:class:`ContribDecoder` computes the training model's forward (same weights, same I/O contract as
:class:`prodip.export.onnx.DecoderWithCache`) with ONNX Runtime's ``com.microsoft`` contrib
operators where they exist, emitted with ``torch.onnx.ops.symbolic`` during the dynamo export:

* ``GroupQueryAttention`` (grouped-query attention over the KV cache, present = past ++ new; no
  rotary inside: positions come from ``position_ids``, so left padding works);
* ``RotaryEmbedding`` on queries and keys (rotate-half, ``interleaved=0``), reading
  ``position_ids`` and cos/sin tables of ``max_position_embeddings`` rows;
* ``SkipSimplifiedLayerNormalization``: residual add + RMSNorm in one kernel;
* one packed q/k/v projection per layer (one ``MatMul``, one ``MatMulNBits`` in int4), followed by
  one ``Add`` of the packed q/k/v bias where the model has one (Qwen2).

Padding is an additive bias built from the same boolean mask as the training model
(:func:`prodip.train.model.build_attention_mask`), and GroupQueryAttention gets every row at full
length (``seqlens_k = past + T - 1``), so any left- or right-padded mask means what it means in
the training model. ONNX Runtime's ``GroupQueryAttention`` refuses one shape the plain graph accepts:
batch > 1 with T > 1 new tokens and past > 0 (a chunked prefill of several rows at once); prefill
(past 0, any batch) and decoding (T = 1, any batch) are what every runtime here does.
Positions must lie in ``[0, max_position_embeddings)`` (the RotaryEmbedding tables; out of range
is an ONNX Runtime error naming the position).

Sources: onnxruntime/docs/ContribOperators.md (GroupQueryAttention, RotaryEmbedding,
SkipSimplifiedLayerNormalization) and onnxruntime_genai/models/builder.py (the same operators).

    python -c "from prodip.export.contrib import CONTRIB_OPS; print(CONTRIB_OPS)"
"""

from __future__ import annotations

import torch
from torch import nn
from torch.onnx import ops

from prodip.train.model import build_attention_mask

#: com.microsoft operators this graph uses (ONNX Runtime CPU kernels since 1.20; onnxruntime-node/-web too).
CONTRIB_OPS = ("GroupQueryAttention", "RotaryEmbedding", "SkipSimplifiedLayerNormalization")


def unsupported(config: object) -> str | None:
    """Why ONNX Runtime's GroupQueryAttention cannot run this model (None: it can).

    Its CPU kernel requires ``head_dim`` to be a multiple of 8 (ONNX Runtime 1.32:
    "head_size must be a multiple of 8").
    """
    head_dim = int(config.head_dim)
    return None if head_dim % 8 == 0 else f"head_dim {head_dim} is not a multiple of 8 (GroupQueryAttention)"


def _symbolic(op: str, inputs: list, attrs: dict, dtypes: list, shapes: list) -> list[torch.Tensor]:
    return list(ops.symbolic_multi_out(f"com.microsoft::{op}", inputs, attrs, dtypes=dtypes, shapes=shapes, version=1))


class ContribDecoder(nn.Module):
    """Export wrapper: the training model's weights, ONNX Runtime's fused operators.

    ``forward(input_ids (B, T) int64, attention_mask (B, P+T) int64, position_ids (B, T) int64,
    past: 2L x (B, Hkv, P, Dh) float32) -> (logits (B, T, V) float32, present k0, v0, ... (B, Hkv, P+T, Dh))``.

    Only meaningful under ``torch.onnx.export(dynamo=True)``: eagerly, the symbolic operators
    return zeros. The model is read, not modified (q/k/v weights are concatenated into a copy).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        c = model.config
        self.H, self.Hkv, self.Dh, self.eps = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps
        self.embed_tokens, self.lm_head = model.model.embed_tokens, model.lm_head
        self.layers, self.norm = model.model.layers, model.model.norm
        self.qkv = nn.ModuleList()
        for layer in self.layers:
            a = layer.self_attn
            qkv = nn.Linear(c.hidden_size, (self.H + 2 * self.Hkv) * self.Dh, bias=a.q_proj.bias is not None)
            qkv.weight = nn.Parameter(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach().clone())
            if a.q_proj.bias is not None:  # Qwen2: packed q/k/v bias, one Add after the packed MatMul
                qkv.bias = nn.Parameter(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).detach().clone())
            self.qkv.append(qkv)
        rope = model.model.rotary_emb  # float32 tables (N, Dh), rotate-half layout: both halves equal
        self.register_buffer("cos_cache", rope.cos_cached[:, : self.Dh // 2].detach().clone(), persistent=False)
        self.register_buffer("sin_cache", rope.sin_cached[:, : self.Dh // 2].detach().clone(), persistent=False)

    def _rope(self, x: torch.Tensor, position_ids: torch.Tensor, heads: int) -> torch.Tensor:
        """(B, T, heads * Dh) rotated at ``position_ids`` (B, T)."""
        return _symbolic(
            "RotaryEmbedding",
            [x, position_ids, self.cos_cache, self.sin_cache],
            {"interleaved": 0, "num_heads": heads},
            [x.dtype],
            [x.shape],
        )[0]

    def _skip_norm(
        self, x: torch.Tensor, skip: torch.Tensor, weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(RMSNorm(x + skip) * weight, x + skip), both (B, T, D)."""
        B, T, _ = x.shape
        out = _symbolic(
            "SkipSimplifiedLayerNormalization",
            [x, skip, weight],
            {"epsilon": self.eps},
            [x.dtype, torch.float32, torch.float32, x.dtype],
            [x.shape, [B, T, 1], [B, T, 1], x.shape],
        )
        return out[0], out[3]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        B, T = input_ids.shape
        S, P = attention_mask.shape[1], past[0].shape[2]
        H, Hkv, Dh = self.H, self.Hkv, self.Dh
        # additive bias (B, 1, T, S): 0 where the training model's mask allows attention, float32 min elsewhere
        bias = torch.where(build_attention_mask(attention_mask, T), 0.0, torch.finfo(torch.float32).min)
        ones = torch.ones_like(attention_mask, dtype=torch.int32)
        seqlens_k = ones.sum(-1, dtype=torch.int32) - 1  # (B,) S - 1: every row at full length
        total = ones[0].sum(dtype=torch.int32)  # () S
        keep = attention_mask[:, None, :P, None].bool()  # (B, 1, P, 1): masked cache slots are zeroed
        x = self.embed_tokens(input_ids)  # (B, T, D)
        h = self.layers[0].input_layernorm(x)
        present: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            q, k, v = self.qkv[i](h).split([H * Dh, Hkv * Dh, Hkv * Dh], dim=-1)
            q, k = self._rope(q, position_ids, H), self._rope(k, position_ids, Hkv)
            # a cache slot the mask excludes must not matter, even if it holds NaN (0 * NaN = NaN)
            past_k, past_v = torch.where(keep, past[2 * i], 0.0), torch.where(keep, past[2 * i + 1], 0.0)
            y, k_all, v_all = _symbolic(
                "GroupQueryAttention",
                [q, k, v, past_k, past_v, seqlens_k, total, None, None, None, bias],
                {"num_heads": H, "kv_num_heads": Hkv, "scale": Dh**-0.5, "do_rotary": 0},
                [x.dtype] * 3,
                [[B, T, H * Dh], [B, Hkv, S, Dh], [B, Hkv, S, Dh]],
            )
            present += [k_all, v_all]
            h, x = self._skip_norm(x, layer.self_attn.o_proj(y), layer.post_attention_layernorm.weight)
            last = i + 1 == len(self.layers)
            h, x = self._skip_norm(x, layer.mlp(h), (self.norm if last else self.layers[i + 1].input_layernorm).weight)
        return (self.lm_head(h).float(), *present)
