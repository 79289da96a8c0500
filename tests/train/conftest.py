"""Shared, generic fixtures for tests/train: a tiny tokenizer dir, tiny shards, tiny ModelConfigs.

Everything is built under pytest's tmp dirs, deterministically, on CPU in well under a second.

    python -m pytest tests/train -q
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from prodip.train.config import ModelConfig

TINY_VOCAB = 320  # byte-level BPE: 256 bytes + 3 specials + a few merges
_TEXT = {
    "bn": "আমার সোনার বাংলা, আমি তোমায় ভালোবাসি। চিরদিন তোমার আকাশ, তোমার বাতাস। ",
    "en": "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. ",
}


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    # Tiny models: one thread is faster, and immune to OpenMP spin-wait stalls on a busy 2-core box.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer dir (tokenizer.json + config files), ids pad=0, bos=1, eos=2."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    out = tmp_path_factory.mktemp("tokenizer")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=["<|pad|>", "<|bos|>", "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([t * 20 for t in _TEXT.values()], trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>", "model_max_length": 64}))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}))
    return out


def _write_shard(path: Path, tokens: np.ndarray) -> None:
    """Shard writer: tokenizer.shards if present, else the llm.c layout it documents."""
    try:
        from prodip.tokenizer.shards import write_shard
    except ImportError:
        path.parent.mkdir(parents=True, exist_ok=True)
        header = np.zeros(256, dtype=np.int32)
        header[:3] = (20240520, 1, len(tokens))
        with open(path, "wb") as fh:
            fh.write(header.tobytes())
            fh.write(tokens.astype(np.uint16).tobytes())
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_shard(path, tokens, "uint16")


def make_shards(out: Path, tokenizer_sha256: str, vocab_size: int, n_tokens: dict[str, int],
                seed: int = 0) -> Path:
    """Random-token shards (ids 3..vocab-1, an <|eos|> every ~40 tokens) for each language."""
    rng = np.random.default_rng(seed)
    langs = {}
    for lang, n in n_tokens.items():
        langs[lang] = {}
        for split, count in (("train", n), ("val", max(256, n // 10))):
            tokens = rng.integers(3, vocab_size, size=count, dtype=np.int64)
            tokens[rng.random(count) < 0.025] = 2
            rel = f"{lang}/{split}_000000.bin"
            _write_shard(out / rel, tokens)
            langs[lang][split] = [{"file": rel, "n_tokens": int(count)}]
    meta = {"format_version": 1, "tokenizer_sha256": tokenizer_sha256, "vocab_size": vocab_size,
            "token_dtype": "uint16", "bos_id": 1, "eos_id": 2, "pad_id": 0, "languages": langs}
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return out


@pytest.fixture(scope="session")
def tiny_shards_dir(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    """Shards for bn (20k tokens) and en (12k tokens) matching ``tiny_tokenizer_dir``'s hash."""
    from prodip.train.checkpoint import file_sha256
    out = tmp_path_factory.mktemp("shards")
    return make_shards(out, file_sha256(tiny_tokenizer_dir / "tokenizer.json"), TINY_VOCAB,
                       {"bn": 20_000, "en": 12_000})


def tiny_config(**overrides) -> ModelConfig:
    """2 layers, hidden 32, GQA 4/2 heads, 64 positions, vocab of the tiny tokenizer."""
    kw = dict(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    kw.update(overrides)
    return ModelConfig(**kw)


@pytest.fixture
def tiny_model_config() -> ModelConfig:
    return tiny_config()


@pytest.fixture
def tiny_tied_config() -> ModelConfig:
    return tiny_config(tie_word_embeddings=True)
