"""Portability of the default tokenizer, the per-target files (ExecuTorch's without NFC) and the GGUF
vocabulary metadata (read back with llama.cpp's gguf library)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from prodip.tokenizer.portable import (
    PRETOKENIZERS,
    TARGETS,
    merges_reproduce_vocab,
    nfc,
    portability,
    read_tokenizer_json,
    require_portable,
    write_target_files,
)
from tests.tokenizer.conftest import skip_or_fail


def test_default_tokenizer_is_portable_to_every_target(tok_dir):
    table = portability(tok_dir)
    assert set(table) == set(TARGETS)
    assert all(ok for ok, _ in table.values()), table
    assert "granite-embed-multi-97m" in table["llama.cpp"][1]
    assert merges_reproduce_vocab(read_tokenizer_json(tok_dir)) == []


def test_llama_cpp_type_carries_the_marks():
    # llama.cpp's gpt-4o type drops \p{M} from the letter classes; the type we name keeps it
    assert r"\p{M}" in PRETOKENIZERS["o200k-marks"].regex
    assert PRETOKENIZERS["o200k-marks"].llama_cpp_pre == "granite-embed-multi-97m"


def test_target_files(tok_dir, tmp_path):
    et = write_target_files(tok_dir, tmp_path / "et", "executorch")
    assert [p.name for p in et] == ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    et_json = json.loads((tmp_path / "et/tokenizer.json").read_text())
    assert et_json["normalizer"] is None  # ExecuTorch's HFTokenizer NFC is broken: the app normalises
    et_json["normalizer"] = read_tokenizer_json(tok_dir)["normalizer"]
    assert et_json == read_tokenizer_json(tok_dir)
    write_target_files(tok_dir, tmp_path / "og", "onnxruntime-genai")
    assert (tmp_path / "og/tokenizer.json").read_bytes() == (tok_dir / "tokenizer.json").read_bytes()
    with pytest.raises(ValueError, match="unknown tokenizer target 'mlc'"):
        require_portable(tok_dir, "mlc")


def test_a_custom_regex_is_not_portable(tok_dir, tmp_path):
    tok_json = read_tokenizer_json(tok_dir)
    tok_json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] += "|x"
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok_json))
    table = portability(tmp_path)
    assert table["transformers.js"][0] and not table["onnxruntime-genai"][0] and not table["llama.cpp"][0]
    with pytest.raises(ValueError, match="llama.cpp cannot reproduce this tokenizer: a GGUF names one of"):
        require_portable(tmp_path, "llama.cpp")


def test_nfc():
    assert nfc("ক\u09c7\u09be") == "কো" and nfc("e\u0301") == "é"
    assert nfc("য\u09bc") == "য\u09bc"  # য় is a composition exclusion: NFC keeps it decomposed


def test_gguf_metadata_reads_back(tok_dir, tmp_path):
    if importlib.util.find_spec("gguf") is None:
        skip_or_fail("gguf (llama.cpp's library, pip extra runtimes) not installed")
    import gguf

    from prodip.tokenizer.gguf import tokenizer_metadata, write_vocab_gguf

    path = write_vocab_gguf(tok_dir, tmp_path / "vocab.gguf")
    reader = gguf.GGUFReader(str(path))

    def value(key):
        return reader.fields[key].contents()

    tok_json = read_tokenizer_json(tok_dir)
    assert value("tokenizer.ggml.model") == "gpt2"
    assert value("tokenizer.ggml.pre") == "granite-embed-multi-97m"
    tokens = value("tokenizer.ggml.tokens")
    assert len(tokens) == 1024 and tokens[:3] == ["<|pad|>", "<|bos|>", "<|eos|>"]
    assert all(tokens[i] == t for t, i in tok_json["model"]["vocab"].items())
    # pad, bos, eos and the chat markers <|im_start|> <|im_end|>: CONTROL x5, then NORMAL
    assert value("tokenizer.ggml.token_type")[:6] == [3, 3, 3, 3, 3, 1]
    assert len(value("tokenizer.ggml.merges")) == len(tok_json["model"]["merges"])
    assert (value("tokenizer.ggml.bos_token_id"), value("tokenizer.ggml.eos_token_id")) == (1, 2)
    assert (value("tokenizer.ggml.add_bos_token"), value("tokenizer.ggml.add_eos_token")) == (True, False)
    padded = tokenizer_metadata(tok_dir, vocab_size=1030)
    assert padded["tokens"][-1] == "<|unused_5|>" and padded["token_types"][-1] == 5  # UNUSED
    with pytest.raises(ValueError, match="smaller than the tokenizer's 1024"):
        tokenizer_metadata(tok_dir, vocab_size=1000)


def test_executorch_tokenizer_loads_without_alarming_the_terminal(tok_dir, tmp_path, capfd, caplog):
    """ExecuTorch's HFTokenizer prints "E0000 ... re2.cc ... Error parsing" for the pre-tokenizer's lookahead, then
    compiles it with PCRE2 and tokenizes correctly: the parity check keeps that off the terminal (it goes to
    prodip's log at DEBUG) and still gets the runtime's ids."""
    import logging

    if importlib.util.find_spec("pytorch_tokenizers") is None:
        skip_or_fail("pytorch-tokenizers (ExecuTorch's tokenizer, pip extra runtimes) not installed")
    from prodip.tokenizer.parity import _executorch

    with caplog.at_level(logging.DEBUG, logger="prodip.tokenizer.parity"):
        ids, version = _executorch(tok_dir, ["আমি বাড়ি যাই।", "Hello, world!"], tmp_path)
    err = capfd.readouterr().err
    assert "re2" not in err and "Error parsing" not in err, err
    assert any("re2" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)
    assert version.startswith("pytorch-tokenizers") and all(len(row) > 1 for row in ids)


def test_native_stderr_goes_to_the_log_and_the_terminal_comes_back(capfd, caplog):
    import logging
    import os

    from prodip.base.files import native_stderr_to_log

    log = logging.getLogger("prodip.test.native")
    with caplog.at_level(logging.DEBUG, logger="prodip.test.native"):
        with native_stderr_to_log(log):
            os.write(2, b"E0000 from C++\n\n")
        os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
    assert [r.getMessage() for r in caplog.records] == ["E0000 from C++"]
