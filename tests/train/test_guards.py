"""Planted-defect tests for train/guards.py: each defect class is caught and the culprit named.

Defect classes (issue 4): a fused op whose output is detached from the graph, a frozen layer, a
parameter left out of the optimizer, a NaN-producing op, accumulation without loss
normalisation. (The swapped RoPE layout is caught by the parity test in test_model.py.)

    python -m pytest tests/train/test_guards.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

from prodip.train import guards
from prodip.train.guards import GuardError, NonFiniteError
from prodip.train.model import LlamaForCausalLM
from tests.fixtures import tiny_config

V = 64


def tiny_model(*, tied: bool = False, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(vocab_size=V, tie_word_embeddings=tied))


def batch(b: int = 4, t: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, t + 1), generator=torch.Generator().manual_seed(seed))


def adamw(model: torch.nn.Module, lr: float = 1e-3) -> torch.optim.AdamW:
    """The trainer's grouping: weight decay on 2-D weights only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=lr)


def step_fn_for(tokens: torch.Tensor):
    loss_fn = guards.causal_lm_loss_fn(tokens)

    def step(model, optimizer):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model).backward()
        optimizer.step()

    return step


# ---- healthy model: every guard passes --------------------------------------------------------


@pytest.mark.parametrize("tied", [False, True])
def test_healthy_model_passes_gradient_flow(tied: bool) -> None:
    model = tiny_model(tied=tied)
    report = guards.check_gradient_flow(model, guards.causal_lm_loss_fn(batch()))
    assert report.ok and len(report.grad_norms) == len(list(model.parameters()))
    assert all(n > 0 and math.isfinite(n) for n in report.grad_norms.values())
    assert abs(report.loss - math.log(V)) < 0.1  # small init: loss ~ ln V nats
    assert all(p.grad is None for p in model.parameters())  # caller's (absent) grads restored


def test_gradient_flow_keeps_caller_grads_and_rng() -> None:
    model = tiny_model()
    marker = torch.full_like(model.lm_head.weight, 3.0)
    model.lm_head.weight.grad = marker
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    guards.check_gradient_flow(
        model, lambda m: guards.causal_lm_loss_fn(torch.randint(0, V, (2, 9)))(m)
    )  # loss_fn that consumes RNG
    assert torch.equal(torch.rand(3), expected)
    assert model.lm_head.weight.grad is marker


# ---- planted defect 1: fused op whose output is detached from the graph ---------------------


class _FusedSwiGLUNoGrad(torch.nn.Module):
    """A 'fused kernel' computed outside autograd (like a custom op registered without backward)."""

    def __init__(self, mlp):
        super().__init__()
        self.inner = mlp

    def forward(self, x):
        with torch.no_grad():
            return self.inner(x)


