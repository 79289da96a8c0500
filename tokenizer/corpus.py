"""Read a language-tagged text corpus as a stream of documents, with strict or counted-skip UTF-8 decoding.

Inputs are a mapping ``language -> [file or folder, ...]``. Supported files (folders are searched
recursively, sorted by path; suffixes in any case): ``.txt`` / ``.txt.gz`` (documents = runs of
paragraphs, cut at a blank line once ``doc_chars`` characters are reached, or at a line end at twice
that when no blank line comes, as in a file of one sentence per line), ``.jsonl`` / ``.jsonl.gz``
(one document per line, its ``text_field``, default ``text``), ``.parquet`` and ``.csv`` /
``.csv.gz`` (one document per row, column ``text_field``; read with pyarrow in batches), ``.tsv``
(header row; the column named after the language, one document per row), and a folder written by
Hugging Face ``datasets``' ``save_to_disk`` (``dataset_info.json`` + ``state.json``, or a
``DatasetDict``'s ``dataset_dict.json``: every split, in name order; column ``text_field``; read with
``datasets.load_from_disk``, which never contacts a hub; needs the ``hf-datasets`` extra). Files in a
folder with any other suffix are skipped, and every one of them is listed in a warning (and in
:func:`expand_inputs`' ``skipped`` list).

    python -m prodip.tokenizer.corpus data/bn        # count files, documents and characters
"""

from __future__ import annotations

import codecs
import gzip
import json
import logging
import os
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prodip.base.errors import InvalidInput, MissingInput

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

SUFFIXES = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz", ".tsv", ".parquet", ".csv", ".csv.gz")
#: Files whose presence makes a folder one ``datasets.save_to_disk`` dataset (Dataset or DatasetDict).
HF_DATASET_MARKERS = (("dataset_info.json", "state.json"), ("dataset_dict.json",))
_ROWS_PER_BATCH = 4096  # Parquet/CSV/datasets rows converted to Python strings at once
ERROR_POLICIES = ("strict", "skip")
#: Help texts of the reader options, shared by the stages that read a corpus (tokenizer train, tokenizer
#: audit, data prepare): one wording, and the formats come from :data:`SUFFIXES`.
FORMATS_HELP = "/".join(SUFFIXES) + ", or Hugging Face `datasets` folders"
TEXT_FIELD_HELP = "JSONL field, or Parquet/CSV/`datasets` column, holding each document's text"
DOC_CHARS_HELP = (
    ".txt files: a document ends at the first blank line after this many characters (at a line end after twice "
    "as many when no blank line comes, e.g. one sentence per line); documents go to the train or validation "
    "split whole"
)
ERRORS_HELP = "invalid UTF-8: strict = error naming file and byte offset; skip = drop and count the bytes"


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
    return path.name.lower().endswith(SUFFIXES)


def is_hf_dataset_dir(path: Path) -> bool:
    """A folder written by ``datasets``' ``save_to_disk`` (see :data:`HF_DATASET_MARKERS`)."""
    return path.is_dir() and any(all((path / m).is_file() for m in marks) for marks in HF_DATASET_MARKERS)


def _folder_files(folder: Path, skipped: list[Path], seen_dirs: set[Path] | None = None) -> list[Path]:
    """Readable inputs under ``folder`` (sorted); anything else goes to ``skipped``.

    A ``save_to_disk`` folder is one input; the files inside it are not searched. Each real folder is
    searched once (``seen_dirs``: resolved paths): a symlink back to a folder already searched (a loop such
    as ``lic/loop -> lic``, or a second link to one folder) adds nothing.
    """
    if seen_dirs is None:
        seen_dirs = set()
    real = folder.resolve()
    if real in seen_dirs:
        return []
    seen_dirs.add(real)
    if is_hf_dataset_dir(folder):
        return [folder]
    out: list[Path] = []
    for entry in sorted(folder.iterdir()):
        if entry.is_dir():
            out.extend(_folder_files(entry, skipped, seen_dirs))
        elif entry.is_file() and _suffix_ok(entry):
            out.append(entry)
        elif entry.is_file():
            skipped.append(entry)
    return out


#: A language tag: it becomes a shard folder name and a key in meta.json, mixtures and reports.
LANG_TAG = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")


