"""Checkpoints that do not stop training (train/saver.py) and the hashing safetensors writer.

python -m pytest tests/train/test_saver.py -q
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from prodip.base.errors import MissingInput
from prodip.base.files import file_sha256
from prodip.train import checkpoint as ck
from prodip.train.loop import build_optimizer
from prodip.train.model import LlamaForCausalLM
from prodip.train.safetensors_stream import write_safetensors
from prodip.train.saver import AsyncCheckpointer
from prodip.train.trainer import TrainConfig, train
from tests.fixtures import tiny_config


def test_write_safetensors_is_read_by_safetensors(tmp_path):
    tensors = {
        "b": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "a": torch.randn(4, dtype=torch.bfloat16),
        "step": torch.tensor(3.0),
        "rng": torch.randint(0, 255, (16,), dtype=torch.uint8),
        "empty": torch.zeros(0, 2),
    }
    size, sha = write_safetensors(tmp_path / "x.safetensors", tensors, {"k": "v"})
    assert size == (tmp_path / "x.safetensors").stat().st_size and sha == file_sha256(tmp_path / "x.safetensors")
    got = load_file(str(tmp_path / "x.safetensors"))
    assert set(got) == set(tensors)
    for key, value in tensors.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
    with safe_open(str(tmp_path / "x.safetensors"), framework="pt") as fh:
        assert fh.metadata() == {"k": "v"}
    save_file(tensors, str(tmp_path / "lib.safetensors"), metadata={"k": "v"})  # same content as the library's
    lib = load_file(str(tmp_path / "lib.safetensors"))
    assert all(torch.equal(lib[k], got[k]) for k in tensors)


def _trained(cfg):
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, device=torch.device("cpu"))
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    model(x, labels=x).backward()
    opt.step()
    return model, opt


def _train_config(tmp_path, tokenizer_dir, shards_dir, **overrides):
    """A 3-step CPU run of the tiny model, no guards, no progress bar."""
    base = dict(steps=3, batch_size=2, seq_len=16, device="cpu", progress=False, guards=False)
    return TrainConfig(
        shards_dir=str(shards_dir), tokenizer_dir=str(tokenizer_dir), out_dir=str(tmp_path / "run"), **base | overrides
    )


def _save_kwargs(tok):
    return dict(tokenizer_dir=tok, tokens_seen=7, train_config={"lr": 1.0}, data_state={"batch_index": 3}, keep_last=2)


def test_background_save_equals_blocking_save_and_holds_the_state_of_its_step(tmp_path, tiny_tokenizer_dir):
    cfg = tiny_config()
    model, opt = _trained(cfg)
    blocking = ck.save_checkpoint(
        tmp_path / "a",
        step=1,
        model=model,
        model_config=cfg,
        optimizer=opt,
        **_save_kwargs(tiny_tokenizer_dir),
        extra_state={"world_size": 1},
    )
    saver = AsyncCheckpointer(tmp_path / "b")
    stall = saver.save(step=1, model=model, model_config=cfg, optimizer=opt, **_save_kwargs(tiny_tokenizer_dir))
    # training goes on at once (the next optimizer.step waits for the snapshot's copy, if still
    # running); the checkpoint keeps step 1's values
    x = torch.randint(0, cfg.vocab_size, (2, 8))
    model(x, labels=x).backward()
    opt.step()
    saver.close()
    assert stall >= 0 and saver.last_write_s is not None
    background = ck.resolve_checkpoint(tmp_path / "b")
    ma = json.loads((blocking / "manifest.json").read_text())["files"]
    mb = json.loads((background / "manifest.json").read_text())["files"]
    assert ma == mb  # byte-identical files: model, optimizer, RNG, trainer state, tokenizer copy
    ck.verify_manifest(background)
    loaded, _, info = ck.load_model(tmp_path / "b")
    assert info["step"] == 1
    assert not torch.equal(loaded.lm_head.weight, model.lm_head.weight)  # model moved on after the save


def test_optimizer_step_waits_for_the_snapshot_copy(tmp_path, tiny_tokenizer_dir, monkeypatch):
    cfg = tiny_config()
    model, opt = _trained(cfg)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    copied = []
    real_stage = ck.stage_snapshot

    def slow_stage(snap, buffers=None):  # a copy that takes a while, as 4.75 GB on a busy CPU
        time.sleep(0.5)
        real_stage(snap, buffers)
        copied.append(time.perf_counter())

    monkeypatch.setattr(ck, "stage_snapshot", slow_stage)
    saver = AsyncCheckpointer(tmp_path)
    stall = saver.save(step=1, model=model, model_config=cfg, optimizer=opt, **_save_kwargs(tiny_tokenizer_dir))
    assert stall < 0.5  # the caller went on at once
    opt.step()  # in-place update: held until the copy is complete
    assert copied and time.perf_counter() >= copied[0] and saver.pop_held_s() > 0.1
    saver.close()
    loaded = load_file(str(ck.resolve_checkpoint(tmp_path) / "model.safetensors"))
    for key, value in loaded.items():
        assert torch.equal(value, expected[key]), key


def test_background_error_surfaces_at_the_next_call(tmp_path, tiny_tokenizer_dir):
    cfg = tiny_config()
    model, opt = _trained(cfg)
    saver = AsyncCheckpointer(tmp_path)
    kwargs = {**_save_kwargs(tiny_tokenizer_dir), "tokenizer_dir": tmp_path / "nowhere"}
    saver.save(step=1, model=model, model_config=cfg, optimizer=opt, **kwargs)
    with pytest.raises(MissingInput, match="nowhere"):
        saver.close()
    assert not (tmp_path / "latest").exists()  # nothing half-written is ever named


def test_saves_spaced_by_wall_time(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    cfg = _train_config(
        tmp_path, tiny_tokenizer_dir, tiny_shards_dir, checkpoint_every_steps=0, checkpoint_every_s=1e-9, keep_last=5
    )  # a save due at every step
    run = train(cfg, tiny_config())
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == [
        "step_0000001",
        "step_0000002",
        "step_0000003",
    ]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["checkpoint_stall_s"] >= 0 for r in rows)


def test_prepare_allocates_every_buffer_a_save_uses_before_the_first_save(tmp_path, tiny_tokenizer_dir):
    cfg = tiny_config()
    model, opt = _trained(cfg)
    saver = AsyncCheckpointer(tmp_path / "b")
    saver.prepare(model=model, tie_word_embeddings=cfg.tie_word_embeddings, optimizer=opt)
    saver.wait()  # the allocation ran in the background thread
    prepared = {name: buf.data_ptr() for name, buf in saver._buffers.items()}
    n_model = len([k for k in model.state_dict() if not (cfg.tie_word_embeddings and k == ck.TIED_ALIAS)])
    n_opt = sum(torch.is_tensor(v) for state in opt.state_dict()["state"].values() for v in state.values())
    assert len(prepared) == n_model + n_opt and all(not buf.any() for buf in saver._buffers.values())
    saver.prepare(model=model, tie_word_embeddings=cfg.tie_word_embeddings, optimizer=opt)  # a no-op now
    saver.save(step=1, model=model, model_config=cfg, optimizer=opt, **_save_kwargs(tiny_tokenizer_dir))
    saver.wait()
    assert {name: buf.data_ptr() for name, buf in saver._buffers.items()} == prepared  # reused, none added
    saver.close()
    blocking = ck.save_checkpoint(
        tmp_path / "a",
        step=1,
        model=model,
        model_config=cfg,
        optimizer=opt,
        **_save_kwargs(tiny_tokenizer_dir),
        extra_state={"world_size": 1},
    )
    got = json.loads((ck.resolve_checkpoint(tmp_path / "b") / "manifest.json").read_text())["files"]
    assert got == json.loads((blocking / "manifest.json").read_text())["files"]


def test_trainer_prepares_the_save_buffers_after_its_first_step(
    tmp_path, tiny_tokenizer_dir, tiny_shards_dir, monkeypatch
):
    calls = []
    real = AsyncCheckpointer.prepare

    def spy(self, **kwargs):
        calls.append(len(kwargs["optimizer"].state))  # AdamW state exists when called
        real(self, **kwargs)

    monkeypatch.setattr(AsyncCheckpointer, "prepare", spy)
    cfg = _train_config(tmp_path, tiny_tokenizer_dir, tiny_shards_dir, checkpoint_every_steps=2)
    run = train(cfg, tiny_config())
    assert len(calls) == 1 and calls[0] > 0
    assert ck.load_model(run / "checkpoints")[2]["step"] == 3
