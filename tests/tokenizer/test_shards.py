"""Shard format: round trips, header layout, refusal of corrupt shards and of another tokenizer's shards."""

from __future__ import annotations

import json

import numpy as np
import pytest

from prodip.tokenizer import shards


@pytest.mark.parametrize("dtype,maxval", [("uint16", 65535), ("uint32", 2**32 - 1)])
def test_round_trip_and_header(tmp_path, dtype, maxval):
    tokens = np.array([0, 1, 2, 7, maxval], dtype=np.int64)
    path = tmp_path / "train_000000.bin"
    assert shards.write_shard(path, tokens, dtype) == 5
    header = np.fromfile(path, dtype="<i4", count=256)
    assert list(header[:4]) == [20240520, 1 if dtype == "uint16" else 2, 5, 2 if dtype == "uint16" else 4]
    assert path.stat().st_size == 1024 + 5 * np.dtype(dtype).itemsize
    got = shards.read_shard(path)
    assert isinstance(got, np.memmap) and got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, tokens)
    assert not (tmp_path / "train_000000.bin.tmp").exists()


def test_empty_shard(tmp_path):
    shards.write_shard(tmp_path / "a.bin", [], "uint16")
    assert shards.read_shard(tmp_path / "a.bin").shape == (0,)


def test_refuses_bad_shards(tmp_path):
    with pytest.raises(ValueError, match="do not fit uint16"):
        shards.write_shard(tmp_path / "x.bin", [70000], "uint16")
    path = tmp_path / "a.bin"
    shards.write_shard(path, np.arange(10), "uint16")
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ValueError, match="truncated"):
        shards.read_shard(path)
    path.write_bytes(b"\0" * 2000)
    with pytest.raises(ValueError, match="magic"):
        shards.read_shard(path)
    with pytest.raises(FileNotFoundError, match="prodip data prepare"):
        shards.read_shard(tmp_path / "missing.bin")


def test_meta_and_paths(tmp_path):
    (tmp_path / "bn").mkdir()
    shards.write_shard(tmp_path / "bn/train_000000.bin", [5, 2], "uint16")
    shards.write_meta(
        tmp_path,
        {
            "tokenizer_sha256": "ab" * 32,
            "vocab_size": 100,
            "token_dtype": "uint16",
            "bos_id": 1,
            "eos_id": 2,
            "languages": {"bn": {"train": [{"file": "bn/train_000000.bin", "n_tokens": 2}], "val": []}},
        },
    )
    meta = shards.load_meta(tmp_path, expected_tokenizer_sha256="ab" * 32).to_dict()
    assert meta["format_version"] == 2
    assert shards.shard_paths(tmp_path, "bn", "train") == [tmp_path / "bn/train_000000.bin"]
    assert shards.shard_paths(tmp_path, "bn", "val") == []
    with pytest.raises(ValueError, match="tokenizer sha256"):
        shards.load_meta(tmp_path, expected_tokenizer_sha256="cd" * 32).to_dict()
    with pytest.raises(ValueError, match="no language 'en'"):
        shards.shard_paths(tmp_path, "en", "train")
    doc = json.loads((tmp_path / "meta.json").read_text())
    doc["format_version"] = 99
    (tmp_path / "meta.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="format_version"):
        shards.load_meta(tmp_path).to_dict()
    doc["format_version"] = 1  # documents without <|bos|>: made before the special-token convention
    (tmp_path / "meta.json").write_text(json.dumps(doc))
    with pytest.raises(
        ValueError,
        match=r"format_version 1 is not one this prodip reads \(reads 2; .*each is now <.bos.> ids <.eos.>.*re-run",
    ):
        shards.load_meta(tmp_path).to_dict()


def _one_lang_dir(tmp_path, tokens, vocab_size=320):
    root = tmp_path / "shards"
    (root / "bn").mkdir(parents=True)
    shards.write_shard(root / "bn/train_000000.bin", np.asarray(tokens), "uint16")
    meta = {
        "tokenizer_sha256": "a" * 64,
        "vocab_size": vocab_size,
        "token_dtype": "uint16",
        "bos_id": 1,
        "eos_id": 2,
        "languages": {"bn": {"train": [{"file": "bn/train_000000.bin", "n_tokens": len(tokens)}], "val": []}},
    }
    return root, meta


def test_meta_carries_checksum_and_max_id_and_refuses_out_of_vocab_ids(tmp_path):
    """Issue 12: a shard with ids outside the vocabulary crashed inside torch.embedding."""
    root, meta = _one_lang_dir(tmp_path, [3, 319, 2])
    shards.write_meta(root, meta)
    entry = json.loads((root / "meta.json").read_text())["languages"]["bn"]["train"][0]
    assert entry["max_id"] == 319 and len(entry["sha256"]) == 64
    assert [a.tolist() for a in shards.open_checked_shards(root, "bn", "train")] == [[3, 319, 2]]
    bad, bad_meta = _one_lang_dir(tmp_path / "b", [3, 320, 2])
    with pytest.raises(ValueError, match=r"bn/train_000000.bin: holds token id 320, outside the vocabulary of 320"):
        shards.write_meta(bad, bad_meta)


def test_changed_shard_is_refused_on_open_naming_it(tmp_path):
    root, meta = _one_lang_dir(tmp_path, [3, 4, 5, 2])
    shards.write_meta(root, meta)
    shards.write_shard(root / "bn/train_000000.bin", np.array([3, 4000, 5, 2]), "uint16")  # same size, other ids
    with pytest.raises(ValueError, match=r"train_000000.bin: sha256 .* differs from .*meta.json"):
        shards.open_checked_shards(root, "bn", "train")


def test_old_meta_without_checksums_is_scanned_for_ids(tmp_path, caplog):
    root, meta = _one_lang_dir(tmp_path, [3, 999, 2])
    # as prodip wrote meta.json before shards carried checksums (same document layout, no sha256/max_id)
    (root / "meta.json").write_text(json.dumps({"format_version": shards.FORMAT_VERSION, **meta}))
    with pytest.raises(ValueError, match="holds token id 999"):
        shards.open_checked_shards(root, "bn", "train")
