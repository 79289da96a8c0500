"""Decoder-only Llama model: RMSNorm, rotate-half RoPE, SwiGLU, grouped-query attention.

Module names follow the Hugging Face Llama layout, so ``model.state_dict()`` keys are the export
keys (``model.embed_tokens.weight``, ``model.layers.{i}.self_attn.q_proj.weight``, ...,
``model.norm.weight``, ``lm_head.weight``). The same forward serves training (no mask, no cache:
SDPA ``is_causal``, so flash/efficient kernels on GPU) and inference (attention mask + KV cache,
used by the ONNX export and the eager reference in benchmarks).

    python -c "from prodip.train.model import LlamaForCausalLM; from prodip.train.config import ModelConfig as C; \
print(LlamaForCausalLM(C(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)))"
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from prodip.base.errors import InvalidInput
from prodip.train.config import ModelConfig
from prodip.train.loss import linear_cross_entropy

KVCache = list[tuple[torch.Tensor, torch.Tensor]]


class LlamaRMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467), computed in fp32 then cast back, as HF does."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


def rope_inv_freq(
    head_dim: int, theta: float, rope_scaling: Optional[dict] = None, device: Optional[torch.device] = None
) -> torch.Tensor:
    """RoPE inverse frequencies ``theta ** (-2i / Dh)``, i < Dh/2, scaled as ``rope_scaling`` says.

    ``rope_scaling`` None: unscaled (Su et al. 2021). ``rope_type = "llama3"`` (Llama 3.1, Meta's
    reference ``apply_scaling`` in llama-models, as transformers' ``_compute_llama3_parameters``):
    wavelengths ``2 pi / f`` above ``original_max_position_embeddings / low_freq_factor`` are divided
    by ``factor``, those below ``original_max_position_embeddings / high_freq_factor`` kept, and those
    between interpolated with ``s = (original / wavelength - low) / (high - low)``:
    ``(1 - s) f / factor + s f``.

    Returns:
        (Dh/2,) float32 on ``device``.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.int64).float() / head_dim))
    if not rope_scaling:
        return inv_freq
    factor = rope_scaling["factor"]
    low, high = rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"]
    old = rope_scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def rope_factors(head_dim: int, theta: float, rope_scaling: Optional[dict]) -> torch.Tensor:
    """Per-frequency divisors ``unscaled / scaled`` of :func:`rope_inv_freq` (Dh/2,) float32: what
    llama.cpp reads as the ``rope_freqs.weight`` tensor (its rope divides each frequency by it)."""
    return rope_inv_freq(head_dim, theta) / rope_inv_freq(head_dim, theta, rope_scaling)


