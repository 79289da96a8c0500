"""train/data.py: mixture weights, shuffled windows, exact resume of the token stream, DDP row split, refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from prodip.tokenizer.shards import read_shard
from prodip.train.data import MixtureBatches, val_batches


def test_batches_are_shifted_stream_windows(tiny_shards_dir):
    data = MixtureBatches(tiny_shards_dir, {"en": 1.0}, batch_size=3, seq_len=16, order="sequential")
    stream = np.asarray(read_shard(tiny_shards_dir / "en/train_000000.bin"), dtype=np.int64)
    for k in range(2):
        x, y = data.next_batch()
        assert x.shape == y.shape == (3, 16) and x.dtype == torch.int64
        for j in range(3):
            start = (k * 3 + j) * 16
            assert x[j].tolist() == stream[start : start + 16].tolist()
            assert y[j].tolist() == stream[start + 1 : start + 17].tolist()


def test_wraps_around_end(tiny_shards_dir):
    data = MixtureBatches(tiny_shards_dir, {"en": 1.0}, batch_size=1, seq_len=16, order="sequential")
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


def _window_starts(data, lang, stream, n):
    """Start offsets of the next ``n`` single-row batches, found by matching them in ``stream``."""
    T = data.seq_len
    index = {tuple(stream[w * T : w * T + T + 1].tolist()): w * T for w in range((len(stream) - 1) // T)}
    out = []
    for _ in range(n):
        x, y = data.next_batch()
        out.append(index[tuple(x[0].tolist()) + (int(y[0, -1]),)])
    return out


def test_shuffle_visits_every_window_once_per_epoch_in_a_new_order(tiny_shards_dir):
    T = 64
    data = MixtureBatches(tiny_shards_dir, {"en": 1.0}, batch_size=1, seq_len=T, seed=5)
    stream = np.asarray(read_shard(tiny_shards_dir / "en/train_000000.bin"), dtype=np.int64)
    n = (len(stream) - 1) // T
    epoch1, epoch2 = _window_starts(data, "en", stream, n), _window_starts(data, "en", stream, n)
    assert sorted(epoch1) == sorted(epoch2) == [w * T for w in range(n)]
    assert epoch1 != epoch2  # reshuffled each epoch
    assert epoch1 != sorted(epoch1)  # not file order
    again = MixtureBatches(tiny_shards_dir, {"en": 1.0}, batch_size=1, seq_len=T, seed=5)
    assert _window_starts(again, "en", stream, n) == epoch1  # seeded
    assert data.epochs()["en"] == pytest.approx(2 * n * T / len(stream))


def test_shuffle_mixes_sources_from_the_first_batches(tiny_shards_dir):
    """The fault of issue 12: file order meant hundreds of steps on one source (the loss jumped at the wrap).

    With the stream's first half standing for one source and the second for another, the first
    tenth of an epoch must already draw from both halves about equally.
    """
    T = 32
    stream_len = MixtureBatches(tiny_shards_dir, {"bn": 1.0}, 1, T).streams["bn"].n_tokens
    for order, expect_mixed in (("sequential", False), ("shuffle", True)):
        data = MixtureBatches(tiny_shards_dir, {"bn": 1.0}, batch_size=8, seq_len=T, seed=0, order=order)
        n_batches = stream_len // T // 8 // 10
        firsts = []
        for _ in range(n_batches):
            for _j in range(8):
                firsts.append(data._start("bn"))
                data.positions["bn"] += T
        share_second_half = np.mean(np.asarray(firsts) >= stream_len // 2)
        assert (0.3 < share_second_half < 0.7) == expect_mixed, (order, share_second_half)


def test_shuffle_resume_is_exact_across_epochs(tiny_shards_dir):
    kw = dict(batch_size=4, seq_len=64, seed=2)
    straight = MixtureBatches(tiny_shards_dir, {"bn": 0.5, "en": 0.5}, **kw)
    ref = [straight.next_batch() for _ in range(120)]  # en has 187 windows: past one epoch
    assert max(straight.epochs().values()) > 1.0
    first = MixtureBatches(tiny_shards_dir, {"bn": 0.5, "en": 0.5}, **kw)
    for _ in range(37):
        first.next_batch()
    resumed = MixtureBatches(tiny_shards_dir, {"bn": 0.5, "en": 0.5}, **kw)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # as stored in the checkpoint
    for k in range(37, 120):
        x, y = resumed.next_batch()
        assert torch.equal(x, ref[k][0]) and torch.equal(y, ref[k][1])


def test_state_of_another_order_is_refused(tiny_shards_dir):
    old = MixtureBatches(tiny_shards_dir, {"en": 1.0}, 2, 8, order="sequential").state_dict()
    old.pop("order")  # written before the shuffle existed: sequential
    with pytest.raises(ValueError, match="--data-order sequential"):
        MixtureBatches(tiny_shards_dir, {"en": 1.0}, 2, 8).load_state_dict(old)
    MixtureBatches(tiny_shards_dir, {"en": 1.0}, 2, 8, order="sequential").load_state_dict(old)
    with pytest.raises(ValueError, match="order"):
        MixtureBatches(tiny_shards_dir, {"en": 1.0}, 2, 8, order="random")


def test_val_batches_empty_when_the_split_is_too_small(tmp_path, tiny_shards_dir):
    import shutil

    from prodip.tokenizer.shards import write_meta, write_shard

    shards = tmp_path / "shards"
    shutil.copytree(tiny_shards_dir, shards)
    meta = json.loads((shards / "meta.json").read_text())
    write_shard(shards / "en/val_000000.bin", np.array([5, 6, 2], dtype=np.int64), "uint16")
    meta["languages"]["en"]["val"] = [{"file": "en/val_000000.bin", "n_tokens": 3}]
    meta.pop("format_version")
    write_meta(shards, meta)
    assert val_batches(shards, "en", seq_len=16, batch_size=4, max_tokens=160) == []


def test_a_shard_changed_after_prepare_is_refused_by_name(tmp_path, tiny_shards_dir):
    """Issue 12: a shard with ids outside the vocabulary crashed inside torch.embedding."""
    import shutil

    from prodip.tokenizer.shards import write_shard

    shards = tmp_path / "shards"
    shutil.copytree(tiny_shards_dir, shards)
    n = len(read_shard(shards / "en/train_000000.bin"))
    write_shard(shards / "en/train_000000.bin", np.full(n, 40000, dtype=np.int64), "uint16")  # right size, bad ids
    with pytest.raises(ValueError, match=r"en/train_000000.bin: sha256 .* differs"):
        MixtureBatches(shards, {"en": 1.0}, 2, 8)