def expand_inputs(
    inputs: dict[str, list[str]], *, what: str = "inputs", skipped: list[Path] | None = None
) -> dict[str, list[Path]]:
    """Resolve ``{lang: [file or folder]}`` into ``{lang: [files]}`` (folders searched recursively).

    A ``datasets`` ``save_to_disk`` folder is kept whole (one entry). Files inside folders with an
    unsupported suffix are skipped: each is logged in one warning and appended to ``skipped``. Each real
    file (symlinks resolved) is listed once per language, however many paths reach it: symlinked folders
    are followed once and a symlink loop ends where it comes back; the extra paths are named in one
    warning (reading a file twice would silently double its weight).

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
        found: list[Path] = []
        passed: list[Path] = []
        seen_dirs: set[Path] = set()
        for p in paths:
            p = Path(p)
            if p.is_dir():
                found.extend(_folder_files(p, passed, seen_dirs))
            elif p.is_file():
                if not _suffix_ok(p):
                    raise InvalidInput(f"{what}.{lang}: {p} has an unsupported suffix; expected one of {SUFFIXES}")
                found.append(p)
            else:
                raise MissingInput(f"{what}.{lang}: {p} does not exist")
        files: list[Path] = []
        again: list[Path] = []
        real_files: set[Path] = set()
        for f in found:
            real = f.resolve()
            (again if real in real_files else files).append(f)
            real_files.add(real)
        if again:
            log.warning(
                "%s.%s: %d path(s) reach a file already listed (a symlink or a path given twice); each file is "
                "read once: %s",
                what,
                lang,
                len(again),
                ", ".join(map(str, again)),
            )
        if passed:
            log.warning(
                "%s.%s: skipped %d file(s) with an unsupported suffix (supported: %s): %s",
                what,
                lang,
                len(passed),
                ", ".join(SUFFIXES),
                ", ".join(map(str, passed)),
            )
            if skipped is not None:
                skipped.extend(passed)
        if not files:
            raise InvalidInput(
                f"{what}.{lang}: no text files ({', '.join(SUFFIXES)}) or datasets folders under {list(map(str, paths))}"
            )
        out[lang] = files
    return out


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def iter_lines(path: Path, errors: str, stats: ReadStats) -> Iterator[str]:
    """Yield decoded lines (with their newline) of a possibly gzip-compressed UTF-8 file.

    A byte-order mark at the start of the file (U+FEFF, which Windows Notepad writes) is a marker,
    not text: it is dropped (as Python's ``utf-8-sig`` codec does), not trained on.

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
            if offset == 0 and raw.startswith(codecs.BOM_UTF8):
                offset, raw = len(codecs.BOM_UTF8), raw[len(codecs.BOM_UTF8) :]
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
    """Documents of a ``.txt`` file: a document ends at the first blank line after ``doc_chars``
    characters, or, when no blank line comes, at the end of the line that takes it to ``2 * doc_chars``.
    The second rule is for files without paragraphs (one sentence per line, the commonest scraped shape):
    without it such a file is one document, which goes to one split whole, so its language gets no
    validation text however ``val_fraction`` and ``doc_chars`` are set."""
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
        if size >= 2 * doc_chars:
            yield "".join(buf).strip("\n")
            buf, size = [], 0
    if buf:
        yield "".join(buf).strip("\n")


def _jsonl_documents(path: Path, lines: Iterator[str], text_field: str = "text") -> Iterator[str]:
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InvalidInput(f"{path}:{lineno}: not valid JSON ({err.msg}); expected one object per line") from None
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            keys = sorted(record) if isinstance(record, dict) else []
            raise InvalidInput(
                f"{path}:{lineno}: expected an object with a string field {text_field!r} (has {keys}); "
                "set text_field to the field holding the text"
            )
        yield text


def _column_documents(path: Path, batches: Iterator[pa.RecordBatch], text_field: str) -> Iterator[str]:
    """Strings of column ``text_field`` of Arrow record batches (nulls skipped)."""
    # imported where a Parquet/CSV file is read: pyarrow is the train extra's, and the whole-file config check
    # (`prodip serve --config`, default install) imports this module for its help texts
    import pyarrow as pa  # noqa: PLC0415

    for batch in batches:
        if text_field not in batch.schema.names:
            raise InvalidInput(
                f"{path}: no column {text_field!r} (has {batch.schema.names}); set text_field to the text column"
            )
        column = batch.column(text_field)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise InvalidInput(f"{path}: column {text_field!r} holds {column.type}, expected strings")
        yield from (t for t in column.to_pylist() if t is not None)


def _arrow_documents(path: Path, text_field: str, stats: ReadStats) -> Iterator[str]:
    """Documents of a Parquet or CSV file (pyarrow, streamed in batches).

    Raises:
        ValueError: not readable as Parquet/CSV (pyarrow's message, the file named), no such
            column, or a column that is not text.
    """
    import pyarrow as pa  # noqa: PLC0415 (see _column_documents)
    import pyarrow.csv as pa_csv  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    stats.bytes += path.stat().st_size
    try:
        if path.name.lower().endswith(".parquet"):
            pf = pq.ParquetFile(path)
            if text_field not in pf.schema_arrow.names:
                raise InvalidInput(
                    f"{path}: no column {text_field!r} (has {pf.schema_arrow.names}); set text_field to the text column"
                )
            batches = pf.iter_batches(batch_size=_ROWS_PER_BATCH, columns=[text_field])
        else:
            convert = pa_csv.ConvertOptions(column_types={text_field: pa.string()})
            batches = pa_csv.open_csv(str(path), convert_options=convert)  # .csv.gz decompressed by suffix
        yield from _column_documents(path, batches, text_field)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as err:
        raise InvalidInput(
            f"{path}: cannot read as {'Parquet' if path.suffix.lower() == '.parquet' else 'CSV'} ({err})"
        ) from None


def _hf_dataset_documents(path: Path, text_field: str, stats: ReadStats) -> Iterator[str]:
    """Documents of a ``datasets`` ``save_to_disk`` folder (every split of a DatasetDict, by name).

    Raises:
        ValueError: ``datasets`` is not installed, or the column is missing or not text.
    """
    try:
        import datasets  # noqa: PLC0415 (optional extra, imported only for such folders)
    except ImportError:
        raise InvalidInput(
            f"{path}: a `datasets` save_to_disk folder; reading it needs `pip install 'prodip[hf-datasets]'`"
        ) from None
    loaded = datasets.load_from_disk(str(path))  # local Arrow files only: never a hub
    parts = [loaded[k] for k in sorted(loaded)] if isinstance(loaded, datasets.DatasetDict) else [loaded]
    for part in parts:
        stats.bytes += sum(f.stat().st_size for f in path.rglob("*.arrow"))
        if text_field not in part.column_names:
            raise InvalidInput(
                f"{path}: no column {text_field!r} (has {part.column_names}); set text_field to the text column"
            )
        yield from _column_documents(path, part.data.to_batches(max_chunksize=_ROWS_PER_BATCH), text_field)


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
    text_field: str = "text",
) -> Iterator[str]:
    """Yield the non-empty documents of one file (see the module docstring for the formats).

    Args:
        path: a ``.txt``, ``.txt.gz``, ``.jsonl``, ``.jsonl.gz``, ``.tsv``, ``.parquet``, ``.csv``
            or ``.csv.gz`` file, or a ``datasets`` ``save_to_disk`` folder.
        lang: the language tag (selects the ``.tsv`` column).
        errors: ``"strict"`` (invalid UTF-8 is an error) or ``"skip"`` (drop and count the bytes);
            Parquet, CSV and ``datasets`` inputs are decoded by pyarrow, which always refuses invalid UTF-8.
        doc_chars: ``.txt`` documents are cut at the first blank line after this many characters, or at a
            line end after twice as many when no blank line comes.
        stats: counters updated in place.
        text_field: the JSONL field, or Parquet/CSV/``datasets`` column, holding the text.

    Raises:
        ValueError: invalid UTF-8 (strict), a broken ``.gz`` file, bad JSON, a missing text field or column,
            an unreadable Parquet/CSV file, or a file with no text at all (empty files are refused so a
            wrong path is not silently ignored).
    """
    path = Path(path)
    stats = stats if stats is not None else ReadStats()
    name = path.name.lower()
    if path.is_dir():
        docs = _hf_dataset_documents(path, text_field, stats)
    elif name.endswith((".parquet", ".csv", ".csv.gz")):
        docs = _arrow_documents(path, text_field, stats)
    elif name.endswith((".jsonl", ".jsonl.gz")):
        docs = _jsonl_documents(path, iter_lines(path, errors, stats), text_field)
    elif name.endswith(".tsv"):
        docs = _tsv_documents(path, iter_lines(path, errors, stats), lang)
    else:
        docs = _txt_documents(iter_lines(path, errors, stats), doc_chars)
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


