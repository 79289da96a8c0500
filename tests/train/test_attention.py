"""[train] attention_backend and deterministic: the kernel that ran is named, an impossible one is
refused, the model really runs under the choice, and the resume comparison catches a broken resume."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
import tomllib
import torch

from prodip.base.errors import InvalidInput
from prodip.cli import main as prodip_main
from prodip.train import attention, determinism
from prodip.train.model import LlamaForCausalLM
from prodip.train.trainer import run_training, train
from tests.fixtures import tiny_config
from tests.train.test_trainer import _cfg, _losses

ROOT = Path(__file__).resolve().parents[2]

SHAPES = dict(heads=4, kv_heads=2, head_dim=8, seq_len=16)


def test_the_config_offers_exactly_the_kernels_attention_maps():
    """[train] attention_backend's choices (prodip.train.config, torch-free) are the keys of attention.BACKENDS."""
    from prodip.train.config import ATTENTION_BACKENDS, TrainConfig

    assert tuple(attention.BACKENDS) == ATTENTION_BACKENDS
    field = next(f for f in dataclasses.fields(TrainConfig) if f.name == "attention_backend")
    assert field.metadata["choices"] == ATTENTION_BACKENDS


def test_probe_names_the_cpu_kernels_and_refuses_gpu_only_ones():
    cpu = torch.device("cpu")
    assert attention.probe("math", cpu, torch.float32, **SHAPES).op == "aten::_scaled_dot_product_attention_math"
    flash = attention.probe("flash", cpu, torch.float32, **SHAPES)
    assert flash.kernel == "flash (cpu)" and flash.op == "aten::_scaled_dot_product_flash_attention_for_cpu"
    auto = attention.probe("auto", cpu, torch.float32, **SHAPES)
    assert auto.kernel in ("flash (cpu)", "math")  # PyTorch's own pick, named
    for name in ("cudnn", "efficient"):
        with pytest.raises(InvalidInput, match=rf"attention_backend = {name} cannot run on cpu .*H=4, Hkv=2") as err:
            attention.probe(name, cpu, torch.float32, **SHAPES)
        assert "\n" not in str(err.value)
    with pytest.raises(InvalidInput, match="choose one of auto, flash, cudnn, efficient, math"):
        attention.probe("xformers", cpu, torch.float32, **SHAPES)


def test_the_model_runs_the_chosen_kernel():
    model = LlamaForCausalLM(tiny_config())
    x = torch.randint(3, 300, (2, 16))
    seen = {}
    for backend in ("math", "flash"):
        with attention.context(backend), torch.profiler.profile() as prof:
            model(x, labels=x).backward()
        seen[backend] = {e.name for e in prof.events() if e.name in attention.KERNEL_OPS}
    assert seen == {
        "math": {"aten::_scaled_dot_product_attention_math"},
        "flash": {"aten::_scaled_dot_product_flash_attention_for_cpu"},
    }


