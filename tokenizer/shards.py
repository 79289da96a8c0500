"""The token-shard format: the only reader and writer of shard files and the shards dir's meta.json.

A shard is a 256 x int32 header followed by the tokens (the llm.c layout):
``header[0] = 20240520`` (magic), ``header[1]`` = version (1: uint16 tokens, 2: uint32 tokens),
``header[2]`` = number of tokens, ``header[3]`` = bytes per token; the rest is zero.
A shards dir holds ``meta.json`` and ``{lang}/{split}_{index:06d}.bin``. Each document is stored as
``<|bos|> ids <|eos|>`` (:data:`DOCUMENT_LAYOUT`; ids in meta.json ``bos_id``/``eos_id``; an imported
model's tokenizer has its own, and no bos where it prepends none: meta.json ``bos_id`` null and
``document_layout`` e.g. ``ids <|endoftext|>``), documents back to back; the first shard of a split starts at a document start. meta.json ``format_version`` 2 is this
layout; version 1 (documents followed by ``<|eos|>`` only) is refused. Each shard's entry in
meta.json carries its ``sha256`` and ``max_id`` (largest token id), filled in and checked against
``vocab_size`` by :func:`write_meta`; :func:`open_checked_shards` verifies both before a shard is
read, so a corrupt or foreign shard is refused by name instead of failing inside the model.

    python -m prodip.tokenizer.shards runs/demo/shards      # print meta.json and check every shard
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import Field, StrictInt

from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.files import file_sha256_cached, writing
from prodip.base.records import Number, Record, RecordPart

MAGIC = 20240520
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
FORMAT_VERSION = 2  # 2: each document is <|bos|> ids <|eos|> (1: ids <|eos|>)
DOCUMENT_LAYOUT = "<|bos|> ids <|eos|>"
META_NAME = "meta.json"


def document_layout(tok: Any, specials: Any) -> str:
    """meta.json's ``document_layout`` for a tokenizer and its :class:`prodip.base.specials.Specials`:
    ``<|bos|> ids <|eos|>`` for prodip's, e.g. ``ids <|endoftext|>`` for SmolLM2's."""
    bos = f"{tok.id_to_token(specials.bos_id)} " if specials.add_bos and specials.bos_id is not None else ""
    return f"{bos}ids {tok.id_to_token(specials.eos_id)}"


SPLITS = ("train", "val")
# header version -> token dtype (version 1 is llm.c's uint16 layout; 2 is the same with uint32)
_VERSION_DTYPE = {1: np.dtype("<u2"), 2: np.dtype("<u4")}
_DTYPE_VERSION = {"uint16": 1, "uint32": 2}
_PRODUCER = "prodip data prepare --tokenizer-dir TOKENIZER_DIR --out-dir SHARDS_DIR"


def token_dtype_for(vocab_size: int) -> str:
    """``"uint16"`` when every id fits (vocab_size <= 65536), else ``"uint32"``."""
    return "uint16" if vocab_size <= 65536 else "uint32"


def shard_name(split: str, index: int) -> str:
    """File name of shard ``index`` of ``split``, e.g. ``train_000000.bin``."""
    if split not in SPLITS:
        raise InvalidInput(f"split must be one of {SPLITS}, got {split!r}")
    return f"{split}_{index:06d}.bin"


def write_shard(path: str | os.PathLike, tokens: np.ndarray | list[int], token_dtype: str) -> int:
    """Write one shard atomically (``path.tmp`` then rename).

    Args:
        path: destination ``.bin`` file.
        tokens: (N,) integer token ids, all in range of ``token_dtype``.
        token_dtype: ``"uint16"`` or ``"uint32"``.

    Returns:
        the number of tokens written.

    Raises:
        ValueError: unknown ``token_dtype`` or an id that does not fit in it.
    """
    if token_dtype not in _DTYPE_VERSION:
        raise InvalidInput(f"token_dtype must be 'uint16' or 'uint32', got {token_dtype!r}")
    version = _DTYPE_VERSION[token_dtype]
    dtype = _VERSION_DTYPE[version]
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise InvalidInput(f"tokens must be 1-D, got shape {arr.shape}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > np.iinfo(dtype).max):
        raise InvalidInput(f"token ids in [{arr.min()}, {arr.max()}] do not fit {token_dtype}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = (MAGIC, version, arr.size, dtype.itemsize)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with writing(path):
        with open(tmp, "wb") as fh:
            fh.write(header.tobytes())
            fh.write(arr.astype(dtype, copy=False).tobytes())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    return int(arr.size)


def read_header(path: str | os.PathLike) -> tuple[int, np.dtype]:
    """Read and check a shard header; returns ``(n_tokens, dtype)``.

    Raises:
        FileNotFoundError: no such shard.
        ValueError: wrong magic/version, or the file size disagrees with the header.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"{path}: no such shard; produce shards with `{_PRODUCER}`")
    with open(path, "rb") as fh:
        raw = fh.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise InvalidInput(f"{path}: {len(raw)} bytes, shorter than the 1024-byte shard header")
    header = np.frombuffer(raw, dtype="<i4")
    if int(header[0]) != MAGIC:
        raise InvalidInput(f"{path}: magic {int(header[0])}, expected {MAGIC}: not a prodip/llm.c token shard")
    version = int(header[1])
    if version not in _VERSION_DTYPE:
        raise InvalidInput(f"{path}: shard version {version}, expected 1 (uint16) or 2 (uint32)")
    dtype = _VERSION_DTYPE[version]
    n_tokens = int(header[2])
    expected = HEADER_BYTES + n_tokens * dtype.itemsize
    size = path.stat().st_size
    if size != expected:
        raise InvalidInput(
            f"{path}: {size} bytes, header says {n_tokens} tokens = {expected} bytes "
            f"(truncated or corrupt shard; re-run `{_PRODUCER}`)"
        )
    return n_tokens, dtype


