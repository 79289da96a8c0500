"""Encode a language-tagged corpus into token shards with a tokenizer dir (``prodip data prepare``).

Per language, documents (see tokenizer/corpus.py) are NFC-normalised and encoded with the ``tokenizers``
batch encoder (all cores) as ``bos ids eos`` with the tokenizer's own special tokens
(:func:`prodip.tokenizer.bpe.load_with_specials`): prodip's ``<|bos|> ids <|eos|>``; an imported model's
bos only where its post-processor prepends one, as every runtime's default encode does for a prompt
(Llama 3's ``<|begin_of_text|>``; SmolLM2 and Qwen2 have none, so their documents are ``ids eos``), and its
end-of-text token as the eos (:func:`prodip.tokenizer.bpe.document_end_id`: ``<|endoftext|>``,
``<|end_of_text|>``, ``</s>``, not an instruct model's end of turn); meta.json records both ids. Sent to ``train`` or ``val`` by a seeded hash of
(language, file name, document index): deterministic, independent of batch size and core count. If a
language's hash draw puts no document in ``val`` (a tiny corpus), its last document goes there. Output is
built in a temp dir and renamed into place, so a failed run leaves nothing behind.

    prodip data prepare --tokenizer-dir runs/tok --inputs bn=data/bn,en=data/en --out-dir runs/shards
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import struct
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from prodip.base.config import dump_toml, to_dict
from prodip.base.files import raise_for_room
from prodip.base.records import check_replaceable_dir
from prodip.base.sources import match_sources
from prodip.base.specials import Specials
from prodip.tokenizer import coverage, shards
from prodip.tokenizer.bpe import _doc_unit, document_end_id, load_with_specials, tokenizer_sha256
from prodip.tokenizer.config import DataPrepareConfig
from prodip.tokenizer.corpus import (
    ReadStats,
    expand_inputs,
    iter_language,
)
from prodip.tokenizer.portable import nfc

log = logging.getLogger(__name__)


class _SplitWriter:
    """Buffers one language/split's tokens and writes numbered shards of at most ``shard_tokens``."""

    def __init__(self, root: Path, lang: str, split: str, token_dtype: str, shard_tokens: int):
        self.root, self.lang, self.split = root, lang, split
        self.token_dtype, self.shard_tokens = token_dtype, shard_tokens
        self.buf: list[np.ndarray] = []
        self.n_buf = 0
        self.entries: list[dict] = []
        self.documents = 0

    def add(self, ids: np.ndarray) -> None:
        self.buf.append(ids)
        self.n_buf += ids.size
        self.documents += 1
        while self.n_buf >= self.shard_tokens:
            self._flush(self.shard_tokens)

    def _flush(self, n: int) -> None:
        tokens = np.concatenate(self.buf) if self.buf else np.zeros(0, np.uint32)
        head, rest = tokens[:n], tokens[n:]
        rel = f"{self.lang}/{shards.shard_name(self.split, len(self.entries))}"
        shards.write_shard(self.root / rel, head, self.token_dtype)
        self.entries.append({"file": rel, "n_tokens": int(head.size)})
        self.buf, self.n_buf = ([rest] if rest.size else []), int(rest.size)

    def close(self) -> list[dict]:
        if self.n_buf or not self.entries:
            self._flush(self.n_buf)
        return self.entries


def _uncompressed_size(path: Path) -> int:
    """Bytes of text in ``path`` (a .gz file's ISIZE trailer: exact below 4 GiB)."""
    if path.name.endswith(".gz"):
        with open(path, "rb") as fh:
            fh.seek(-4, os.SEEK_END)
            return struct.unpack("<I", fh.read(4))[0]
    return path.stat().st_size


def _encode_batch(tok, texts: list[str], specials: Specials) -> list[list[int]]:
    """``bos ids`` per text, or ``ids`` where the tokenizer prepends no bos (NFC first: the contract, whatever
    normaliser the tokenizer has)."""
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: faster
    # the bos is added here, not by the post-processor: one that also appends a token would double the eos
    head = [specials.bos_id] if specials.add_bos and specials.bos_id is not None else []
    return [head + e.ids for e in encode([nfc(t) for t in texts], add_special_tokens=False)]