class _FusedRMSNormFn(torch.autograd.Function):
    """A fused RMSNorm whose backward forgets the weight gradient (returns None for it)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.save_for_backward(x)
        ctx.eps = eps
        return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps), None, None


def test_detached_fused_op_is_caught() -> None:
    model = tiny_model()
    model.model.layers[0].mlp = _FusedSwiGLUNoGrad(model.model.layers[0].mlp)
    with pytest.raises(GuardError) as err:
        guards.check_gradient_flow(model, guards.causal_lm_loss_fn(batch()))
    problems = err.value.report.problems
    # names are clean module paths (the wrapper adds ".inner"), every MLP weight of layer 0 named
    # the norm feeding only the MLP loses its gradient too: the arbiter names it as well
    assert set(problems) == {f"model.layers.0.mlp.inner.{n}_proj.weight" for n in ("gate", "up", "down")} | {
        "model.layers.0.post_attention_layernorm.weight"
    }
    assert all(why.startswith(("no gradient", "zero gradient")) for why in problems.values())
    assert "model.layers.0.mlp.inner.gate_proj.weight" in str(err.value)


def test_fused_op_without_weight_backward_is_caught() -> None:
    model = tiny_model()
    norm = model.model.norm
    norm.forward = lambda x: _FusedRMSNormFn.apply(x, norm.weight, norm.variance_epsilon)
    with pytest.raises(GuardError) as err:
        guards.check_gradient_flow(model, guards.causal_lm_loss_fn(batch()))
    assert list(err.value.report.problems) == ["model.norm.weight"]


def test_whole_graph_detached_is_caught() -> None:
    model = tiny_model()
    with pytest.raises(GuardError, match="does not require grad"):
        guards.check_gradient_flow(model, lambda m: guards.causal_lm_loss_fn(batch())(m).detach())


def test_zero_gradient_is_caught() -> None:
    model = tiny_model()
    layer = model.model.layers[1]
    original = layer.mlp.forward
    layer.mlp.forward = lambda x: original(x) * 0.0  # path cut by a multiply with 0
    with pytest.raises(GuardError) as err:
        guards.check_gradient_flow(model, guards.causal_lm_loss_fn(batch()))
    problems = err.value.report.problems
    assert set(problems) == {f"model.layers.1.mlp.{n}_proj.weight" for n in ("gate", "up", "down")} | {
        "model.layers.1.post_attention_layernorm.weight"
    }
    assert all(why.startswith("zero gradient") for why in problems.values())


# ---- planted defect 2: a frozen layer ---------------------------------------------------------


def test_frozen_layer_is_caught_unless_declared() -> None:
    model = tiny_model()
    model.model.layers[1].requires_grad_(False)
    with pytest.raises(GuardError) as err:
        guards.check_gradient_flow(model, guards.causal_lm_loss_fn(batch()))
    problems = err.value.report.problems
    assert len(problems) == 9 and all(n.startswith("model.layers.1.") for n in problems)
    assert all("frozen" in why for why in problems.values())
    report = guards.check_gradient_flow(model, guards.causal_lm_loss_fn(batch()), frozen_ok=["model.layers.1.*"])
    assert report.ok


# ---- planted defect 3: a parameter left out of the optimizer ----------------------------------


def test_parameter_left_out_of_optimizer_is_caught() -> None:
    model = tiny_model()
    # the classic weight-decay grouping bug: 1-D (RMSNorm) weights fall through
    opt = torch.optim.AdamW([p for p in model.parameters() if p.dim() >= 2], lr=1e-3)
    with pytest.raises(GuardError) as err:
        guards.check_update_flow(model, opt, step_fn_for(batch()))
    problems = err.value.report.problems
    norms = {n for n, _ in model.named_parameters() if n.endswith("norm.weight")}
    assert set(problems) == norms and len(norms) == 5
    assert all("not in any optimizer param group" in why for why in problems.values())


@pytest.mark.filterwarnings("ignore:optimizer contains a parameter group with duplicate parameters")
def test_parameter_in_two_groups_and_foreign_tensor_are_caught() -> None:
    model = tiny_model()
    stale = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([{"params": list(model.parameters()) + [model.lm_head.weight, stale]}], lr=0.1)
    problems = guards.optimizer_membership(model, opt)
    assert "groups [0, 0]" in problems["lm_head.weight"]
    assert any(k.startswith("<optimizer group 0") for k in problems)


def test_update_flow_passes_and_restores_bitwise() -> None:
    tokens = [batch(seed=s) for s in range(4)]

    def train(check: bool) -> list[torch.Tensor]:
        model = tiny_model(tied=True)
        opt = adamw(model)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 2))  # warmup from lr 0
        if check:
            report = guards.check_update_flow(model, opt, step_fn_for(tokens[0]), scheduler=sched, probe_lr=1e-3)
            assert report.ok and report.restored
            assert min(report.max_abs_update.values()) > 0
        for t in tokens:
            step_fn_for(t)(model, opt)
            sched.step()
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(train(False), train(True)):
        assert torch.equal(a, b)


def test_update_flow_at_lr_zero_reports_unchanged() -> None:
    model = tiny_model()
    opt = adamw(model, lr=0.0)
    report = guards.check_update_flow(model, opt, step_fn_for(batch()), raise_on_error=False)
    assert len(report.problems) == len(list(model.parameters()))
    assert all(why.startswith("unchanged") for why in report.problems.values())


# ---- planted defect 4: a NaN-producing op ------------------------------------------------------


def _plant_nan_backward(model: LlamaForCausalLM) -> None:
    """sqrt(x**2) is finite forward, NaN backward at x == 0 (0 * inf): a loss curve never shows it."""
    mlp = model.model.layers[0].mlp
    original = mlp.forward

    def forward(x):
        mask = torch.ones(x.shape[-1])
        mask[0] = 0.0  # e.g. a masked feature: an exact zero
        h = original(x) * mask
        return torch.sqrt(h * h)  # |h| written naively

    mlp.forward = forward


def test_nan_in_backward_is_caught_by_gradient_flow_and_check_finite() -> None:
    model = tiny_model()
    _plant_nan_backward(model)
    loss_fn = guards.causal_lm_loss_fn(batch())
    assert math.isfinite(loss_fn(model).item())  # the loss looks fine
    with pytest.raises(GuardError) as err:
        guards.check_gradient_flow(model, loss_fn)
    problems = err.value.report.problems
    assert any(why.startswith("non-finite gradient") for why in problems.values())
    assert "model.layers.0.mlp.down_proj.weight" in problems
    # the per-step check on the trainer's own grad norm
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with pytest.raises(NonFiniteError, match=r"step 17: .*grad norm nan.*model\.layers\.0\.mlp"):
        guards.check_finite(loss, grad_norm, step=17, model=model)


def test_nan_loss_is_caught_by_check_finite() -> None:
    model = tiny_model()
    mlp = model.model.layers[1].mlp
    original = mlp.forward
    mlp.forward = lambda x: original(x) + torch.log(x[..., :1] - 1e9)  # log of a negative: NaN
    loss = guards.causal_lm_loss_fn(batch())(model)
    with pytest.raises(NonFiniteError, match="step 3: non-finite training state: loss nan"):
        guards.check_finite(loss, step=3)
    with pytest.raises(NonFiniteError, match="loss inf"):
        guards.check_finite(torch.tensor(float("inf")), torch.tensor(1.0), step=4)


def test_check_finite_passes_on_finite_values() -> None:
    guards.check_finite(torch.tensor(2.5), torch.tensor(0.7), step=1)
    guards.check_finite(torch.tensor(2.5), step=1)


# ---- planted defect 5: accumulation without loss normalisation --------------------------------


def _accumulate(tokens: torch.Tensor, micro: int, normalise: bool):
    def run(model):
        for chunk in tokens.chunk(micro):
            loss = guards.causal_lm_loss_fn(chunk)(model)
            (loss / micro if normalise else loss).backward()

    return run


def _one_batch(tokens: torch.Tensor):
    return lambda model: guards.causal_lm_loss_fn(tokens)(model).backward()


def test_accumulation_with_normalisation_passes() -> None:
    model = tiny_model()
    tokens = batch(b=8)
    report = guards.check_accumulation(model, _one_batch(tokens), _accumulate(tokens, 4, True))
    assert report.ok and report.norm_ratio == pytest.approx(1.0, abs=1e-5)


def test_accumulation_without_normalisation_is_caught() -> None:
    model = tiny_model()
    tokens = batch(b=8)
    with pytest.raises(GuardError, match="norm ratio 4.0000") as err:
        guards.check_accumulation(model, _one_batch(tokens), _accumulate(tokens, 4, False))
    assert err.value.report.norm_ratio == pytest.approx(4.0, rel=1e-5)
    assert all(p.grad is None for p in model.parameters())


# ---- wrappers: torch.compile and DDP ----------------------------------------------------------


def test_clean_name_strips_wrapper_prefixes() -> None:
    assert guards.clean_name("module._orig_mod.model.norm.weight") == "model.norm.weight"
    assert guards.clean_name("_orig_mod.module.lm_head.weight") == "lm_head.weight"
    assert guards.clean_name("model.layers.0.mlp.module.w") == "model.layers.0.mlp.module.w"


def test_gradient_flow_after_torch_compile_names_clean_parameters() -> None:
    model = tiny_model()
    model.model.layers[1].mlp = _FusedSwiGLUNoGrad(model.model.layers[1].mlp)
    compiled = torch.compile(model, backend="aot_eager")
    assert any(n.startswith("_orig_mod.") for n, _ in compiled.named_parameters())
    with pytest.raises(GuardError) as err:
        guards.check_gradient_flow(compiled, guards.causal_lm_loss_fn(batch()))
    assert set(err.value.report.problems) == {
        f"model.layers.1.mlp.inner.{n}_proj.weight" for n in ("gate", "up", "down")
    } | {"model.layers.1.post_attention_layernorm.weight"}


def test_guards_under_ddp_strip_module_prefix(tmp_path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = tiny_model()
        model.model.layers[0].requires_grad_(False)
        wrapped = DDP(model)
        with pytest.raises(GuardError) as err:
            guards.check_gradient_flow(wrapped, guards.causal_lm_loss_fn(batch()))
        assert all(n.startswith("model.layers.0.") for n in err.value.report.problems)
        healthy = DDP(tiny_model())
        assert guards.check_gradient_flow(healthy, guards.causal_lm_loss_fn(batch())).ok
        opt = adamw(healthy)
        report = guards.check_update_flow(healthy, opt, step_fn_for(batch()))
        assert report.ok and "lm_head.weight" in report.max_abs_update
    finally:
        dist.destroy_process_group()


class _GradCapture(torch.optim.SGD):
    """An 'optimizer' that leaves the weights and the accumulated gradients in place."""

    def __init__(self, params):
        super().__init__(params, lr=0.0)

    def step(self, closure=None):
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None


def test_trainer_train_step_accumulation_passes_the_guard() -> None:
    loop = pytest.importorskip("prodip.train.loop")
    model = tiny_model()
    tokens = batch(b=8)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def run(micro: int):
        def fn(m):
            pairs = list(zip(x.chunk(micro), y.chunk(micro)))
            loop.train_step(
                m,
                _GradCapture(m.parameters()),
                pairs,
                lr=0.0,
                grad_clip=0.0,
                device=torch.device("cpu"),
                autocast_dtype=None,
            )

        return fn

    report = guards.check_accumulation(model, run(1), run(4))
    assert report.ok and report.norm_ratio == pytest.approx(1.0, abs=1e-5)
