"""Broken ``.gz`` inputs and a short vocabulary: named errors and a recorded real size."""

from __future__ import annotations

import gzip
import json
import logging
import zlib

import pytest

from prodip.tokenizer.bpe import TokenizerTrainConfig, load_tokenizer, train_tokenizer
from prodip.tokenizer.corpus import iter_documents


def _cfg(tmp_path, path, **kw) -> TokenizerTrainConfig:
    return TokenizerTrainConfig(
        **{
            "inputs": {"bn": [str(path)]},
            "out_dir": str(tmp_path / "out"),
            "vocab_size": 300,
            "include_unknown_license": [str(path)],  # test text: no licence record needed
            **kw,
        }
    )


def test_plain_text_named_gz_is_a_named_value_error(tmp_path):
    fake = tmp_path / "fake.txt.gz"
    fake.write_text("just plain text\n\nnot compressed\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"fake\.txt\.gz: not a gzip file \(BadGzipFile"):
        train_tokenizer(_cfg(tmp_path, fake))
    assert not (tmp_path / "out").exists()


def test_truncated_gz_is_a_named_value_error(tmp_path):
    data = gzip.compress(("আমার সোনার বাংলা hello world\n" * 2000).encode("utf-8"))
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut\.txt\.gz: truncated gzip file \(EOFError"):
        list(iter_documents(cut, "bn"))


def test_corrupt_deflate_stream_is_a_named_value_error(tmp_path):
    data = bytearray(gzip.compress(("hello world " * 5000).encode()))
    data[20:40] = b"\xff" * 20  # inside the deflate stream, after the 10-byte header
    bad = tmp_path / "bad.txt.gz"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"bad\.txt\.gz: (corrupt gzip data \(zlib\.error|truncated|not a gzip)"):
        list(iter_documents(bad, "en"))
    with pytest.raises(zlib.error):  # the check above really exercises a zlib failure
        gzip.decompress(bytes(data))


def test_short_vocabulary_warns_and_records_real_size(tmp_path, caplog):
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"abc abc ab\xff\n\nabc ab abc\n")
    with caplog.at_level(logging.WARNING):
        out = train_tokenizer(_cfg(tmp_path, latin, vocab_size=512, errors="skip"))
    obtained = load_tokenizer(out).get_vocab_size()
    assert obtained < 512
    info = json.loads((out / "train_info.json").read_text())
    assert info["vocab_size"] == obtained and info["requested_vocab_size"] == 512
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("512" in m and str(obtained) in m for m in msgs), msgs


@pytest.mark.parametrize("lang", ["../x", "a/b", "a b", "", "1bn", "x" * 33])
def test_language_tag_that_is_not_a_plain_code_is_refused(tmp_path, tok_dir, lang):
    """A language tag names shard folders: '../x' once wrote shards outside --out-dir."""
    from prodip.tokenizer.encode import DataPrepareConfig, prepare_shards

    text = tmp_path / "t.txt"
    text.write_text("আমার সোনার বাংলা\n\nhello world\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"language tag .* is not a plain code"):
        train_tokenizer(TokenizerTrainConfig(inputs={lang: [str(text)]}, out_dir=str(tmp_path / "tok"), vocab_size=300))
    assert not (tmp_path / "tok").exists()
    with pytest.raises(ValueError, match=r"language tag .* is not a plain code"):
        prepare_shards(
            DataPrepareConfig(
                inputs={lang: [str(text)]},
                tokenizer_dir=str(tok_dir),
                out_dir=str(tmp_path / "shards" / "out"),
                progress=False,
            )
        )
    assert not (tmp_path / "shards").exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"sample_chars": 0}, "sample_chars"),
        ({"superword_share": 1.0}, "superword_share"),
        ({"min_frequency": 0}, "min_frequency"),
    ],
)
def test_settings_that_cannot_train_are_refused_before_reading(tmp_path, kw, match):
    missing = tmp_path / "not-read.txt"  # never opened: the settings are checked first
    with pytest.raises(ValueError, match=match):
        train_tokenizer(_cfg(tmp_path, missing, **kw))
    assert not (tmp_path / "out").exists()
