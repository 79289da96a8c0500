"""Real processes: SIGKILL at random moments never leaves a bad `latest`; torchrun DDP on gloo.

python -m pytest tests/train/test_kill_ddp.py -q
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from prodip.base.config import dump_toml
from prodip.train import checkpoint as ck
from prodip.train.loop import build_optimizer
from prodip.train.model import LlamaForCausalLM
from prodip.train.trainer import TrainConfig, train
from tests.fixtures import tiny_config

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _toml(path, tok, shards, out, **train_kw):
    base = dict(
        shards_dir=str(shards),
        tokenizer_dir=str(tok),
        out_dir=str(out),
        batch_size=2,
        seq_len=16,
        device="cpu",
        progress=False,
        lr=3e-3,
        warmup_steps=2,
    )
    base.update(train_kw)
    path.write_text(dump_toml({"model": tiny_config().to_dict(), "train": base}))
    return path


def _read(path):
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigkill_never_leaves_bad_latest(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    out = tmp_path / "run"
    toml = _toml(
        tmp_path / "run.toml",
        tiny_tokenizer_dir,
        tiny_shards_dir,
        out,
        steps=100000,
        checkpoint_every_steps=1,
        keep_last=2,
    )
    rng = random.Random(0)
    kills_after_a_checkpoint, last_step = 0, 0
    for _attempt in range(4):
        cmd = [sys.executable, "-m", "prodip.train", "train", "--config", str(toml)]
        if (out / "checkpoints" / "latest").exists():
            cmd.append("--resume")
        proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        latest, before = out / "checkpoints" / "latest", _read(out / "checkpoints" / "latest")
        deadline = time.time() + 60
        while _read(latest) == before and time.time() < deadline:  # this process saved once
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))  # somewhere in the step/save cycle
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        model, cfg, info = ck.load_model(out)  # what `latest` names must verify and load
        assert cfg == tiny_config() and all(torch.isfinite(p).all() for p in model.parameters())
        fresh = LlamaForCausalLM(cfg)
        opt = build_optimizer(fresh, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, device=torch.device("cpu"))
        resumed = ck.load_training_state(out, fresh, opt)
        assert resumed.state.step == info["step"] >= last_step  # resumes never go backwards
        kills_after_a_checkpoint += info["step"] > last_step
        last_step = info["step"]
    assert kills_after_a_checkpoint >= 3 and last_step > 3


_FLAKY = (
    "EADDRINUSE",
    "address already in use",
    "DistNetworkError",
    "Connection reset",
    "rendezvous",
    "terminate called without an active exception",
)


def _torchrun(toml, run_dir, *extra, nproc=2):
    """``torchrun --nproc_per_node NPROC -m prodip.train train``; returns the CompletedProcess.

    Retried once: a port race with other jobs, or a rank that aborted inside gloo ("terminate
    called without an active exception", exit -6; seen once in ~15 CI-like runs before
    train.distributed.teardown freed the DDP wrapper and met at a barrier before destroying the
    group). A second failure fails the test and shows both attempts.
    """
    errors = []
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    cmd += ["-m", "prodip.train", "train", "--config", str(toml), *extra]
    for attempt in ("first", "retry"):
        res = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=100)
        errors.append(f"--- {attempt}: exit {res.returncode}\n{res.stderr[-2500:]}")
        if res.returncode == 0 or not any(word in res.stderr for word in _FLAKY):
            break
    assert res.returncode == 0, "\n".join(errors)
    return res


def _single(tmp_path, tok, shards, **kw):
    cfg = TrainConfig(
        shards_dir=str(shards),
        tokenizer_dir=str(tok),
        out_dir=str(tmp_path / "single"),
        batch_size=4,
        seq_len=16,
        device="cpu",
        progress=False,
        lr=3e-3,
        warmup_steps=2,
        **kw,
    )  # the global batch of 2 ranks x 2
    return train(cfg, tiny_config())


def _assert_same_training(run_dir, single_dir):
    """Weights equal to fp32 tolerance, and the logged loss (averaged over ranks) equal too."""
    a = load_file(str(ck.resolve_checkpoint(run_dir) / "model.safetensors"))
    b = load_file(str(ck.resolve_checkpoint(single_dir) / "model.safetensors"))
    start = LlamaForCausalLM(tiny_config()).state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)
    print("2 ranks vs single max |diff|:", max(float((a[k] - b[k]).abs().max()) for k in a))
    assert any(not torch.equal(a[k], start[k]) for k in a)  # it trained
    la = [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x)["loss"] for x in (single_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(la) == len(lb) == 4
    assert la == pytest.approx(lb, rel=1e-5)  # the whole batch's loss, not rank 0's half


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_torchrun_ddp_matches_single_process(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    kw = dict(steps=4, grad_accum_steps=2, checkpoint_every_steps=0, mixture={"bn": 0.5, "en": 0.5})
    run_dir = tmp_path / "ddp"
    _torchrun(_toml(tmp_path / "ddp.toml", tiny_tokenizer_dir, tiny_shards_dir, run_dir, **kw), run_dir)
    state = json.loads((ck.resolve_checkpoint(run_dir) / "trainer_state.json").read_text())
    hashes = state["param_sha256_by_rank"]
    assert state["world_size"] == 2 and len(hashes) == 2 and hashes[0] == hashes[1]  # ranks identical
    _assert_same_training(run_dir, _single(tmp_path, tiny_tokenizer_dir, tiny_shards_dir, **kw))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_fsdp2_matches_single_process_through_a_sharded_resume(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    kw = dict(steps=4, grad_accum_steps=2, checkpoint_every_steps=2, mixture={"bn": 0.5, "en": 0.5})
    run_dir = tmp_path / "fsdp"
    toml = _toml(tmp_path / "fsdp.toml", tiny_tokenizer_dir, tiny_shards_dir, run_dir, parallel="fsdp", **kw)
    _torchrun(toml, run_dir, "--max-steps-this-run", "2")  # stops after the step-2 save ...
    ckpt = ck.resolve_checkpoint(run_dir)
    shards = sorted(p.name for p in (ckpt / ck.OPTIMIZER_DCP_DIR).iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # AdamW state: one shard per rank
    assert not (ckpt / ck.OPTIMIZER_FILE).exists()
    ck.verify_manifest(ckpt)  # the shards are hashed in the manifest like every other file
    _torchrun(toml, run_dir, "--resume")  # ... and resumes through torch.distributed.checkpoint
    _assert_same_training(run_dir, _single(tmp_path, tiny_tokenizer_dir, tiny_shards_dir, **kw))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_explicit_parallel_runs_at_one_rank_under_torchrun(tmp_path, tiny_tokenizer_dir, tiny_shards_dir, parallel):
    """``--parallel ddp|fsdp`` under torchrun with one process joins a gloo group and wraps the model
    (so one GPU can exercise the multi-GPU code); it trains the same as a plain single process."""
    kw = dict(steps=2, checkpoint_every_steps=2)
    run_dir = tmp_path / parallel
    toml = _toml(tmp_path / "one.toml", tiny_tokenizer_dir, tiny_shards_dir, run_dir, parallel=parallel, **kw)
    res = _torchrun(toml, run_dir, nproc=1)
    assert f"parallel: {parallel} over 1 rank(s)" in res.stderr
    ckpt = ck.resolve_checkpoint(run_dir)
    assert (ckpt / ck.OPTIMIZER_DCP_DIR).is_dir() == (parallel == "fsdp")  # FSDP2 saves AdamW through DCP
    plain = train(
        TrainConfig(
            shards_dir=str(tiny_shards_dir), tokenizer_dir=str(tiny_tokenizer_dir), out_dir=str(tmp_path / "plain"),
            batch_size=2, seq_len=16, device="cpu", progress=False, lr=3e-3, warmup_steps=2, **kw,
        ),
        tiny_config(),
    )  # fmt: skip
    losses = [[json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (run_dir, plain)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