def test_deterministic_attention_choice_on_cuda():
    """Flash first (deterministic backward, GQA), math last (fp32 probabilities); efficient only without GQA."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    # the 0.4B config is GQA (16 query heads, 8 key/value heads)
    model = tomllib.loads((ROOT / "configs" / "h100-0.4b.toml").read_text())["model"]
    gqa = model["num_key_value_heads"] < model["num_attention_heads"]
    assert gqa and determinism.attention_choice("auto", True, cuda, gqa=gqa) == ["flash", "math"]
    assert determinism.attention_choice("auto", True, cuda, gqa=False) == ["flash", "efficient", "math"]
    assert determinism.attention_choice("auto", False, cuda, gqa=True) == ["auto"]
    assert determinism.attention_choice("math", True, cuda) == ["math"]
    assert determinism.attention_choice("flash", True, cuda, gqa=True) == ["flash"]
    assert determinism.attention_choice("cudnn", True, cpu) == ["cudnn"]
    with pytest.raises(InvalidInput, match="attention_backend = cudnn has a nondeterministic backward"):
        determinism.attention_choice("cudnn", True, cuda)


def test_resume_tolerance_follows_the_measured_noise_floor():
    straight = [10.0, 9.5, 9.0, 8.7]
    again = [10.0, 9.5 * (1 + 2e-5), 9.0 * (1 - 3e-5), 8.7]  # a second straight run: kernel noise only
    floor = determinism.noise_floor(straight, again)
    assert floor == pytest.approx(3e-5, rel=1e-6)
    assert determinism.resume_rtol(floor) == pytest.approx(1.5e-4)  # 5 x floor
    assert determinism.resume_rtol(0.0) == determinism.MIN_RESUME_RTOL  # CPU: bitwise runs, floor 0
    assert determinism.noise_floor(straight, straight[:3]) == float("inf")
    # a lost optimizer state / wrong data position (~3e-3 relative) fails; noise-sized resume passes
    off = [10.0, 9.5, 9.0 * (1 + 3e-3), 8.7]
    assert not determinism.compare_resume(straight, off, bitwise=False, rtol=determinism.resume_rtol(floor))["ok"]
    near = [10.0, 9.5 * (1 + 1e-4), 9.0, 8.7]
    assert determinism.compare_resume(straight, near, bitwise=False, rtol=determinism.resume_rtol(floor))["ok"]


def test_compare_resume_bitwise_and_tolerance():
    a = [10.0, 9.5, 9.0, 8.7]
    assert determinism.compare_resume(a, list(a), bitwise=True)["ok"]
    near = [10.0, 9.5, 9.0 * (1 + 1e-4), 8.7]
    bit = determinism.compare_resume(a, near, bitwise=True)
    assert not bit["ok"] and bit["first_bad_step"] == 3
    tol = determinism.compare_resume(a, near, bitwise=False)
    assert tol["ok"] and tol["rtol"] == determinism.RESUME_LOSS_RTOL and 0 < tol["max_rel_diff"] < 2e-4
    far = [10.0, 9.5, 9.0 * 1.05, 8.7]  # a resume that lost the data position jumps by percent
    assert determinism.compare_resume(a, far, bitwise=False)["first_bad_step"] == 3
    assert not determinism.compare_resume(a, a[:3], bitwise=False)["ok"]


@pytest.mark.slow
def test_resume_without_deterministic_is_within_tolerance_and_bitwise_on_cpu(
    tmp_path, tiny_tokenizer_dir, tiny_shards_dir
):
    """deterministic = false, attention = math: the tolerance check passes (and CPU is bitwise anyway),
    and a run that differs for real (another seed) fails it."""
    mcfg = tiny_config()
    kw = dict(deterministic=False, attention_backend="math", steps=6, checkpoint_every_steps=3)
    launched = time.time()
    straight = train(_cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "a", **kw), mcfg)
    half = _cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "b", max_steps_this_run=3, **kw)
    run_training(half, mcfg)
    resumed = train(dataclasses.replace(half, max_steps_this_run=0, resume=True), mcfg)
    assert determinism.compare_resume(_losses(straight), _losses(resumed), bitwise=False)["ok"]
    assert determinism.compare_resume(_losses(straight), _losses(resumed), bitwise=True)["ok"]
    # another data order and init: on these random-token shards the losses differ by only ~0.3 %
    other = train(_cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "c", seed=7, **kw), mcfg)
    assert not determinism.compare_resume(_losses(straight), _losses(other), bitwise=False)["ok"]
    rows = [json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["attention_kernel"] == "math" and rows[0]["deterministic"] is False
    assert "attention_kernel" not in rows[1] and "loop_start_unix_s" not in rows[1]
    # the loop's wall-clock start: after this test launched it, before its first step ended
    assert launched < rows[0]["loop_start_unix_s"] < time.time() - rows[-1]["elapsed_s"]
    resumed_rows = [json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert resumed_rows[3]["attention_kernel"] == "math"  # each invocation names its kernel
    assert 'attention_backend = "math"' in (straight / "config.toml").read_text()


def test_an_impossible_backend_is_refused_before_training(tmp_path, tiny_tokenizer_dir, tiny_shards_dir, capsys):
    cfg = _cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "r", attention_backend="cudnn")
    with pytest.raises(InvalidInput, match="attention_backend = cudnn cannot run on cpu"):
        train(cfg, tiny_config())
    assert not (tmp_path / "r" / "metrics.jsonl").exists()
    toml = tmp_path / "c.toml"
    toml.write_text(
        f'[train]\nshards_dir = "{tiny_shards_dir}"\ntokenizer_dir = "{tiny_tokenizer_dir}"\n'
        f'out_dir = "{tmp_path / "r2"}"\ndevice = "cpu"\nseq_len = 16\nprogress = false\n'
        "[model]\nhidden_size = 32\nintermediate_size = 64\nnum_hidden_layers = 2\nnum_attention_heads = 4\n"
        "num_key_value_heads = 2\nmax_position_embeddings = 64\n"
    )
    assert prodip_main(["train", "--config", str(toml), "--attention-backend", "efficient"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any("attention_backend = efficient cannot run on cpu" in line for line in err)


def test_the_probe_keeps_the_profilers_native_lines_off_the_terminal(capfd):
    """The CPU build's profiler prints "USDT: ... profiler_start/stop" to fd 2 at every use; the probe runs it
    at every training start, so those lines go to prodip's log, and the terminal shows nothing."""
    import torch

    from prodip.train.attention import probe

    kernel = probe("auto", torch.device("cpu"), torch.float32, heads=2, kv_heads=1, head_dim=8, seq_len=16)
    assert kernel.backend == "auto"
    err = capfd.readouterr().err
    assert "USDT" not in err and "profiler_st" not in err, err
