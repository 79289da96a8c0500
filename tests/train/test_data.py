"""train/data.py: mixture weights, exact resume of the token stream, DDP row split, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from prodip.tokenizer.shards import read_shard
from prodip.train.data import MixtureBatches, val_batches


def test_batches_are_shifted_stream_windows(tiny_shards_dir):
    data = MixtureBatches(tiny_shards_dir, {"en": 1.0}, batch_size=3, seq_len=16)
    stream = np.asarray(read_shard(tiny_shards_dir / "en/train_000000.bin"), dtype=np.int64)
    for k in range(2):
        x, y = data.next_batch()
        assert x.shape == y.shape == (3, 16) and x.dtype == torch.int64
        for j in range(3):
            start = (k * 3 + j) * 16
            assert x[j].tolist() == stream[start : start + 16].tolist()
            assert y[j].tolist() == stream[start + 1 : start + 17].tolist()


def test_wraps_around_end(tiny_shards_dir):
    data = MixtureBatches(tiny_shards_dir, {"en": 1.0}, batch_size=1, seq_len=16)
    n = data.streams["en"].n_tokens
    data.positions["en"] = n - 5
    x, _ = data.next_batch()
    stream = np.asarray(read_shard(tiny_shards_dir / "en/train_000000.bin"), dtype=np.int64)
    assert x[0].tolist() == stream[n - 5 :].tolist() + stream[:11].tolist()
    assert data.epochs()["en"] > 1.0


def test_mixture_proportions(tiny_shards_dir):
    data = MixtureBatches(tiny_shards_dir, {"bn": 0.8, "en": 0.2}, batch_size=50, seq_len=4, seed=3)
    counts = np.bincount(np.concatenate([data._languages(k) for k in range(40)]), minlength=2)
    assert data.langs == ["bn", "en"]
    assert counts[0] / counts.sum() == pytest.approx(0.8, abs=0.03)


def test_resume_continues_exact_stream(tiny_shards_dir):
    straight = MixtureBatches(tiny_shards_dir, {"bn": 0.5, "en": 0.5}, 4, 8, seed=7)
    ref = [straight.next_batch() for _ in range(6)]
    first = MixtureBatches(tiny_shards_dir, {"bn": 0.5, "en": 0.5}, 4, 8, seed=7)
    for _ in range(3):
        first.next_batch()
    resumed = MixtureBatches(tiny_shards_dir, {"bn": 0.5, "en": 0.5}, 4, 8, seed=7)
    resumed.load_state_dict(first.state_dict())
    for k in range(3, 6):
        x, y = resumed.next_batch()
        assert torch.equal(x, ref[k][0]) and torch.equal(y, ref[k][1])
    other = MixtureBatches(tiny_shards_dir, {"bn": 0.5, "en": 0.5}, 4, 8, seed=8)
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(first.state_dict())


def test_ranks_split_the_global_batch(tiny_shards_dir):
    whole = MixtureBatches(tiny_shards_dir, {"bn": 0.6, "en": 0.4}, 6, 8, seed=1)
    ranks = [
        MixtureBatches(tiny_shards_dir, {"bn": 0.6, "en": 0.4}, 3, 8, seed=1, rank=r, world_size=2) for r in range(2)
    ]
    for _ in range(3):
        x, _ = whole.next_batch()
        parts = [r.next_batch()[0] for r in ranks]
        assert torch.equal(torch.cat(parts), x)


def test_refusals(tiny_shards_dir):
    with pytest.raises(ValueError, match="tokenizer sha256"):
        MixtureBatches(tiny_shards_dir, {}, 2, 8, expected_tokenizer_sha256="0" * 64)
    with pytest.raises(ValueError, match="absent"):
        MixtureBatches(tiny_shards_dir, {"hi": 1.0}, 2, 8)
    with pytest.raises(ValueError, match="positive weight"):
        MixtureBatches(tiny_shards_dir, {"bn": 0.0}, 2, 8)


def test_val_batches_fixed(tiny_shards_dir):
    a = val_batches(tiny_shards_dir, "bn", seq_len=16, batch_size=4, max_tokens=160)
    b = val_batches(tiny_shards_dir, "bn", seq_len=16, batch_size=4, max_tokens=160)
    assert [x.shape[0] for x, _ in a] == [4, 4, 2]
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, b))
