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


def _chat_rows(trained: list[int], t: int = 16, seed: int = 2) -> list[tuple[torch.Tensor, ...]]:
    """Packed-chat-shaped micro-batches of one row each: ``trained[i]`` targets counted in row i, the rest -100."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in trained:
        x = torch.randint(0, 320, (1, t), generator=g)
        y = torch.full((1, t), -100)
        y[0, t - n :] = torch.randint(0, 320, (n,), generator=g)  # a reply at the row's end
        pos = torch.arange(t)[None]
        rows.append((x, y, pos, torch.zeros(1, t, dtype=torch.int64)))
    return rows


def _cat(rows):
    return tuple(torch.cat(parts) for parts in zip(*rows))


def test_accumulation_weighs_trained_tokens_not_micro_batches():
    """Rows with 15 and 2 trained targets: accumulated one per micro-batch, the gradient and loss are those of
    one batch of both (weighing the micro-batches equally gives a relative difference of order 1)."""
    rows = _chat_rows([15, 2])
    one, g_one = _grads_after([_cat(rows)])
    acc, g_acc = _grads_after(rows)
    assert one["trained_tokens"] == acc["trained_tokens"] == 17
    assert acc["loss"] == pytest.approx(one["loss"], rel=1e-6)
    flat = lambda g: torch.cat([v.flatten() for v in g.values()])  # noqa: E731
    assert float((flat(g_acc) - flat(g_one)).norm() / flat(g_one).norm()) < 1e-5
    # the per-token mean by hand: the batch loss is the mean over its 17 trained targets
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config())
    x, y, pos, doc = _cat(rows)
    with torch.no_grad():
        logits = model(x, position_ids=pos, document_ids=doc)
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=-100)
    assert one["loss"] == pytest.approx(float(want), rel=1e-5)


def test_accumulation_guard_catches_micro_batch_weighting():
    """The guard the trainer runs before step 1 passes train_step on chat rows and refuses a step that divides
    each micro-batch's mean loss by N (right only for equal token counts)."""
    from prodip.train import trainer
    from prodip.train.guards import GuardError
    from prodip.train.loop import batch_loss

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config())
    rows = _chat_rows([15, 2, 9])
    report = trainer.check_accumulation(model, rows, CPU)
    assert report.ok and report.rel_diff < 1e-5

    def micro_weighted(m, _opt, micro, **_kw):
        micro = list(micro)
        for mb in micro:
            (batch_loss(m, mb) / len(micro)).backward()

    original = trainer.train_step
    trainer.train_step = micro_weighted
    try:
        with pytest.raises(GuardError, match="gradient accumulation: .*weighed by their trained") as err:
            trainer.check_accumulation(model, rows, CPU)
    finally:
        trainer.train_step = original
    assert err.value.report.rel_diff > 0.05
    assert all(p.grad is None for p in model.parameters())  # the guard leaves no gradients behind


def _ddp_rank(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = LlamaForCausalLM(tiny_config())
        wrapped = DDP(model)
        opt = build_optimizer(model, lr=0.0, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-8, device=CPU)
        grads = {}
        opt.register_step_pre_hook(lambda *_: grads.update({n: p.grad.clone() for n, p in model.named_parameters()}))
        rows = _chat_rows([15, 2, 1, 9])  # rank r takes rows 2r, 2r + 1, one per micro-batch
        out_step = train_step(
            wrapped, opt, rows[2 * rank : 2 * rank + 2], lr=0.0, grad_clip=0.0, device=CPU, autocast_dtype=None
        )
        if rank == 0:
            torch.save({"grads": grads, "out": out_step}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_accumulation_is_token_weighted_across_ddp_ranks(tmp_path):
    """Two gloo ranks, two micro-batches each, 17 and 10 trained targets per rank: the all-reduced count makes
    the DDP gradient equal to that of one process holding all four rows."""
    import torch.multiprocessing as mp

    out = tmp_path / "rank0.pt"
    mp.spawn(_ddp_rank, args=(2, f"file://{tmp_path / 'pg'}", str(out)), nprocs=2, join=True)
    got = torch.load(out)
    one, g_one = _grads_after([_cat(_chat_rows([15, 2, 1, 9]))])
    assert got["out"]["trained_tokens"] == 27 and got["out"]["loss"] == pytest.approx(one["loss"], rel=1e-6)
    for name in g_one:
        torch.testing.assert_close(got["grads"][name], g_one[name], rtol=1e-5, atol=1e-7, msg=name)
