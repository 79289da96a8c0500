"""Shared, generic fixtures for tests/train: a tiny tokenizer dir, tiny shards, tiny ModelConfigs.

Everything is built under pytest's tmp dirs, deterministically, on CPU in well under a second.

    python -m pytest tests/train -q
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from prodip.train.config import ModelConfig
from tests.fixtures import TINY_VOCAB, build_train_tokenizer, make_shards, tiny_config  # noqa: F401 (re-exported)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    # Tiny models: one thread is faster, and immune to OpenMP spin-wait stalls on a busy 2-core box.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer dir (tokenizer.json + config files), ids pad=0, bos=1, eos=2."""
    return build_train_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def tiny_shards_dir(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    """Shards for bn (20k tokens) and en (12k tokens) matching ``tiny_tokenizer_dir``'s hash."""
    from prodip.train.checkpoint import file_sha256

    out = tmp_path_factory.mktemp("shards")
    return make_shards(
        out, file_sha256(tiny_tokenizer_dir / "tokenizer.json"), TINY_VOCAB, {"bn": 20_000, "en": 12_000}
    )


@pytest.fixture
def tiny_model_config() -> ModelConfig:
    return tiny_config()


@pytest.fixture
def tiny_tied_config() -> ModelConfig:
    return tiny_config(tie_word_embeddings=True)
