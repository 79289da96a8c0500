"""train/loop.py: lr schedule, AdamW groups, accumulation normalisation, NaN stop, MFU table."""

from __future__ import annotations

import math

import pytest
import torch

from prodip.train.guards import NonFiniteError
from prodip.train.loop import PEAK_BF16_FLOPS, build_optimizer, lr_at, param_groups, train_step
from prodip.train.model import LlamaForCausalLM
from tests.fixtures import tiny_config

CPU = torch.device("cpu")


def test_lr_schedule_known_values():
    kw = dict(lr=1.0, min_lr=0.1, warmup_steps=4, total_steps=14)
    assert [lr_at(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, **kw) == 1.0
    assert lr_at(9, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # halfway: 0.55
    assert lr_at(14, **kw) == pytest.approx(0.1) and lr_at(100, **kw) == pytest.approx(0.1)


def test_weight_decay_only_on_matrices():
    model = LlamaForCausalLM(tiny_config(tie_word_embeddings=True))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    ids = [id(p) for g in (decay, no_decay) for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))  # tied weight once
    # 2 layers x (q,k,v,o,gate,up,down) + embedding (tied lm_head is the same tensor)
    assert len(decay["params"]) == 2 * 7 + 1 and len(no_decay["params"]) == 2 * 2 + 1


def _grads_after(micro_batches, seed=0):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config())
    opt = build_optimizer(model, lr=0.0, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-8, device=CPU)
    grads = {}

    def capture(*_):  # read the accumulated gradients just before AdamW consumes them
        grads.update({n: p.grad.clone() for n, p in model.named_parameters()})

    opt.register_step_pre_hook(capture)
    out = train_step(model, opt, micro_batches, lr=0.0, grad_clip=0.0, device=CPU, autocast_dtype=None)
    return out, grads


def test_accumulation_equals_big_batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 320, (8, 16), generator=g)
    y = torch.randint(0, 320, (8, 16), generator=g)
    big, g_big = _grads_after([(x, y)])
    acc, g_acc = _grads_after([(x[i : i + 2], y[i : i + 2]) for i in range(0, 8, 2)])
    assert acc["loss"] == pytest.approx(big["loss"], rel=1e-6)
    assert acc["grad_norm"] == pytest.approx(big["grad_norm"], rel=1e-5)
    for name in g_big:
        torch.testing.assert_close(g_acc[name], g_big[name], rtol=1e-5, atol=1e-7, msg=name)


def test_non_finite_loss_stops_before_update():
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config())
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    before = [p.detach().clone() for p in model.parameters()]
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, device=CPU)
    x = torch.randint(0, 320, (2, 8))
    with pytest.raises(NonFiniteError, match="step 7"):
        train_step(model, opt, [(x, x)], lr=1e-3, grad_clip=1.0, device=CPU, autocast_dtype=None, step=7)
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b) or (a.isnan() == b.isnan()).all()
    assert not opt.state  # AdamW never stepped


def test_peak_table_specific_first():
    names = [k for k, _ in PEAK_BF16_FLOPS]
    assert names.index("H100 PCIe") < names.index("H100")


def test_activation_checkpointing_same_grads_and_keys():
    from prodip.train.loop import enable_activation_checkpointing

    x = torch.randint(0, 320, (2, 16))
    grads = []
    for ac in (False, True):
        torch.manual_seed(0)
        model = LlamaForCausalLM(tiny_config())
        if ac:
            keys = list(model.state_dict())
            enable_activation_checkpointing(model)
            assert list(model.state_dict()) == keys  # checkpoint keys unchanged
        torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_compiled_step_is_finite_and_fused():
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config()).to(device)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, device=device)
    assert all(g["fused"] for g in opt.param_groups)
    x = torch.randint(0, 320, (2, 16), device=device)
    out = train_step(
        torch.compile(model), opt, [(x, x)], lr=1e-3, grad_clip=1.0, device=device, autocast_dtype=torch.bfloat16
    )
    assert math.isfinite(out["loss"]) and out["grad_norm"] > 0
