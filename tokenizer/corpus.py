"""Read a language-tagged text corpus as a stream of documents, with strict or counted-skip UTF-8 decoding.

Inputs are a mapping ``language -> [file or folder, ...]``. Supported files (folders are searched
recursively, sorted by path): ``.txt`` / ``.txt.gz`` (documents = runs of paragraphs, cut at a blank
line once ``doc_chars`` characters are reached), ``.jsonl`` / ``.jsonl.gz`` (one document per line,
its ``text`` field) and ``.tsv`` (header row; the column named after the language, one document per row).

    python -m prodip.tokenizer.corpus data/bn        # count files, documents and characters
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prodip.base.errors import InvalidInput, MissingInput

SUFFIXES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz", ".tsv")
ERROR_POLICIES = ("strict", "skip")


@dataclass
class ReadStats:
    """Counters filled while reading (per call site; sum them yourself across languages)."""

    files: int = 0
    documents: int = 0
    chars: int = 0
    bytes: int = 0
    skipped_bytes: int = 0
    skipped_where: list[str] = field(default_factory=list)  # first few "file@offset" of skipped bytes


def _suffix_ok(path: Path) -> bool:
    return any(path.name.endswith(s) for s in SUFFIXES)


#: A language tag: it becomes a shard folder name and a key in meta.json, mixtures and reports.
LANG_TAG = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")


def expand_inputs(inputs: dict[str, list[str]], *, what: str = "inputs") -> dict[str, list[Path]]:
    """Resolve ``{lang: [file or folder]}`` into ``{lang: [files]}`` (folders searched recursively).

    Raises:
        ValueError: empty mapping, a language tag that is not a plain code (it names folders and
            keys downstream: letters, digits, ``_`` and ``-``, starting with a letter, <= 32 chars,
            e.g. ``bn``, ``en``, ``zh-Hans``), a language with no files, or an unsupported suffix.
        FileNotFoundError: a listed path does not exist.
    """
    if not inputs:
        raise InvalidInput(f'{what}: no languages given; expected e.g. {{bn = ["data/bn"], en = ["data/en"]}}')
    out: dict[str, list[Path]] = {}
    for lang in inputs:
        if not LANG_TAG.fullmatch(str(lang)):
            raise InvalidInput(
                f"{what}: language tag {lang!r} is not a plain code (letters, digits, '_', '-', "
                f"starting with a letter, at most 32 characters; e.g. bn, en, zh-Hans)"
            )
    for lang, paths in inputs.items():
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        files: list[Path] = []
        for p in paths:
            p = Path(p)
            if p.is_dir():
                files.extend(sorted(f for f in p.rglob("*") if f.is_file() and _suffix_ok(f)))
            elif p.is_file():
                if not _suffix_ok(p):
                    raise InvalidInput(f"{what}.{lang}: {p} has an unsupported suffix; expected one of {SUFFIXES}")
                files.append(p)
            else:
                raise MissingInput(f"{what}.{lang}: {p} does not exist")
        if not files:
            raise InvalidInput(f"{what}.{lang}: no text files ({', '.join(SUFFIXES)}) under {list(map(str, paths))}")
        out[lang] = files
    return out


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def iter_lines(path: Path, errors: str, stats: ReadStats) -> Iterator[str]:
    """Yield decoded lines (with their newline) of a possibly gzip-compressed UTF-8 file.

    Raises:
        ValueError: invalid UTF-8 under ``errors="strict"``, naming the file and the byte offset
            (in the decompressed stream for ``.gz``); a ``.gz`` that is not gzip, truncated or
            corrupt (named); or an unknown policy.
    """
    if errors not in ERROR_POLICIES:
        raise InvalidInput(f"errors must be one of {ERROR_POLICIES}, got {errors!r}")
    offset = 0
    with _open_binary(path) as fh:
        for raw in _read_raw_lines(fh, path):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                if errors == "strict":
                    raise InvalidInput(
                        f"{path}: invalid UTF-8 at byte offset {offset + err.start} ({raw[err.start : err.end]!r}); "
                        "fix the file or pass --errors skip to drop undecodable bytes (they are counted)"
                    ) from None
                line = _decode_skipping(raw, path, offset, stats)
            offset += len(raw)
            yield line
    stats.bytes += offset


def _read_raw_lines(fh, path: Path) -> Iterator[bytes]:
    """Yield the raw lines of ``fh``; a broken ``.gz`` becomes a ValueError naming ``path``.

    Raises:
        ValueError: ``path`` is not gzip data (``gzip.BadGzipFile``), is truncated (``EOFError``)
            or its deflate stream is corrupt (``zlib.error``).
    """
    it = iter(fh)
    while True:
        try:
            raw = next(it)
        except StopIteration:
            return
        except gzip.BadGzipFile as err:
            raise InvalidInput(
                f"{path}: not a gzip file (BadGzipFile: {err}); rename it without .gz if it is "
                "plain text, or re-compress it with gzip"
            ) from None
        except EOFError as err:
            raise InvalidInput(f"{path}: truncated gzip file (EOFError: {err}); re-copy or re-compress it") from None
        except zlib.error as err:
            raise InvalidInput(f"{path}: corrupt gzip data (zlib.error: {err}); re-copy or re-compress it") from None
        yield raw


def _decode_skipping(raw: bytes, path: Path, offset: int, stats: ReadStats) -> str:
    out, pos = [], 0
    while pos < len(raw):
        try:
            out.append(raw[pos:].decode("utf-8"))
            break
        except UnicodeDecodeError as err:
            out.append(raw[pos : pos + err.start].decode("utf-8"))
            bad = max(err.end - err.start, 1)
            stats.skipped_bytes += bad
            if len(stats.skipped_where) < 10:
                stats.skipped_where.append(f"{path}@{offset + pos + err.start}")
            pos += err.start + bad
    return "".join(out)


def _txt_documents(lines: Iterator[str], doc_chars: int) -> Iterator[str]:
    buf: list[str] = []
    size = 0
    for line in lines:
        if not line.strip():
            if size >= doc_chars:
                yield "".join(buf).strip("\n")
                buf, size = [], 0
            elif buf:
                buf.append("\n")
            continue
        buf.append(line if line.endswith("\n") else line + "\n")
        size += len(line)
    if buf:
        yield "".join(buf).strip("\n")


def _jsonl_documents(path: Path, lines: Iterator[str]) -> Iterator[str]:
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InvalidInput(f"{path}:{lineno}: not valid JSON ({err.msg}); expected one object per line") from None
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise InvalidInput(f'{path}:{lineno}: expected an object with a string field "text"')
        yield text


def _tsv_documents(path: Path, lines: Iterator[str], lang: str) -> Iterator[str]:
    header = next(lines, "").rstrip("\r\n").split("\t")
    if lang not in header:
        raise InvalidInput(f"{path}: TSV header {header} has no column {lang!r}; name the column after the language")
    col = header.index(lang)
    for line in lines:
        cells = line.rstrip("\r\n").split("\t")
        if col < len(cells) and cells[col].strip():
            yield cells[col]


def iter_documents(
    path: str | os.PathLike,
    lang: str,
    *,
    errors: str = "strict",
    doc_chars: int = 20000,
    stats: ReadStats | None = None,
) -> Iterator[str]:
    """Yield the non-empty documents of one file (see the module docstring for the formats).

    Args:
        path: a ``.txt``, ``.txt.gz``, ``.jsonl``, ``.jsonl.gz`` or ``.tsv`` file.
        lang: the language tag (selects the ``.tsv`` column).
        errors: ``"strict"`` (invalid UTF-8 is an error) or ``"skip"`` (drop and count the bytes).
        doc_chars: ``.txt`` documents are cut at the first blank line after this many characters.
        stats: counters updated in place.

    Raises:
        ValueError: invalid UTF-8 (strict), a broken ``.gz`` file, bad JSON, a missing ``text`` field or TSV column, or a file
            with no text at all (empty files are refused so a wrong path is not silently ignored).
    """
    path = Path(path)
    stats = stats if stats is not None else ReadStats()
    lines = iter_lines(path, errors, stats)
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        docs = _jsonl_documents(path, lines)
    elif path.name.endswith(".tsv"):
        docs = _tsv_documents(path, lines, lang)
    else:
        docs = _txt_documents(lines, doc_chars)
    stats.files += 1
    n = 0
    for doc in docs:
        if doc.strip():
            n += 1
            stats.documents += 1
            stats.chars += len(doc)
            yield doc
    if n == 0:
        raise InvalidInput(f"{path}: empty file (no text for language {lang!r}); remove it from the inputs")


def iter_language(files: list[Path], lang: str, **kwargs) -> Iterator[tuple[Path, int, str]]:
    """Yield ``(file, index_in_file, document)`` for every document of every file of one language."""
    for f in files:
        for i, doc in enumerate(iter_documents(f, lang, **kwargs)):
            yield f, i, doc


def _main(argv: list[str]) -> int:
    stats = ReadStats()
    files = expand_inputs({"xx": argv})["xx"]
    for _ in iter_language(files, "xx", stats=stats):
        pass
    print(f"{stats.files} files, {stats.documents} documents, {stats.chars:,} chars, {stats.bytes:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
