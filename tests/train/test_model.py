"""Parity of train.model.LlamaForCausalLM with transformers' LlamaForCausalLM (litgpt-style).

Both models are built from the same config and the same weights (no hub download: the HF model
is made from a ``LlamaConfig``); logits must agree to 1e-5 in fp32 on CPU, including positions
near ``max_position_embeddings``, where RoPE mistakes show (torchtitan #1441: un-permuted weights
gave KL of only 3e-6..1e-5 at short positions). Also: KV-cache decode == full recompute, a
left-padded batch == each row alone, and the planted defect "interleaved RoPE layout" is caught.

Also: the cached RoPE cos/sin tables (non-persistent buffers) give bitwise the from-scratch
cos/sin and logits for any positions (left-padded, random, cache offsets, beyond the table,
negative), never enter ``state_dict``, stay exact fp32 across ``.to(dtype)`` round trips, and
work under torch.compile.

    python -m pytest tests/train/test_model.py -q
"""

from __future__ import annotations

import inspect

import pytest
import torch

import prodip.train.model as tm
from prodip.train.config import ModelConfig
from prodip.train.model import LlamaForCausalLM
from tests import fixtures

transformers = pytest.importorskip("transformers")

ATOL = 1e-5
MAX_POS = 512


def tiny_config(*, kv_heads: int = 2, tied: bool = False, vocab: int = 97) -> ModelConfig:
    """tests.fixtures' tiny model with 512 positions (RoPE near the end) and a wide init (visible logits)."""
    return fixtures.tiny_config(
        vocab_size=vocab,
        num_key_value_heads=kv_heads,
        max_position_embeddings=MAX_POS,
        tie_word_embeddings=tied,
        initializer_range=0.2,
    )


def hf_twin(model: LlamaForCausalLM) -> torch.nn.Module:
    """transformers' LlamaForCausalLM from our ModelConfig, loaded with our weights (strict)."""
    cfg = transformers.LlamaConfig(**model.config.to_dict(), attn_implementation="eager")
    hf = transformers.LlamaForCausalLM(cfg).eval()
    state = model.state_dict()
    result = hf.load_state_dict(state, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    assert not result.missing_keys, result.missing_keys
    if model.config.tie_word_embeddings:
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    return hf


def max_logit_diff(
    ours: LlamaForCausalLM, hf: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None
) -> float:
    with torch.no_grad():
        a = ours(input_ids, position_ids=position_ids)
        b = hf(input_ids=input_ids, position_ids=position_ids).logits
    return (a - b).abs().max().item()


def make_pair(**kw) -> tuple[LlamaForCausalLM, torch.nn.Module]:
    torch.manual_seed(0)
    ours = LlamaForCausalLM(tiny_config(**kw)).eval()
    return ours, hf_twin(ours)


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_logits_match_transformers(kv_heads: int, tied: bool) -> None:
    ours, hf = make_pair(kv_heads=kv_heads, tied=tied)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (2, 24), generator=g)
    assert max_logit_diff(ours, hf, ids) <= ATOL
    # the last positions the model supports, where RoPE angles are large
    far = torch.arange(MAX_POS - 24, MAX_POS).expand(2, 24)
    assert max_logit_diff(ours, hf, ids, far) <= ATOL
    # the logits are not trivially zero/equal: parity means something
    with torch.no_grad():
        assert ours(ids).std().item() > 0.1


def test_state_dict_keys_are_hf_keys() -> None:
    ours, hf = make_pair(tied=False)
    assert set(ours.state_dict()) == set(hf.state_dict())


def test_kv_cache_decode_equals_full_recompute() -> None:
    ours, _ = make_pair(kv_heads=2)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 97, (2, 12), generator=g)
    with torch.no_grad():
        full = ours(ids)
        logits, cache = ours(ids[:, :5], use_cache=True)  # prefill 5 tokens
        steps = [logits]
        for t in range(5, 12):  # then one token at a time
            logits, cache = ours(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            steps.append(logits)
    assert cache[0][0].shape == (2, 2, 12, 8)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)


def test_kv_cache_matches_transformers_cache() -> None:
    ours, hf = make_pair(kv_heads=2)
    ids = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, cache = ours(ids[:, :8], use_cache=True)
        step, _ = ours(ids[:, 8:], past_key_values=cache, use_cache=True)
        out = hf(input_ids=ids[:, :8], use_cache=True)
        hf_cache = getattr(out, "cache", None) or out.past_key_values
        # transformers 5.x renamed the cache argument `past_key_values` -> `cache`
        key = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
        ref = hf(input_ids=ids[:, 8:], use_cache=True, **{key: hf_cache}).logits
    torch.testing.assert_close(step, ref, atol=ATOL, rtol=0)