def rope_cos_sin(
    position_ids: torch.Tensor,
    head_dim: int,
    theta: float,
    dtype: torch.dtype,
    rope_scaling: Optional[dict] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for rotate-half RoPE (Su et al. 2021; HF ``LlamaRotaryEmbedding`` layout).

    Args:
        position_ids: (B, T) int64 absolute positions.
        rope_scaling: the config's ``rope_scaling`` (:func:`rope_inv_freq`).
    Returns:
        cos, sin: (B, 1, T, Dh) in ``dtype``; angles computed in fp32 for accuracy at long positions.
    """
    inv_freq = rope_inv_freq(head_dim, theta, rope_scaling, position_ids.device)
    freqs = position_ids.float()[..., None] * inv_freq  # (B, T, Dh/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, Dh): halves repeated, the "rotate half" layout
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def _is_exporting() -> bool:
    f = getattr(torch.compiler, "is_exporting", None)  # torch >= 2.6; is_compiling covers export too
    return bool(f and f())


class LlamaRotaryEmbedding(nn.Module):
    """RoPE cos/sin for positions ``0 .. max_position_embeddings - 1``, computed once, not per forward.

    The tables are :func:`rope_cos_sin` of ``arange(max_position_embeddings)`` (same formula, so a
    looked-up row is bitwise the row computed from scratch), in float32 with autocast off, and
    cast to the activation dtype at use, as HF's ``LlamaRotaryEmbedding`` does with its
    per-forward computation. They are non-persistent buffers: never in ``state_dict``,
    checkpoints or safetensors; ``.to(device)`` moves them and any ``_apply`` (``.to(dtype)``,
    ``.half()``, ``.float()``, ``to_empty``) recomputes them in float32 on their device, so a
    cast model never holds rounded tables (a bf16 -> fp32 round trip restores exact values).

    Lookups: the default positions ``offset + arange(T)`` (training, KV-cache decode without
    explicit positions) are a slice of the tables; explicit ``position_ids`` are gathered when
    all lie in the table (one host sync to check); otherwise, and while torch.compile or
    torch.export traces explicit positions (the ONNX export's graph is therefore unchanged),
    cos/sin are computed from scratch as before, so positions beyond
    ``max_position_embeddings`` keep working (no error), exactly as without the cache.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.head_dim, self.theta = config.head_dim, config.rope_theta
        self.rope_scaling = config.rope_scaling
        self.max_position_embeddings = config.max_position_embeddings
        cos, sin = self._tables(None)
        self.register_buffer("cos_cached", cos, persistent=False)  # (N, Dh) float32
        self.register_buffer("sin_cached", sin, persistent=False)

    def _tables(self, device: Optional[torch.device]) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(self.max_position_embeddings, device=device)[None]  # (1, N)
        kind = positions.device.type
        with torch.autocast(kind, enabled=False) if torch.amp.is_autocast_available(kind) else nullcontext():
            cos, sin = rope_cos_sin(positions, self.head_dim, self.theta, torch.float32, self.rope_scaling)
        return cos[0, 0], sin[0, 0]

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)  # moves (and perhaps casts or empties) the tables ...
        cos, sin = self._tables(self.cos_cached.device)  # ... then they are recomputed in fp32 there
        self.cos_cached, self.sin_cached = cos, sin
        return self

    def forward(
        self, x: torch.Tensor, position_ids: Optional[torch.Tensor] = None, offset: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for ``x`` (B, T, D) at ``position_ids`` (B, T), default ``offset + arange(T)``.

        Returns:
            cos, sin: (B, 1, T, Dh) in ``x.dtype``; (1, 1, T, Dh) for the default positions.
        """
        T, N = x.shape[1], self.cos_cached.shape[0]
        if position_ids is None:
            if offset + T <= N:
                return (
                    self.cos_cached[offset : offset + T].to(x.dtype)[None, None],
                    self.sin_cached[offset : offset + T].to(x.dtype)[None, None],
                )
            position_ids = torch.arange(offset, offset + T, device=x.device)[None]
        elif self._in_table(position_ids, N):
            return (
                self.cos_cached[position_ids].to(x.dtype)[:, None],
                self.sin_cached[position_ids].to(x.dtype)[:, None],
            )
        return rope_cos_sin(position_ids, self.head_dim, self.theta, x.dtype, self.rope_scaling)

    @staticmethod
    def _in_table(position_ids: torch.Tensor, n: int) -> bool:
        """Eager only (a data-dependent check, never baked into a traced graph): integer
        positions, all in ``[0, n)``."""
        if (
            torch.compiler.is_compiling()
            or _is_exporting()
            or torch.jit.is_tracing()
            or position_ids.numel() == 0
            or position_ids.dtype not in (torch.int64, torch.int32)
        ):
            return False
        lo, hi = torch.aminmax(position_ids)
        return bool(((lo >= 0) & (hi < n)).item())


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, Dh) queries or keys by their positions."""
    return x * cos + rotate_half(x) * sin


class LlamaAttention(nn.Module):
    """Grouped-query causal self-attention with an optional KV cache."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        D, Dh = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (config.num_attention_heads, config.num_key_value_heads, Dh)
        bias = config.qkv_bias  # Qwen2: q/k/v carry a bias, o_proj none (transformers' Qwen2Attention)
        self.q_proj = nn.Linear(D, self.num_heads * Dh, bias=bias)
        self.k_proj = nn.Linear(D, self.num_kv_heads * Dh, bias=bias)
        self.v_proj = nn.Linear(D, self.num_kv_heads * Dh, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * Dh, D, bias=False)
        self.fused = False  # set by LlamaForCausalLM.fuse_projections

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: Optional[torch.Tensor],
        past: Optional[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        B, T, _ = x.shape
        if self.fused:  # one GEMM over the concatenated weights; the parameters stay HF's three
            bias = (
                None if self.q_proj.bias is None else torch.cat((self.q_proj.bias, self.k_proj.bias, self.v_proj.bias))
            )
            qkv = F.linear(x, torch.cat((self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)), bias)
            q, k, v = qkv.split((self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                                 self.num_kv_heads * self.head_dim), dim=-1)  # fmt: skip
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        k = k.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, Dh)
        v = v.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past is not None:
            k = torch.cat((past[0], k), dim=2)  # (B, Hkv, P+T, Dh)
            v = torch.cat((past[1], v), dim=2)
        present = (k, v)
        groups = self.num_heads // self.num_kv_heads
        gqa = groups > 1
        if gqa and _is_exporting():
            # The ONNX export traces explicit repeats: its graph (and conformance) stay as they
            # were, and no runtime needs to know SDPA's enable_gqa.
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
            gqa = False
        # enable_gqa: query head h attends to kv head h // groups inside the kernel (flash on
        # CUDA), so autograd saves K/V at Hkv heads, not repeated copies at H heads.
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        y = y.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)
        return self.o_proj(y), present


class LlamaMLP(nn.Module):
    """SwiGLU MLP (Shazeer 2020, arXiv:2002.05202): down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

        self.fused = False  # set by LlamaForCausalLM.fuse_projections

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:  # gate and up in one GEMM; the parameters stay HF's two
            gate, up = F.linear(x, torch.cat((self.gate_proj.weight, self.up_proj.weight))).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask, past):
        h, present = self.self_attn(self.input_layernorm(x), cos, sin, mask, past)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, present


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)  # buffers only: no state_dict keys