#: Files :func:`iter_records` reads (one record per line or row); ``datasets`` folders too.
RECORD_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet", ".csv", ".csv.gz")


def iter_records(
    path: str | os.PathLike, field: str, *, errors: str = "strict", stats: ReadStats | None = None
) -> Iterator[tuple[str, object]]:
    """Yield ``(where, value)``: field ``field`` of each record, its structure kept (lists, dicts).

    The structured sibling of :func:`iter_documents` for records that are not one text, e.g.
    conversations (``{"messages": [{"role": ..., "content": ...}, ...]}``): a JSONL object's field, or
    a Parquet / ``datasets`` column of any Arrow type (a list of structs arrives as a list of dicts);
    a CSV cell is a string (a JSON text for structured values; the caller parses it). Null cells
    and blank JSONL lines are skipped.

    Args:
        path: a ``.jsonl`` / ``.jsonl.gz`` / ``.parquet`` / ``.csv`` / ``.csv.gz`` file or a
            ``datasets`` ``save_to_disk`` folder.
        field: the JSONL key or column.
        errors, stats: as :func:`iter_documents` (JSONL decoding).
    Returns:
        An iterator of ``("file:line"`` or ``"file row N"``, value).
    Raises:
        ValueError: bad JSON, a record without ``field``, a missing column, an unreadable file,
            another suffix (naming the file), or no record at all.
    """
    path = Path(path)
    stats = stats if stats is not None else ReadStats()
    name = path.name.lower()
    n = 0
    if name.endswith((".jsonl", ".jsonl.gz")):
        for lineno, line in enumerate(iter_lines(path, errors, stats), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise InvalidInput(
                    f"{path}:{lineno}: not valid JSON ({err.msg}); expected one object per line"
                ) from None
            if not isinstance(record, dict) or field not in record:
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise InvalidInput(f"{path}:{lineno}: expected an object with a field {field!r} (has {keys})")
            n += 1
            yield f"{path}:{lineno}", record[field]
    elif path.is_dir() or name.endswith((".parquet", ".csv", ".csv.gz")):
        for value in _column_values(path, field, stats):
            n += 1
            if value is not None:
                yield f"{path} row {n}", value
    else:
        raise InvalidInput(f"{path}: records are read from {', '.join(RECORD_SUFFIXES)} files or datasets folders")
    stats.files += 1
    if n == 0:
        raise InvalidInput(f"{path}: no records; remove it from the inputs")


def _column_values(path: Path, field: str, stats: ReadStats) -> Iterator[object]:
    """Python values of column ``field`` of a Parquet / CSV file or a ``datasets`` folder, in row order."""
    if path.is_dir():
        try:
            import datasets  # noqa: PLC0415 (optional extra, imported only for such folders)
        except ImportError:
            raise InvalidInput(
                f"{path}: a `datasets` folder; reading it needs `pip install 'prodip[hf-datasets]'`"
            ) from None
        loaded = datasets.load_from_disk(str(path))  # local Arrow files only: never a hub
        parts = [loaded[k] for k in sorted(loaded)] if isinstance(loaded, datasets.DatasetDict) else [loaded]
        tables = []
        for part in parts:
            if field not in part.column_names:
                raise InvalidInput(f"{path}: no column {field!r} (has {part.column_names})")
            tables.append(part.data.to_batches(max_chunksize=_ROWS_PER_BATCH))
        for batches in tables:
            for batch in batches:
                yield from batch.column(field).to_pylist()
        return
    import pyarrow as pa  # noqa: PLC0415 (see _column_documents)
    import pyarrow.csv as pa_csv  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    stats.bytes += path.stat().st_size
    try:
        if path.name.lower().endswith(".parquet"):
            pf = pq.ParquetFile(path)
            if field not in pf.schema_arrow.names:
                raise InvalidInput(f"{path}: no column {field!r} (has {pf.schema_arrow.names})")
            batches = pf.iter_batches(batch_size=_ROWS_PER_BATCH, columns=[field])
        else:
            convert = pa_csv.ConvertOptions(column_types={field: pa.string()})
            batches = pa_csv.open_csv(str(path), convert_options=convert)
        for batch in batches:
            if field not in batch.schema.names:
                raise InvalidInput(f"{path}: no column {field!r} (has {batch.schema.names})")
            yield from batch.column(field).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as err:
        raise InvalidInput(f"{path}: cannot read ({err})") from None


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
    from prodip.base.cli import tool_main

    sys.exit(tool_main("tokenizer.corpus", _main, sys.argv[1:]))