def test_left_padded_batch_equals_rows_alone() -> None:
    ours, _ = make_pair(kv_heads=2)
    g = torch.Generator().manual_seed(4)
    rows = [torch.randint(3, 97, (n,), generator=g) for n in (10, 6, 3)]
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.int64)
    mask = torch.zeros(len(rows), T, dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, T - len(r) :], mask[i, T - len(r) :] = r, 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # the ONNX contract's left-padding positions
    with torch.no_grad():
        batch = ours(ids, position_ids=pos, attention_mask=mask)
        for i, r in enumerate(rows):
            alone = ours(r[None])
            torch.testing.assert_close(batch[i, T - len(r) :], alone[0], atol=ATOL, rtol=0)


def test_left_padded_cache_decode_equals_rows_alone() -> None:
    ours, _ = make_pair(kv_heads=1)
    g = torch.Generator().manual_seed(5)
    rows = [torch.randint(3, 97, (n,), generator=g) for n in (7, 4)]
    nxt = torch.randint(3, 97, (2, 1), generator=g)
    T = 7
    ids = torch.zeros(2, T, dtype=torch.int64)
    mask = torch.zeros(2, T, dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, T - len(r) :], mask[i, T - len(r) :] = r, 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        _, cache = ours(ids, position_ids=pos, attention_mask=mask, use_cache=True)
        mask2 = torch.cat([mask, torch.ones(2, 1, dtype=torch.int64)], dim=1)
        step = ours(nxt, position_ids=pos[:, -1:] + 1, attention_mask=mask2, past_key_values=cache)
        for i, r in enumerate(rows):
            alone = ours(torch.cat([r, nxt[i]])[None])[:, -1]
            torch.testing.assert_close(step[i], alone, atol=ATOL, rtol=0)


# ---- planted defect: RoPE in the interleaved (GPT-J / Meta-checkpoint) layout ----------------


def _interleaved_cos_sin(position_ids, head_dim, theta, dtype, rope_scaling=None):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = position_ids.float()[..., None] * inv_freq
    emb = freqs.repeat_interleave(2, dim=-1)  # (f0, f0, f1, f1, ...): pairs (x0, x1), (x2, x3), ...
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def _rotate_interleaved(x):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def test_interleaved_rope_is_caught_by_parity(monkeypatch: pytest.MonkeyPatch) -> None:
    ours, hf = make_pair(kv_heads=2)
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(6))
    far = torch.arange(MAX_POS - 24, MAX_POS).expand(2, 24)
    assert max_logit_diff(ours, hf, ids, far) <= ATOL  # correct layout passes
    monkeypatch.setattr(tm, "rope_cos_sin", _interleaved_cos_sin)
    monkeypatch.setattr(tm, "rotate_half", _rotate_interleaved)
    # the cos/sin tables are built once, at construction: rebuild the model with the defect planted
    weights = ours.state_dict()
    ours = LlamaForCausalLM(ours.config).eval()
    ours.load_state_dict(weights)
    # sanity: the defect is a valid rotation (norm-preserving), so the loss curve would look fine
    x = torch.randn(1, 1, 3, 8)
    cos, sin = _interleaved_cos_sin(torch.arange(3)[None], 8, 10000.0, torch.float32)
    torch.testing.assert_close(tm.apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1))
    near = max_logit_diff(ours, hf, ids)
    far_diff = max_logit_diff(ours, hf, ids, far)
    assert near > ATOL and far_diff > ATOL, (near, far_diff)  # the parity test fails on it
    with pytest.raises(AssertionError):
        torch.testing.assert_close(
            ours(ids, position_ids=far), hf(input_ids=ids, position_ids=far).logits, atol=ATOL, rtol=0
        )


def test_tied_weights_are_one_parameter() -> None:
    ours = LlamaForCausalLM(tiny_config(tied=True))
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    assert ours.num_parameters() == ours.config.num_parameters()
    untied = LlamaForCausalLM(tiny_config(tied=False))
    assert untied.num_parameters() == untied.config.num_parameters()


