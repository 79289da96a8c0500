"""Checkpoint layout, round trips and tamper detection (train/checkpoint.py)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from prodip.train import checkpoint as ck
from prodip.train.model import LlamaForCausalLM


def _model(cfg, seed=0):
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_identical_logits(tmp_path, tiny_tokenizer_dir, tiny_model_config, tiny_tied_config, tied):
    cfg = tiny_tied_config if tied else tiny_model_config
    model = _model(cfg)
    step_dir = ck.save_checkpoint(
        tmp_path / "checkpoints",
        step=5,
        model=model,
        model_config=cfg,
        tokenizer_dir=tiny_tokenizer_dir,
        tokens_seen=123,
    )
    assert step_dir.name == "step_0000005"
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_0000005"
    with safe_open(str(step_dir / "model.safetensors"), framework="pt") as fh:
        keys = set(fh.keys())
    assert ("lm_head.weight" in keys) is (not tied)
    assert "model.embed_tokens.weight" in keys and not any(k.startswith(("_orig", "module")) for k in keys)
    for where in (tmp_path, tmp_path / "checkpoints", step_dir):  # run dir, checkpoints dir, step dir
        loaded, lcfg, info = ck.load_model(where)
        assert lcfg == cfg and info["step"] == 5 and info["checkpoint_dir"] == step_dir
    assert info["model_sha256"] == ck.model_sha256(tmp_path) == ck.file_sha256(step_dir / "model.safetensors")
    assert (info["tokenizer_dir"] / "tokenizer.json").read_bytes() == (
        tiny_tokenizer_dir / "tokenizer.json"
    ).read_bytes()
    if tied:
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model.eval()(ids), rtol=0, atol=0)
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert set(manifest["files"]) >= {
        "model.safetensors",
        "config.json",
        "trainer_state.json",
        "tokenizer/tokenizer.json",
        "rng.safetensors",
    }


def test_compiled_and_ddp_prefixes_removed(tiny_model_config):
    model = _model(tiny_model_config)
    wrapped = torch.nn.Module()
    wrapped._orig_mod = model  # what torch.compile's OptimizedModule holds
    sd = ck.clean_state_dict(wrapped, False)
    assert set(sd) == set(model.state_dict())


def test_keep_last_and_latest(tmp_path, tiny_tokenizer_dir, tiny_model_config):
    model = _model(tiny_model_config)
    for step in (1, 2, 3, 4):
        ck.save_checkpoint(
            tmp_path,
            step=step,
            model=model,
            model_config=tiny_model_config,
            tokenizer_dir=tiny_tokenizer_dir,
            keep_last=2,
        )
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["latest", "step_0000003", "step_0000004"]
    assert ck.resolve_checkpoint(tmp_path).name == "step_0000004"


def test_tampered_file_named(tmp_path, tiny_tokenizer_dir, tiny_model_config):
    step_dir = ck.save_checkpoint(
        tmp_path,
        step=1,
        model=_model(tiny_model_config),
        model_config=tiny_model_config,
        tokenizer_dir=tiny_tokenizer_dir,
    )
    path = step_dir / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="model.safetensors: sha256 differs"):
        ck.load_model(step_dir)


def _rewrite_model(step_dir, tensors):
    """Replace model.safetensors and re-hash the manifest, so only the tensor check can catch it."""
    save_file(tensors, str(step_dir / "model.safetensors"))
    manifest = json.loads((step_dir / "manifest.json").read_text())
    path = step_dir / "model.safetensors"
    manifest["files"]["model.safetensors"] = {"bytes": path.stat().st_size, "sha256": ck.file_sha256(path)}
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("defect", ["shape", "missing", "extra"])
def test_wrong_tensors_named(tmp_path, tiny_tokenizer_dir, tiny_model_config, defect):
    step_dir = ck.save_checkpoint(
        tmp_path,
        step=1,
        model=_model(tiny_model_config),
        model_config=tiny_model_config,
        tokenizer_dir=tiny_tokenizer_dir,
    )
    tensors = load_file(str(step_dir / "model.safetensors"))
    key = "model.layers.1.mlp.up_proj.weight"
    if defect == "shape":
        tensors[key] = torch.zeros(65, 32)
        match = r"up_proj.weight has shape \(65, 32\), config.json implies \(64, 32\)"
    elif defect == "missing":
        del tensors[key]
        match = "missing tensor.*up_proj.weight"
    else:
        tensors["model.layers.2.mlp.up_proj.weight"] = torch.zeros(64, 32)
        match = "unexpected tensor.*layers.2.mlp.up_proj.weight"
    _rewrite_model(step_dir, tensors)
    with pytest.raises(ValueError, match=match):
        ck.load_model(step_dir)


def test_foreign_file_and_missing(tmp_path, tiny_tokenizer_dir, tiny_model_config):
    step_dir = ck.save_checkpoint(
        tmp_path,
        step=1,
        model=_model(tiny_model_config),
        model_config=tiny_model_config,
        tokenizer_dir=tiny_tokenizer_dir,
    )
    (step_dir / "evil.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="evil.bin: not listed"):
        ck.load_model(step_dir)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ck.resolve_checkpoint(tmp_path / "nowhere")
    (step_dir / "evil.bin").unlink()
    (step_dir / "model.safetensors").unlink()  # the step dir is still found; the missing file is named
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors: listed in .* but missing"):
        ck.load_model(step_dir)


def test_optimizer_state_round_trip(tmp_path, tiny_tokenizer_dir, tiny_model_config):
    model = _model(tiny_model_config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randint(0, 320, (2, 8))).float().mean().backward()
        opt.step()
        opt.zero_grad()
    ck.save_checkpoint(
        tmp_path,
        step=2,
        model=model,
        model_config=tiny_model_config,
        tokenizer_dir=tiny_tokenizer_dir,
        optimizer=opt,
        data_state={"pos": 7},
    )
    model2 = _model(tiny_model_config, seed=1)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    resumed = ck.load_training_state(tmp_path, model2, opt2)
    assert resumed.state.step == 2 and resumed.state.data_state == {"pos": 7}
    assert resumed.checkpoint_dir == ck.resolve_checkpoint(tmp_path) and resumed.checkpoint_dir.name == "step_0000002"
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    sd, sd2 = opt.state_dict(), opt2.state_dict()
    assert sd["param_groups"] == sd2["param_groups"]
    for idx in sd["state"]:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sd["state"][idx][name], sd2["state"][idx][name])


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("resume", [True, False])
def test_train_refuses_a_checkpoint_of_a_newer_prodip(
    tmp_path, tiny_tokenizer_dir, tiny_shards_dir, tiny_model_config, capsys, resume
):
    """A run saves over a step dir of the same number and prunes older ones: a checkpoint a newer prodip wrote
    stops `prodip train` before its first step (exit 2, one line naming the file and the version), untouched."""
    from prodip.cli import main as prodip_main

    run = tmp_path / "run"
    step = ck.save_checkpoint(
        run / "checkpoints",
        step=1,
        model=_model(tiny_model_config),
        model_config=tiny_model_config,
        tokenizer_dir=tiny_tokenizer_dir,
    )
    state = json.loads((step / "trainer_state.json").read_text())
    (step / "trainer_state.json").write_text(json.dumps({**state, "format_version": 7}, sort_keys=True))
    if not resume:  # no `latest`: a fresh run would save step dirs beside it and prune it
        (run / "checkpoints" / "latest").unlink()
    before = _snapshot(run)
    argv = ["train", "--shards-dir", str(tiny_shards_dir), "--tokenizer-dir", str(tiny_tokenizer_dir)]
    argv += ["--out-dir", str(run), "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--device", "cpu"]
    argv += ["--progress", "false", *(["--resume"] if resume else [])]
    assert prodip_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{step / 'trainer_state.json'}: written by a newer prodip (format_version 7; this prodip reads 1)" in err
    assert _snapshot(run) == before


def test_checkpoint_tokenizer_rule_and_hf_folder_live_with_the_layout(tmp_path, tiny_tokenizer_dir, tiny_model_config):
    """The checkpoint-layout rules conformance and export both apply are train.checkpoint's: a run dir resolves
    to its step dir when the step holds its tokenizer copy, and is refused naming the missing file when not; a
    folder with config.json and no checkpoint is a Hugging Face folder, a run dir is not."""
    from prodip.base.errors import MissingInput

    step = ck.save_checkpoint(
        tmp_path / "run" / "checkpoints",
        step=3,
        model=_model(tiny_model_config),
        model_config=tiny_model_config,
        tokenizer_dir=tiny_tokenizer_dir,
    )
    assert ck.require_checkpoint_tokenizer(tmp_path / "run") == step
    assert not ck.is_hf_folder(tmp_path / "run")
    hf = tmp_path / "hf"
    hf.mkdir()
    assert not ck.is_hf_folder(hf)  # no config.json: neither
    (hf / "config.json").write_text("{}")
    assert ck.is_hf_folder(hf)
    (step / ck.TOKENIZER_SUBDIR / "tokenizer.json").unlink()
    missing = re.escape(str(step / ck.TOKENIZER_SUBDIR / "tokenizer.json"))
    with pytest.raises(MissingInput, match=rf"^{missing}: missing; a checkpoint"):
        ck.require_checkpoint_tokenizer(tmp_path / "run")