def read_shard(path: str | os.PathLike) -> np.ndarray:
    """Memory-map one shard's tokens.

    Returns:
        (N,) read-only ``np.memmap`` of dtype uint16 or uint32 (N may be 0: an empty array).

    Raises:
        FileNotFoundError, ValueError: see :func:`read_header`.
    """
    n_tokens, dtype = read_header(path)
    if n_tokens == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(n_tokens,))


class ShardEntry(RecordPart):
    """One shard of a language's split in ``meta.json``: its file (relative to the shards dir), tokens,
    largest id and sha256 (the last two absent in shards written before checksums existed)."""

    file: str
    n_tokens: StrictInt
    max_id: StrictInt | None = None
    sha256: str | None = None


class LanguageShards(RecordPart):
    """A language's shards and counts in ``meta.json`` ``languages[lang]``."""

    train: list[ShardEntry] = Field(default_factory=list)
    val: list[ShardEntry] = Field(default_factory=list)
    #: documents per split
    documents: dict[str, int] = Field(default_factory=dict)
    chars: StrictInt = 0
    bytes: StrictInt = 0
    skipped_bytes: StrictInt = 0

    def split(self, split: str) -> list[ShardEntry]:
        """The shards of ``split`` (``train`` | ``val``)."""
        return self.train if split == "train" else self.val


class ShardsMeta(Record):
    """A shards dir's ``meta.json`` (format_version 2; version 1, documents without ``<|bos|>``, is not
    read). Written by :func:`write_meta` (``prodip data prepare``), read by :func:`load_meta`."""

    FILE: ClassVar[str] = META_NAME
    FORMAT_VERSION: ClassVar[int] = FORMAT_VERSION
    READS: ClassVar[tuple[int, ...]] = (FORMAT_VERSION,)
    MAKER: ClassVar[str] = f"`{_PRODUCER}`"
    REFUSED: ClassVar[dict[int, str]] = {
        1: f"version 1 stored documents without <|bos|>; each is now {DOCUMENT_LAYOUT}"
    }

    tokenizer_sha256: str
    vocab_size: StrictInt
    token_dtype: str
    bos_id: StrictInt | None  # None: documents are ``ids eos`` (a tokenizer that prepends no bos)
    eos_id: StrictInt
    pad_id: StrictInt | None = None
    document_layout: str | None = None
    val_fraction: Number | None = None
    seed: StrictInt | None = None
    languages: dict[str, LanguageShards]
    #: each input's source record with its documents, characters and tokens (``prodip.base.sources``)
    sources: list[dict[str, Any]] = Field(default_factory=list)
    skipped_bytes: StrictInt = 0
    skipped_where: list[Any] = Field(default_factory=list)
    skipped_files: list[str] = Field(default_factory=list)
    encode_s: Number | None = None
    mb_per_s: Number | None = None
    language_warnings: list[str] = Field(default_factory=list)
    split_warnings: list[str] = Field(default_factory=list)