def test_qwen2_has_qkv_biases_counted_and_zero_initialised() -> None:
    """model_type qwen2: q/k/v carry a bias (o_proj none), counted by the config, zero at init as HF's."""
    import dataclasses

    qwen = LlamaForCausalLM(dataclasses.replace(tiny_config(tied=False), model_type="qwen2"))
    attn = qwen.model.layers[0].self_attn
    assert attn.o_proj.bias is None and all(
        p.bias is not None and not p.bias.any() for p in (attn.q_proj, attn.k_proj, attn.v_proj)
    )
    assert (
        qwen.num_parameters()
        == qwen.config.num_parameters()
        > LlamaForCausalLM(tiny_config(tied=False)).num_parameters()
    )


def test_reset_parameters_seed_is_deterministic() -> None:
    a = LlamaForCausalLM(tiny_config())
    b = LlamaForCausalLM(tiny_config())
    a.reset_parameters(seed=7)
    b.reset_parameters(seed=7)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
    assert a.lm_head.weight.std().item() == pytest.approx(0.2, rel=0.1)


# ---- cached RoPE tables == the from-scratch computation ---------------------------------------


def _scratch_rope(self, x, position_ids=None, offset=0):
    """The pre-cache computation: rope_cos_sin of the positions on every forward."""
    B, T = x.shape[:2]
    if position_ids is None:
        position_ids = torch.arange(offset, offset + T, device=x.device).expand(B, T)
    return tm.rope_cos_sin(position_ids, self.head_dim, self.theta, x.dtype)


def _positions_cases(T: int = 10) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(8)
    mask = torch.ones(3, T, dtype=torch.int64)
    mask[0, :4], mask[1, :7] = 0, 0
    return {
        "left_padded": (mask.cumsum(-1) - 1).clamp(min=0),
        "random_non_contiguous": torch.randint(0, MAX_POS, (3, T), generator=g),
        "descending": torch.arange(MAX_POS - 1, MAX_POS - 1 - T, -1).expand(3, T),
        "last_in_table": torch.arange(MAX_POS - T, MAX_POS).expand(3, T),
        "beyond_table": torch.arange(MAX_POS - 3, MAX_POS - 3 + T).expand(3, T),
        "negative": torch.arange(-4, T - 4).expand(3, T),
        "int32": torch.arange(5, 5 + T, dtype=torch.int32).expand(3, T),
    }


@pytest.mark.parametrize("case", list(_positions_cases()))
def test_rope_cache_equals_from_scratch(case: str) -> None:
    ours, _ = make_pair(kv_heads=2)
    rope = ours.model.rotary_emb
    pos = _positions_cases()[case]
    x = torch.randn(3, pos.shape[1], 32)
    cos, sin = rope(x, pos)
    ref = _scratch_rope(rope, x, pos)
    assert torch.equal(cos, ref[0]) and torch.equal(sin, ref[1])  # bitwise, not just close
    for dtype in (torch.bfloat16, torch.float16):  # fp32 table, cast at use, as before
        got, want = rope(x.to(dtype), pos), _scratch_rope(rope, x.to(dtype), pos)
        assert got[0].dtype == dtype and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    ids = torch.randint(0, 97, pos.shape, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        cached = ours(ids, position_ids=pos)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(tm.LlamaRotaryEmbedding, "forward", _scratch_rope)
            scratch = ours(ids, position_ids=pos)
    assert torch.equal(cached, scratch)


@pytest.mark.parametrize("T", [1, 7, MAX_POS], ids=["1", "7", "max"])
@pytest.mark.parametrize("offset", [0, 5, MAX_POS - 1, MAX_POS + 3])
def test_rope_default_positions_with_cache_offset_equal_from_scratch(T: int, offset: int) -> None:
    rope = tm.LlamaRotaryEmbedding(tiny_config())
    x = torch.randn(2, T, 32)
    cos, sin = rope(x, None, offset=offset)  # a table slice while offset + T <= MAX_POS
    ref = _scratch_rope(rope, x, None, offset)
    assert torch.equal(cos.expand_as(ref[0]), ref[0]) and torch.equal(sin.expand_as(ref[1]), ref[1])


def test_rope_cache_matches_from_scratch_in_training_and_kv_decode() -> None:
    ours, _ = make_pair(kv_heads=2)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(10))

    def run():
        torch.manual_seed(0)
        logits = ours(ids)
        grads = torch.autograd.grad(logits.square().mean(), list(ours.parameters()))
        with torch.no_grad():  # prefill 5, then decode with the default positions P + arange(T)
            out, cache = ours(ids[:, :5], use_cache=True)
            steps = [out]
            for t in range(5, 12):
                out, cache = ours(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
                steps.append(out)
        return logits, grads, torch.cat(steps, dim=1)

    cached = run()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tm.LlamaRotaryEmbedding, "forward", _scratch_rope)
        scratch = run()
    assert torch.equal(cached[0], scratch[0]) and torch.equal(cached[2], scratch[2])
    assert all(torch.equal(a, b) for a, b in zip(cached[1], scratch[1]))