def _encode_language(
    tok,
    specials: Specials,
    lang: str,
    files: list[Path],
    cfg: DataPrepareConfig,
    tmp: Path,
    token_dtype: str,
    bar,
    stats: ReadStats,
    per_file: dict[Path, dict[str, int]],
) -> dict:
    (tmp / lang).mkdir()
    writers = {s: _SplitWriter(tmp, lang, s, token_dtype, cfg.shard_tokens) for s in shards.SPLITS}
    np_dtype = np.dtype(token_dtype)
    eos = np.array([specials.eos_id], dtype=np_dtype)
    pending: np.ndarray | None = None  # last train document, held back in case val ends up empty

    def flush(batch: list[tuple[str, str, Path]]) -> None:
        nonlocal pending
        for (split, text, path), ids in zip(batch, _encode_batch(tok, [t for _, t, _ in batch], specials)):
            doc = np.concatenate([np.asarray(ids, dtype=np_dtype), eos])
            count = per_file.setdefault(path, {"documents": 0, "chars": 0, "tokens": 0})
            count["documents"] += 1
            count["chars"] += len(text)
            count["tokens"] += int(doc.size)
            if split == "train":
                if pending is not None:
                    writers["train"].add(pending)
                pending = doc
            else:
                writers["val"].add(doc)
            bar.update(len(text.encode("utf-8")))

    batch: list[tuple[str, str, Path]] = []
    size = 0
    docs = iter_language(
        files, lang, errors=cfg.errors, doc_chars=cfg.doc_chars, stats=stats, text_field=cfg.text_field
    )
    for path, index, text in docs:
        split = "val" if _doc_unit(cfg.seed, lang, path, index) < cfg.val_fraction else "train"
        batch.append((split, text, path))
        size += len(text)
        if size >= cfg.batch_chars:
            flush(batch)
            batch, size = [], 0
    flush(batch)
    if pending is not None:
        move = cfg.val_fraction > 0 and writers["val"].documents == 0 and writers["train"].documents >= 1
        writers["val" if move else "train"].add(pending)
    return {s: w.close() for s, w in writers.items()} | {"documents": {s: w.documents for s, w in writers.items()}}


def _source_entries(matched: dict, per_file: dict[Path, dict[str, int]]) -> list[dict]:
    """meta.json's ``sources``: each record's card fields with its documents, characters and tokens (all
    splits; tokens include each document's ``<|bos|>`` and ``<|eos|>``) and its shares of its language's."""
    entries = []
    for rec, files in matched.values():
        counts = {k: sum(per_file.get(f, {}).get(k, 0) for f in files) for k in ("documents", "chars", "tokens")}
        entries.append({**rec.card_fields(), **counts})
    for e in entries:
        same = [x for x in entries if x["language"] == e["language"]]
        for k in ("chars", "tokens"):
            total = sum(x[k] for x in same)
            e[f"{k}_share_of_language"] = round(e[k] / total, 6) if total else 0.0
    return entries


def split_share_warnings(languages: dict[str, dict], val_fraction: float, doc_chars: int) -> list[str]:
    """A warning (logged, and kept in ``meta.json`` ``split_warnings``) per language whose validation share of
    tokens is far from ``val_fraction``: documents go to a split whole, so with few long documents (a
    ``.txt`` file becomes documents of about ``doc_chars`` characters) the share can be several times the
    one asked for. Far: off by more than half of ``val_fraction`` and by more than one point."""
    warnings = []
    for lang, entry in languages.items():
        n = {s: sum(e["n_tokens"] for e in entry.get(s, [])) for s in shards.SPLITS}
        total = sum(n.values())
        if not total or val_fraction <= 0:
            continue
        share = n["val"] / total
        docs = entry.get("documents") or {}
        if abs(share - val_fraction) > max(0.5 * val_fraction, 0.01):
            none = " (none: eval will skip this language)" if not n["val"] else ""
            warnings.append(
                f"{lang}: the validation split holds {share:.1%} of the tokens, not val_fraction {val_fraction:.1%}"
                f"{none}: documents go to a split whole and there are {sum(docs.values())} ({docs.get('val', 0)} in "
                f"validation); use more, shorter documents: a smaller [data] doc_chars (now {doc_chars}; it cuts "
                f".txt files, at a blank line or at a line end after twice as many characters), or split the "
                f"language's JSONL/Parquet/CSV text into more rows (one document per row)"
            )
    for w in warnings:
        log.warning(w)
    return warnings