def write_meta(shards_dir: str | os.PathLike, meta: dict[str, Any]) -> None:
    """Write ``meta.json`` atomically (:class:`ShardsMeta`), adding ``format_version`` and each shard's
    ``sha256`` and ``max_id``.

    Raises:
        ValueError: a shard holds an id >= ``meta["vocab_size"]`` (named), or ``meta`` is not a
            :class:`ShardsMeta` (field named).
    """
    add_checksums(shards_dir, meta)
    path = Path(shards_dir) / META_NAME
    ShardsMeta.from_dict({"format_version": FORMAT_VERSION, **meta}, path).write(path)


def load_meta(shards_dir: str | os.PathLike, expected_tokenizer_sha256: str | None = None) -> ShardsMeta:
    """Read and check a shards dir's ``meta.json``.

    Args:
        shards_dir: a dir written by ``prodip data prepare``.
        expected_tokenizer_sha256: when given, the sha256 of the tokenizer.json the run was configured
            with (``prodip.tokenizer.bpe.tokenizer_sha256(dir)``); a different hash is refused.

    Returns:
        the :class:`ShardsMeta` record.

    Raises:
        FileNotFoundError: no ``meta.json``.
        ValueError: a ``format_version`` other than 2 (version and layout named), a missing or mistyped
            field (named), or a tokenizer hash mismatch.
    """
    path = Path(shards_dir) / META_NAME
    if not path.is_file():
        raise MissingInput(f"{path}: not found; {shards_dir} is not a shards dir (make one with `{_PRODUCER}`)")
    meta = ShardsMeta.read(path)
    if expected_tokenizer_sha256 is not None and meta.tokenizer_sha256 != expected_tokenizer_sha256:
        raise InvalidInput(
            f"{path}: shards were encoded with tokenizer sha256 {meta.tokenizer_sha256[:16]}…, but this run "
            f"uses tokenizer sha256 {expected_tokenizer_sha256[:16]}…; re-encode with `{_PRODUCER}` using the "
            "run's tokenizer dir"
        )
    return meta


def read_meta_or_none(shards_dir: str | os.PathLike) -> ShardsMeta | None:
    """``meta.json`` as a record, or None when it is missing or unreadable (for done-checks)."""
    return ShardsMeta.read_or_none(Path(shards_dir) / META_NAME)


def shard_paths(shards_dir: str | os.PathLike, lang: str, split: str) -> list[Path]:
    """Paths of the shards of ``lang``/``split`` listed in meta.json, in order.

    Raises:
        ValueError: unknown language or split (the message lists the known ones).
        FileNotFoundError: meta.json or a listed shard is missing.
    """
    meta = load_meta(shards_dir)
    langs = meta.languages
    if lang not in langs:
        raise InvalidInput(f"{shards_dir}: no language {lang!r} in meta.json (has {', '.join(sorted(langs))})")
    if split not in SPLITS:
        raise InvalidInput(f"split must be one of {SPLITS}, got {split!r}")
    paths = [Path(shards_dir) / entry.file for entry in langs[lang].split(split)]
    for p in paths:
        if not p.is_file():
            raise MissingInput(f"{p}: listed in {shards_dir}/meta.json but missing; re-run `{_PRODUCER}`")
    return paths


