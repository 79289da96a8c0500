"""Continued pretraining from an extended base: ``[train] new_embeddings_first_steps`` trains only the new
embedding rows first (train/freeze.py), then everything."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from prodip.base.errors import InvalidInput, MissingInput
from prodip.tokenizer.extend import ExtendConfig, extend
from prodip.train import checkpoint as ck
from prodip.train.checkpoint import file_sha256
from prodip.train.trainer import TrainConfig, train
from tests.fixtures import TINY_VOCAB, make_shards, tiny_config
from tests.tokenizer.conftest import _bn_docs


@pytest.fixture(scope="module")
def extended_dir(tmp_path_factory, tiny_tokenizer_dir):
    """A tiny HF Llama folder (untied) with the tiny prodip tokenizer, extended with Bangla tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("extended_base")
    base = root / "base"
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).save_pretrained(base, safe_serialization=True)
    for f in tiny_tokenizer_dir.iterdir():
        shutil.copyfile(f, base / f.name)
    corpus = root / "bn.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in _bn_docs(30_000)), "utf-8")
    out = root / "extended"
    record = extend(ExtendConfig(base=str(base), out=str(out), inputs={"bn": [str(corpus)]}, new_tokens=40))
    assert record["first_new_id"] == TINY_VOCAB and record["added_tokens"] == 40
    return out


def _cfg(ext, shards, out, **kw) -> TrainConfig:
    base = dict(
        shards_dir=str(shards),
        tokenizer_dir=str(ext),
        out_dir=str(out),
        init_from=str(ext),
        steps=3,
        batch_size=2,
        seq_len=16,
        lr=1e-2,
        min_lr=1e-2,
        warmup_steps=0,
        weight_decay=0.1,
        checkpoint_every_steps=1,
        device="cpu",
        mixture={"bn": 0.5, "en": 0.5},
        progress=False,
        guards=False,
    )
    base.update(kw)
    return TrainConfig(**base)


def test_only_the_new_rows_train_first_then_everything(tmp_path, extended_dir):
    from safetensors.torch import load_file

    vocab = TINY_VOCAB + 40
    shards = make_shards(
        tmp_path / "shards", file_sha256(extended_dir / "tokenizer.json"), vocab, {"bn": 4000, "en": 4000}
    )
    run = train(_cfg(extended_dir, shards, tmp_path / "run", new_embeddings_first_steps=2), tiny_config())
    start = load_file(str(extended_dir / "model.safetensors"))
    states = {}
    for step in (2, 3):
        model, _, info = ck.load_model(run / "checkpoints" / ck.step_dir_name(step))
        assert info["step"] == step
        states[step] = {k: v.float() for k, v in model.state_dict().items()}
    frozen_phase, after = states[2], states[3]
    for key, before in start.items():
        got = frozen_phase[key]
        if key in ("model.embed_tokens.weight", "lm_head.weight"):
            assert torch.equal(got[:TINY_VOCAB], before[:TINY_VOCAB]), key  # base rows untouched, no decay
            assert not torch.equal(got[TINY_VOCAB:], before[TINY_VOCAB:]), key  # the new rows learned
        else:
            assert torch.equal(got, before), key
        assert not torch.equal(after[key], got), key  # step 3 trains everything


def test_refused_without_an_extended_init(tmp_path, extended_dir, tiny_tokenizer_dir, tiny_shards_dir):
    with pytest.raises(InvalidInput, match="needs --init-from"):
        TrainConfig(shards_dir="s", tokenizer_dir="t", new_embeddings_first_steps=2)
    with pytest.raises(InvalidInput, match=">= 0"):
        TrainConfig(init_from="x", new_embeddings_first_steps=-1)
    plain = tmp_path / "plain"
    shutil.copytree(extended_dir, plain)
    (plain / "extension.json").unlink()
    shards = make_shards(tmp_path / "shards", file_sha256(plain / "tokenizer.json"), TINY_VOCAB + 40, {"bn": 2000})
    cfg = _cfg(plain, shards, tmp_path / "run", init_from=str(plain), mixture={}, new_embeddings_first_steps=1)
    with pytest.raises(MissingInput, match="extension.json: not found"):
        train(cfg, tiny_config())