def build_attention_mask(attention_mask: torch.Tensor, query_len: int) -> torch.Tensor:
    """Boolean SDPA mask from a padding mask, causal with the cache offset.

    Args:
        attention_mask: (B, P+T) int64/bool, 1 for real tokens, 0 for padding (left or right).
        query_len: T, the number of new tokens; they are the last T of the P+T positions.
    Returns:
        (B, 1, T, P+T) bool, True where attention is allowed. A query row with no allowed key
        (a padding query) is allowed to attend to itself so that SDPA never yields NaN.
    """
    B, S = attention_mask.shape
    T = query_len
    q_pos = torch.arange(S - T, S, device=attention_mask.device)[:, None]  # (T, 1)
    k_pos = torch.arange(S, device=attention_mask.device)[None, :]  # (1, S)
    causal = k_pos <= q_pos  # (T, S)
    allowed = causal[None] & attention_mask.bool()[:, None, :]  # (B, T, S)
    allowed = allowed | (k_pos == q_pos)[None]  # keep every row non-empty (padding queries)
    return allowed[:, None]


class LlamaForCausalLM(nn.Module):
    """Llama causal LM. ``forward(input_ids) -> logits``; see :meth:`forward` for the cache path."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.loss_chunk_tokens = 2048  # tokens per chunk of the fused loss head (forward(labels=...))
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.reset_parameters()
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def reset_parameters(self, seed: Optional[int] = None) -> None:
        """Initialise as HF ``LlamaPreTrainedModel._init_weights``: Linear and Embedding weights
        ~ N(0, initializer_range), Linear biases 0, RMSNorm weights = 1 (transformers'
        ``PreTrainedModel._init_weights``).

        Args:
            seed: if given, a private generator seeded with it is used (the random twin in eval).
        """
        gen = None
        if seed is not None:
            gen = torch.Generator(device="cpu").manual_seed(seed)
        std = self.config.initializer_range
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    w = torch.empty(module.weight.shape, dtype=torch.float32)
                    w.normal_(0.0, std, generator=gen)
                    module.weight.copy_(w)
                    bias = getattr(module, "bias", None)
                    if isinstance(bias, torch.Tensor):  # Qwen2's q/k/v: zeros, as HF
                        bias.zero_()
                elif isinstance(module, LlamaRMSNorm):
                    module.weight.fill_(1.0)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        past_key_values: Optional[KVCache] = None,
        use_cache: bool = False,
        labels: Optional[torch.Tensor] = None,
        document_ids: Optional[torch.Tensor] = None,
    ):
        """Next-token logits, or with ``labels`` the mean next-token loss.

        Args:
            input_ids: (B, T) int64 token ids.
            position_ids: (B, T) int64 positions; default ``P + arange(T)`` with P the cache length.
            attention_mask: (B, P+T) int64 1/0 padding mask; ``None`` means all real tokens.
            past_key_values: per layer ``(key, value)``, each (B, Hkv, P, Dh); ``None`` means P=0.
            use_cache: also return the updated cache.
            labels: (B, T) int64 targets (the inputs shifted by one); then the return value is
                the mean cross-entropy () float32 in nats/token, computed by
                :func:`prodip.train.loss.linear_cross_entropy` in chunks of
                ``self.loss_chunk_tokens`` tokens, so the (B, T, V) logits never exist and the
                loss is part of whatever compiles this forward. A target of -100 is not counted.
            document_ids: (B, T) int64, packed training rows (chat fine-tuning): a token attends
                only to earlier tokens with the same id (block-diagonal causal mask), so one
                conversation never sees another packed beside it; give each document's own
                ``position_ids`` (0, 1, ... from its first token) too. No cache or padding mask with it.

        Returns:
            logits (B, T, V) in the parameter dtype (fp32 for fp32 weights); with ``use_cache``
            a tuple ``(logits, present)`` where present is per layer ``(key, value)``, each
            (B, Hkv, P+T, Dh).
        """
        B, T = input_ids.shape
        P = 0 if past_key_values is None else past_key_values[0][0].shape[2]
        x = self.model.embed_tokens(input_ids)  # (B, T, D)
        cos, sin = self.model.rotary_emb(x, position_ids, offset=P)  # default positions P + arange(T)
        mask = None
        if document_ids is not None:
            if attention_mask is not None or P > 0:
                raise InvalidInput(
                    "LlamaForCausalLM.forward: document_ids (packed training rows) takes no cache or mask"
                )
            causal = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()
            mask = (causal[None] & (document_ids[:, :, None] == document_ids[:, None, :]))[:, None]  # (B, 1, T, T)
        elif attention_mask is not None or P > 0:
            if attention_mask is None:
                attention_mask = torch.ones(B, P + T, dtype=torch.int64, device=input_ids.device)
            mask = build_attention_mask(attention_mask, T)
        present: KVCache = []
        for i, layer in enumerate(self.model.layers):
            past = None if past_key_values is None else past_key_values[i]
            x, kv = layer(x, cos, sin, mask, past)
            present.append(kv)
        h = self.model.norm(x)
        if labels is not None:
            if use_cache:
                raise InvalidInput(
                    "LlamaForCausalLM.forward: labels (a training loss) and use_cache (an inference cache) exclude each other"
                )
            return linear_cross_entropy(h, self.lm_head.weight, labels, self.loss_chunk_tokens)
        logits = self.lm_head(h)
        return (logits, present) if use_cache else logits

    def fuse_projections(self, fused: bool = True) -> None:
        """Compute q/k/v and gate/up as one matrix product each (``[train] fused_projections``).

        The weights are concatenated inside the forward (under autocast that copy is the bf16 cast
        the separate products do anyway; torch.compile fuses it), so the parameters, ``state_dict``
        keys, checkpoints and exports keep Hugging Face's separate ``q_proj``/``k_proj``/``v_proj``
        and ``gate_proj``/``up_proj`` tensors: there is nothing to convert. Fewer, larger GEMMs
        are the gain (a GPU lever; ``make gpu-bench --ab`` measures it).
        """
        for layer in self.model.layers:
            layer.self_attn.fused = fused
            layer.mlp.fused = fused

    def num_parameters(self) -> int:
        """Unique trainable parameters (a tied matrix counted once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