def add_checksums(shards_dir: str | os.PathLike, meta: dict[str, Any]) -> None:
    """Fill ``sha256`` and ``max_id`` into every shard entry of ``meta["languages"]`` (in place).

    Raises:
        ValueError: a shard holds an id >= ``meta["vocab_size"]``, naming the file.
    """
    for splits in meta.get("languages", {}).values():
        for split in SPLITS:
            for entry in splits.get(split, []):
                path = Path(shards_dir) / entry["file"]
                tokens = read_shard(path)
                entry["max_id"] = int(tokens.max()) if len(tokens) else -1
                _check_max_id(path, entry["max_id"], meta.get("vocab_size"))
                entry["sha256"] = file_sha256_cached(path)


def _check_max_id(path: Path, max_id: int, vocab_size: int | None) -> None:
    if vocab_size is not None and max_id >= int(vocab_size):
        raise InvalidInput(
            f"{path}: holds token id {max_id}, outside the vocabulary of {vocab_size} tokens "
            f"(corrupt shard or another tokenizer's); re-run `{_PRODUCER}`"
        )


def open_checked_shards(shards_dir: str | os.PathLike, lang: str, split: str) -> list[np.ndarray]:
    """Memory-map ``lang``/``split``'s shards after checking each against meta.json.

    Each file's sha256 (hashed once per process per file version) must equal its entry's
    ``sha256`` and its entry's ``max_id`` must be below ``vocab_size``. Entries written before
    these fields existed are checked by scanning the tokens for the largest id (and a warning
    asks for a re-run to get checksums).

    Returns:
        one (N,) uint16/uint32 read-only array per shard, in meta.json order.

    Raises:
        ValueError: a checksum mismatch or an out-of-vocabulary id, naming the shard; see also
            :func:`shard_paths` and :func:`read_header`.
        FileNotFoundError: meta.json or a shard is missing.
    """
    meta = load_meta(shards_dir)
    paths = shard_paths(shards_dir, lang, split)
    entries = meta.languages[lang].split(split)
    arrays = []
    for path, entry in zip(paths, entries):
        tokens = read_shard(path)
        if entry.sha256 is not None:
            actual = file_sha256_cached(path)
            if actual != entry.sha256:
                raise InvalidInput(
                    f"{path}: sha256 {actual[:16]}… differs from {entry.sha256[:16]}… in "
                    f"{Path(shards_dir) / META_NAME} (the shard changed after it was written); re-run `{_PRODUCER}`"
                )
            max_id = int(entry.max_id if entry.max_id is not None else -1)
        else:
            _warn_unchecked(shards_dir)
            max_id = int(tokens.max()) if len(tokens) else -1
        _check_max_id(path, max_id, meta.vocab_size)
        arrays.append(tokens)
    return arrays


_WARNED: set[str] = set()


def _warn_unchecked(shards_dir: str | os.PathLike) -> None:
    key = str(Path(shards_dir).resolve())
    if key not in _WARNED:
        _WARNED.add(key)
        logging.getLogger(__name__).warning(
            "%s/meta.json has no shard checksums (written by an older prodip); ids are checked by a scan. "
            "Re-run `%s` to get checksums",
            shards_dir,
            _PRODUCER,
        )


def _main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m prodip.tokenizer.shards SHARDS_DIR", file=sys.stderr)
        return 2
    meta = load_meta(argv[0])
    print(json.dumps({k: v for k, v in meta.to_dict().items() if k != "languages"}, indent=2, ensure_ascii=False))
    for lang in meta.languages:
        for split in SPLITS:
            n = sum(int(read_shard(p).shape[0]) for p in shard_paths(argv[0], lang, split))
            print(f"{lang:>6} {split:>5}: {n:>12,d} tokens")
    return 0


if __name__ == "__main__":
    from prodip.base.cli import tool_main

    sys.exit(tool_main("tokenizer.shards", _main, sys.argv[1:]))


def meta_sha256(shards_dir: str | os.PathLike) -> str | None:
    """sha256 of a shards dir's ``meta.json`` (which holds every shard's sha256), or None when it is
    missing: what a checkpoint and ``eval.json`` record as the shards they were made from."""
    try:
        return file_sha256_cached(Path(shards_dir) / META_NAME)
    except OSError:
        return None