def prepare_shards(cfg: DataPrepareConfig) -> Path:
    """Encode ``cfg.inputs`` into a shards dir (layout in tokenizer/shards.py); returns its path.

    Raises:
        FileNotFoundError: tokenizer dir or an input missing.
        ValueError: no inputs, an empty file, invalid UTF-8 (strict), bad JSONL/TSV.
        FileExistsError: ``out_dir`` already holds shards and ``overwrite`` is false; is not empty and not a
            shards dir; or holds shards of a newer prodip (``meta.json`` and its format_version named).
            Nothing is deleted (:func:`prodip.base.records.check_replaceable_dir`).
        prodip.base.sources.LicenseGateError: an input whose licence is unknown or unrecorded and not in
            ``include_unknown_license`` (before anything is read or written).
    """
    tok, specials = load_with_specials(cfg.tokenizer_dir)
    specials = dataclasses.replace(specials, eos_id=document_end_id(tok, specials))
    sha = tokenizer_sha256(cfg.tokenizer_dir)
    vocab_size = tok.get_vocab_size()
    token_dtype = shards.token_dtype_for(vocab_size)
    skipped: list[Path] = []
    files = expand_inputs(cfg.inputs, skipped=skipped)
    matched = match_sources(files, cfg.sources, cfg.include_unknown_license, what="data.inputs")
    out = Path(cfg.out_dir)
    check_replaceable_dir(
        out,
        what="shards dir",
        marker=shards.META_NAME,
        holds="shards",
        records=[shards.ShardsMeta],
        replace=cfg.overwrite,
        option="--overwrite true",
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    start = time.perf_counter()
    total_bytes = sum(_uncompressed_size(f) for fs in files.values() for f in fs)
    languages, read, per_file = {}, {}, {}
    try:
        with tqdm(total=total_bytes, unit="B", unit_scale=True, desc="encode", disable=not cfg.progress) as bar:
            for lang, lang_files in files.items():
                read[lang] = ReadStats()
                languages[lang] = _encode_language(
                    tok, specials, lang, lang_files, cfg, tmp, token_dtype, bar, read[lang], per_file
                )
                languages[lang].update(
                    chars=read[lang].chars, bytes=read[lang].bytes, skipped_bytes=read[lang].skipped_bytes
                )
        elapsed = time.perf_counter() - start
        text_mb = sum(r.bytes for r in read.values()) / 1e6
        meta = {
            "tokenizer_sha256": sha,
            "vocab_size": vocab_size,
            "token_dtype": token_dtype,
            "bos_id": specials.bos_id if specials.add_bos else None,
            "eos_id": specials.eos_id,
            "pad_id": specials.pad_id,
            "document_layout": shards.document_layout(tok, specials),
            "val_fraction": cfg.val_fraction,
            "seed": cfg.seed,
            "languages": languages,
            "sources": _source_entries(matched, per_file),
            "skipped_bytes": sum(r.skipped_bytes for r in read.values()),
            "skipped_where": [w for r in read.values() for w in r.skipped_where][:10],
            "skipped_files": [str(p) for p in skipped],
            "encode_s": round(elapsed, 2),
            "mb_per_s": round(text_mb / max(elapsed, 1e-9), 2),
        }
        meta["language_warnings"] = coverage.warn_languages(
            cfg.tokenizer_dir, tok, files, meta, tmp, text_field=cfg.text_field, errors=cfg.errors
        )
        meta["split_warnings"] = split_share_warnings(languages, cfg.val_fraction, cfg.doc_chars)
        shards.write_meta(tmp, meta)
        (tmp / "data_config.toml").write_text(dump_toml({"data": to_dict(cfg)}), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except Exception as err:
        raise_for_room(err, tmp, shown_as=out)  # a full disk: one line naming the file
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n_tokens = sum(e["n_tokens"] for lang in languages.values() for s in shards.SPLITS for e in lang[s])
    log.info(
        "%d tokens from %.1f MB of text in %.1f s (%.2f MB/s) -> %s", n_tokens, text_mb, elapsed, meta["mb_per_s"], out
    )
    if meta["skipped_bytes"]:
        log.warning("skipped %d undecodable bytes (first at %s)", meta["skipped_bytes"], meta["skipped_where"][:3])
    return out