def test_rope_tables_are_not_in_state_dict() -> None:
    ours = LlamaForCausalLM(tiny_config())
    buffers = dict(ours.named_buffers())
    assert set(buffers) == {"model.rotary_emb.cos_cached", "model.rotary_emb.sin_cached"}
    assert buffers["model.rotary_emb.cos_cached"].shape == (MAX_POS, 8)
    assert not any("rotary" in k or "cached" in k or "inv_freq" in k for k in ours.state_dict())
    fresh = LlamaForCausalLM(tiny_config())
    fresh.load_state_dict(ours.state_dict(), strict=True)


def _fresh_tables() -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(MAX_POS)[None]
    cos, sin = tm.rope_cos_sin(pos, 8, 10000.0, torch.float32)
    return cos[0, 0], sin[0, 0]


def _assert_exact_tables(model: LlamaForCausalLM) -> None:
    rope = model.model.rotary_emb
    cos, sin = _fresh_tables()
    assert rope.cos_cached.dtype == rope.sin_cached.dtype == torch.float32
    assert torch.equal(rope.cos_cached.cpu(), cos) and torch.equal(rope.sin_cached.cpu(), sin)


def test_rope_tables_stay_exact_float32_across_dtype_casts() -> None:
    ours, _ = make_pair(kv_heads=2)
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(11))
    pos = torch.arange(MAX_POS - 16, MAX_POS).expand(2, 16)
    with torch.no_grad():
        ours.to(torch.bfloat16)
        _assert_exact_tables(ours)  # not rounded to bf16
        assert ours(ids).dtype == torch.bfloat16
        ours.half().float()  # a round trip through fp16 leaves exact tables ...
        _assert_exact_tables(ours)
        never_cast = LlamaForCausalLM(ours.config).eval()  # ... so the logits are those of a model
        never_cast.load_state_dict(ours.state_dict())  # built in fp32 with the (rounded) weights
        assert torch.equal(ours(ids, position_ids=pos), never_cast(ids, position_ids=pos))
        assert torch.equal(ours(ids), never_cast(ids))
    with torch.device("meta"):  # meta init then to_empty: the tables are recomputed, not garbage
        lazy = LlamaForCausalLM(tiny_config())
    lazy.to_empty(device="cpu")
    _assert_exact_tables(lazy)


def test_rope_cache_under_torch_compile() -> None:
    ours, _ = make_pair(kv_heads=2)
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)  # no graph break
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(12))
    pos = _positions_cases(12)["left_padded"][:2]
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), ours(ids), atol=ATOL, rtol=0)
        torch.testing.assert_close(compiled(ids, position_ids=pos), ours(ids, position_ids=pos), atol=ATOL, rtol=0)


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_fused_projections_match_transformers_and_keep_hf_tensors(kv_heads: int) -> None:
    """[train] fused_projections: one q/k/v and one gate/up GEMM, the same logits and gradients,
    and the very same HF tensors in state_dict (nothing converted on save or export)."""
    ours, hf = make_pair(kv_heads=kv_heads)
    keys = {k: v.data_ptr() for k, v in ours.state_dict().items()}
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    ref_loss = ours(ids, labels=ids)
    ref_loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in ours.named_parameters()}
    ours.zero_grad()
    ours.fuse_projections()
    assert all(layer.self_attn.fused and layer.mlp.fused for layer in ours.model.layers)
    assert max_logit_diff(ours, hf, ids) <= ATOL  # the fused path against the independent implementation
    loss = ours(ids, labels=ids)
    loss.backward()
    assert torch.allclose(loss, ref_loss, atol=1e-6)
    for n, p in ours.named_parameters():
        assert torch.allclose(p.grad, ref_grads[n], atol=1e-6, rtol=1e-5), n
    assert {k: v.data_ptr() for k, v in ours.state_dict().items()} == keys  # same keys, same storage
    fused = len(_linear_calls(ours, ids))
    ours.fuse_projections(False)
    assert len(_linear_calls(ours, ids)) - fused == 3 * ours.config.num_hidden_layers  # q,k,v -> 1; gate,up -> 1


def _linear_calls(model: LlamaForCausalLM, ids: torch.Tensor) -> list[str]:
    with torch.no_grad(), torch.profiler.profile() as prof:
        model(ids)
    return [e.name for e in prof.events() if e.name == "aten::linear"]
