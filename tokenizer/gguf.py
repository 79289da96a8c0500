"""The tokenizer as GGUF vocabulary metadata (llama.cpp), and a vocabulary-only GGUF for the parity check.

A GGUF carries a byte-level BPE as ``tokenizer.ggml.model = "gpt2"`` with the token strings, merges and
token types of ``tokenizer.json``, and names the pre-tokenizer by one of llama.cpp's built-in types
(``tokenizer.ggml.pre``; :data:`prodip.tokenizer.portable.PRETOKENIZERS` maps ours). A byte-fallback BPE
converted from SentencePiece (Llama 2, TinyLlama) is written as llama.cpp's SentencePiece vocabulary
(``tokenizer.ggml.model = "llama"``, scores and token types, ``<0xNN>`` byte pieces). The special-token
ids are the tokenizer's own (:func:`prodip.base.specials.read_specials`): for prodip's, ``<|bos|>`` (id 1)
starts every document and is prepended to a prompt (``tokenizer.ggml.add_bos_token = true``), ``<|eos|>``
(id 2) ends a document and ends generation, ``<|pad|>`` is id 0; an imported tokenizer's are read from its
``tokenizer_config.json``, and ``add_bos_token`` is whether its post-processor prepends the bos. Keys are written with the ``gguf`` package, the library llama.cpp maintains.
The export stage building full GGUF models calls :func:`add_tokenizer_metadata` on its writer.

    python -m prodip.tokenizer.gguf runs/demo/tokenizer /tmp/vocab.gguf     # vocabulary-only GGUF
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from prodip.base.errors import InvalidInput
from prodip.base.files import writing
from prodip.base.specials import read_specials
from prodip.tokenizer.portable import (
    RECOGNISED,
    is_byte_fallback,
    pretokenizer_name,
    read_tokenizer_json,
    require_portable,
    sentencepiece_scores,
)

#: The ids of prodip's special tokens (tokenizer/bpe.py SPECIAL_TOKENS order).
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


def tokenizer_metadata(tokenizer_dir: str | os.PathLike, *, vocab_size: int | None = None) -> dict[str, Any]:
    """The GGUF tokenizer keys of a portable tokenizer, as plain Python values.

    Args:
        tokenizer_dir: tokenizer (or export) dir with ``tokenizer.json``.
        vocab_size: pad the token list to this many entries with unused tokens ``<|unused_N|>`` (llama.cpp
            refuses a GGUF whose token list is shorter than the embedding matrix); None = no padding.

    Returns:
        ``{"model": "gpt2", "pre": str, "tokens": [str] (len V), "token_types": [int] (gguf.TokenType),
        "merges": ["a b", ...], "bos_id", "eos_id", "pad_id": int, "add_bos": True, "add_eos": False}``.

    Raises:
        InvalidInput: llama.cpp cannot reproduce the tokenizer (names why), ids with gaps, or
            ``vocab_size`` smaller than the tokenizer.
    """
    import gguf  # noqa: PLC0415 (optional: pip extra runtimes; llama.cpp's own library)

    require_portable(tokenizer_dir, "llama.cpp")
    tok_json = read_tokenizer_json(tokenizer_dir)
    if is_byte_fallback(tok_json):
        return _sentencepiece_metadata(tokenizer_dir, tok_json, vocab_size)
    vocab, n, size = _vocab_table(tokenizer_dir, tok_json, vocab_size)
    tokens = [""] * size
    types = [int(gguf.TokenType.NORMAL)] * size
    for token, i in vocab.items():
        tokens[i] = token
    for added in tok_json.get("added_tokens", []):  # llama.cpp parses both kinds whole in text
        types[added["id"]] = int(gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED)
    for i in range(n, size):
        tokens[i], types[i] = f"<|unused_{i - n}|>", int(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]]
    name = pretokenizer_name(tok_json)
    assert name is not None  # require_portable checked it
    specials = read_specials(tokenizer_dir)
    return {
        "model": "gpt2",
        "pre": RECOGNISED[name].llama_cpp_pre,
        "tokens": tokens,
        "token_types": types,
        "merges": merges,
        "bos_id": specials.bos_id,
        "eos_id": specials.eos_id,
        "pad_id": specials.pad_id,
        "add_bos": specials.add_bos,
        "add_eos": False,
    }


def _vocab_table(
    tokenizer_dir: str | os.PathLike, tok_json: dict, vocab_size: int | None
) -> tuple[dict[str, int], int, int]:
    """The model's vocabulary with the added tokens (piece -> id), the tokenizer's token count ``n`` and the
    GGUF's vocabulary size (``vocab_size``, default ``n``; ids ``n..size-1`` are padding rows).

    Raises:
        InvalidInput: the ids are not 0..n-1 without gaps, or ``vocab_size`` is smaller than ``n``.
    """
    vocab: dict[str, int] = dict(tok_json["model"]["vocab"])
    for added in tok_json.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    n = max(vocab.values()) + 1
    if n != len(vocab):
        raise InvalidInput(f"{Path(tokenizer_dir) / 'tokenizer.json'}: token ids are not 0..{n - 1} without gaps")
    size = n if vocab_size is None else vocab_size
    if size < n:
        raise InvalidInput(f"vocab_size {vocab_size} is smaller than the tokenizer's {n} tokens")
    return vocab, n, size


def _sentencepiece_metadata(tokenizer_dir: str | os.PathLike, tok_json: dict, vocab_size: int | None) -> dict[str, Any]:
    """A byte-fallback BPE (Llama 2 / TinyLlama) as llama.cpp's SentencePiece vocabulary, as llama.cpp's
    converter writes a ``tokenizer.model`` (``_set_vocab_sentencepiece``): ``tokenizer.ggml.model = "llama"``,
    the pieces with their scores (:func:`prodip.tokenizer.portable.sentencepiece_scores`) and types (``<unk>``
    UNKNOWN, ``<0xNN>`` BYTE, special added tokens CONTROL, other added ones USER_DEFINED), no merges, and
    ``add_space_prefix`` (the normaliser's ``Prepend("▁")``)."""
    import gguf  # noqa: PLC0415 (optional: pip extra runtimes; llama.cpp's own library)

    vocab, n, size = _vocab_table(tokenizer_dir, tok_json, vocab_size)
    scores_by_piece = sentencepiece_scores(tok_json)
    tokens, scores = [""] * size, [0.0] * size
    types = [int(gguf.TokenType.NORMAL)] * size
    byte_piece = re.compile(r"<0x[0-9A-F]{2}>")
    for piece, i in vocab.items():
        tokens[i], scores[i] = piece, scores_by_piece.get(piece, 0.0)
        if byte_piece.fullmatch(piece):
            types[i] = int(gguf.TokenType.BYTE)
    unk = tok_json["model"].get("unk_token")
    for added in tok_json.get("added_tokens", []):
        special = added.get("special")
        types[added["id"]] = int(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        if added["content"] == unk:
            types[added["id"]] = int(gguf.TokenType.UNKNOWN)
    for i in range(n, size):
        tokens[i], types[i], scores[i] = f"<|unused_{i - n}|>", int(gguf.TokenType.UNUSED), 0.0
    specials = read_specials(tokenizer_dir)
    return {
        "model": "llama",
        "pre": None,
        "tokens": tokens,
        "scores": scores,
        "token_types": types,
        "merges": [],
        "unk_id": vocab.get(unk) if unk else None,
        "add_space_prefix": True,
        "bos_id": specials.bos_id,
        "eos_id": specials.eos_id,
        "pad_id": specials.pad_id,
        "add_bos": specials.add_bos,
        "add_eos": False,
    }


def add_tokenizer_metadata(
    writer, tokenizer_dir: str | os.PathLike, *, vocab_size: int | None = None, bos_id: int | None = None
) -> dict:
    """Add the tokenizer keys (``tokenizer.ggml.*``) to a ``gguf.GGUFWriter``; returns the metadata dict.

    Args:
        bos_id: the model config's ``bos_token_id``, written when the tokenizer names no bos (Qwen2's
            ``bos_token`` is null; llama.cpp's converter then takes config.json's id, ``gguf.SpecialVocab``).
            Whether it is prepended stays the tokenizer's ``add_bos``.

    Raises:
        InvalidInput: see :func:`tokenizer_metadata`.
    """
    meta = tokenizer_metadata(tokenizer_dir, vocab_size=vocab_size)
    if meta["bos_id"] is None:
        meta["bos_id"] = bos_id
    writer.add_tokenizer_model(meta["model"])
    if meta["pre"] is not None:
        writer.add_tokenizer_pre(meta["pre"])
    writer.add_token_list(meta["tokens"])
    if "scores" in meta:  # SentencePiece: merges chosen by the scores of the merged pieces
        writer.add_token_scores(meta["scores"])
        writer.add_add_space_prefix(meta["add_space_prefix"])
        if meta["unk_id"] is not None:
            writer.add_unk_token_id(meta["unk_id"])
    writer.add_token_types(meta["token_types"])
    if meta["merges"]:
        writer.add_token_merges(meta["merges"])
    if meta["bos_id"] is not None:
        writer.add_bos_token_id(meta["bos_id"])
    writer.add_eos_token_id(meta["eos_id"])
    if meta["pad_id"] is not None:
        writer.add_pad_token_id(meta["pad_id"])
    writer.add_add_bos_token(meta["add_bos"])
    writer.add_add_eos_token(meta["add_eos"])
    return meta


def write_vocab_gguf(tokenizer_dir: str | os.PathLike, path: str | os.PathLike, *, context_length: int = 2048) -> Path:
    """Write a GGUF with the tokenizer and no tensors, for llama.cpp's ``vocab_only`` load.

    The ``llama.*`` hyper-parameters are placeholders (llama.cpp reads them before the vocabulary);
    the file cannot run a model. Written to ``path.tmp`` and renamed.

    Raises:
        InvalidInput: see :func:`tokenizer_metadata`.
    """
    import gguf  # noqa: PLC0415 (optional: pip extra runtimes; llama.cpp's own library)

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with writing(path):
        writer = gguf.GGUFWriter(str(tmp), "llama")
        writer.add_context_length(context_length)
        writer.add_embedding_length(64)
        writer.add_block_count(1)
        writer.add_feed_forward_length(128)
        writer.add_head_count(1)
        writer.add_head_count_kv(1)
        writer.add_layer_norm_rms_eps(1e-5)
        meta = add_tokenizer_metadata(writer, tokenizer_dir)
        writer.add_vocab_size(len(meta["tokens"]))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    return path


def _main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m prodip.tokenizer.gguf TOKENIZER_DIR OUT.gguf", file=sys.stderr)
        return 2
    print(write_vocab_gguf(argv[0], argv[1]))
    return 0


if __name__ == "__main__":
    from prodip.base.cli import tool_main

    sys.exit(tool_main("tokenizer.gguf", _main, sys.argv[1:]))
