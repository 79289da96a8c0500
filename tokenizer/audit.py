"""Fertility audit and gate of a tokenizer on held-out text, per language (``prodip tokenizer audit``).

Per language: characters/token, UTF-8 bytes/token, tokens/word, the share of tokens that end inside a
grapheme cluster (Unicode extended grapheme clusters, ``regex``'s ``\\X``), the share of byte-fallback
tokens (``<0xNN>``, or any token that is not whole UTF-8 characters), whether every document round-trips,
and the language's share of the token stream against its share of the characters. Written to
``TOKENIZER_DIR/fertility.json`` and printed as a table; ``--baseline naive`` trains (or reuses) the
GPT-2-style byte-level baseline on the same training inputs and vocabulary and prints it alongside.
The parity check (tokenizer/parity.py) runs the same held-out documents plus a fixed list of tricky
strings through every installed on-device runtime's tokenizer and records a runtime x language table
(``parity`` in fertility.json). The gate (``min_chars_per_token``, and every parity runtime identical)
fails the command, and :func:`check_gate` lets ``prodip train`` refuse an audited-failing tokenizer.

    prodip tokenizer audit --tokenizer-dir runs/tok --heldout bn=data/heldout/udhr_ben.txt \
        --min-chars-per-token bn=3.0,en=3.0 --baseline naive
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import unicodedata
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import regex
from tokenizers import Tokenizer

from prodip.base.config import from_dict, read_toml
from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.records import RecordError, refuse_newer
from prodip.tokenizer.bpe import (
    RESERVED_TOKENS,
    TokenizerTrainConfig,
    TrainInfo,
    load_tokenizer,
    read_train_info,
    tokenizer_sha256,
    train_tokenizer,
)
from prodip.tokenizer.config import AuditConfig
from prodip.tokenizer.corpus import expand_inputs, iter_language
from prodip.tokenizer.parity import format_parity, run_parity
from prodip.tokenizer.records import FERTILITY_NAME, FORMAT_VERSION, FertilityReport

log = logging.getLogger(__name__)


def read_fertility(tokenizer_dir: str | os.PathLike) -> FertilityReport:
    """``tokenizer_dir/fertility.json`` as a record.

    Raises:
        FileNotFoundError: never audited. ValueError: not a fertility report (file and field named).
    """
    return FertilityReport.read(Path(tokenizer_dir) / FERTILITY_NAME)


def read_fertility_or_none(tokenizer_dir: str | os.PathLike) -> FertilityReport | None:
    """:func:`read_fertility`, or None when missing or unreadable (done-checks, the coverage warning)."""
    return FertilityReport.read_or_none(Path(tokenizer_dir) / FERTILITY_NAME)


# ------------------------------------------------------------------------------------------- metrics


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (as in openai/gpt-2 encoder.py), used by ByteLevel."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def token_bytes(tok) -> tuple[list[bytes], np.ndarray]:
    """Per token id: the UTF-8 bytes it stands for, and whether it is a byte-fallback token.

    Works for the prodip tokenizer (``<0xNN>`` byte tokens) and for byte-level (GPT-2) tokenizers.
    Special tokens (prodip's, and any a base model's ``tokenizer.json`` marks special) and ids no token
    has stand for no text (b"").
    """
    config = json.loads(tok.to_str())
    byte_level = "ByteLevel" in json.dumps(config.get("decoder"))
    inverse = {c: b for b, c in _bytes_to_unicode().items()}
    specials = set(RESERVED_TOKENS) | {a["content"] for a in config.get("added_tokens", []) if a.get("special")}
    table: list[bytes] = []
    fallback = np.zeros(tok.get_vocab_size(), dtype=bool)
    for i in range(tok.get_vocab_size()):
        piece = tok.id_to_token(i)
        if piece is None or piece in specials:
            data = b""
        elif byte_level:
            data = bytes(inverse[c] for c in piece)
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            data, fallback[i] = bytes([int(piece[3:5], 16)]), True
        else:
            data = piece.encode("utf-8")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            fallback[i] = True
        table.append(data)
    return table, fallback


def _char_byte_offsets(text: str) -> np.ndarray:
    """(len(text)+1,) int64: UTF-8 byte offset of every character boundary."""
    cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    lens = 1 + (cps >= 0x80) + (cps >= 0x800) + (cps >= 0x10000)
    return np.concatenate([[0], np.cumsum(lens, dtype=np.int64)])


def grapheme_end_offsets(text: str) -> np.ndarray:
    """UTF-8 byte offsets where extended grapheme clusters end (Unicode UAX #29 via ``regex``'s ``\\X``)."""
    ends = [m.end() for m in regex.finditer(r"\X", text)]
    return _char_byte_offsets(text)[np.asarray(ends, dtype=np.int64)] if ends else np.zeros(0, np.int64)


def measure(tok, docs: list[str], table: tuple[list[bytes], np.ndarray] | None = None) -> dict[str, Any]:
    """Fertility figures of ``tok`` on ``docs`` (NFC-normalised first, as the prodip tokenizer does).

    Returns:
        {chars, bytes, words, tokens, chars_per_token, bytes_per_token, tokens_per_word,
         inside_cluster_share, byte_fallback_share, lossless, chars_per_pretoken}. ``chars_per_pretoken``
        is the ceiling of chars_per_token: a token never crosses a pre-token, so no vocabulary behind
        this normaliser and pre-tokenizer reaches more (:func:`pretoken_chars`).
    """
    pieces, fallback = table or token_bytes(tok)
    docs = [unicodedata.normalize("NFC", d) for d in docs]
    encodings = tok.encode_batch(docs, add_special_tokens=False)
    n_tok = n_inside = n_fallback = 0
    lossless = True
    for doc, enc in zip(docs, encodings):
        ids = np.asarray(enc.ids, dtype=np.int64)
        lens = np.fromiter((len(pieces[i]) for i in enc.ids), dtype=np.int64, count=len(enc.ids))
        ends = np.cumsum(lens)
        n_inside += int((~np.isin(ends[lens > 0], grapheme_end_offsets(doc))).sum())
        n_fallback += int(fallback[ids].sum()) if ids.size else 0
        n_tok += ids.size
        lossless = lossless and b"".join(pieces[i] for i in enc.ids) == doc.encode("utf-8")
    chars = sum(map(len, docs))
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    words = sum(len(d.split()) for d in docs)
    per = max(n_tok, 1)
    return {
        "chars": chars,
        "bytes": n_bytes,
        "words": words,
        "tokens": n_tok,
        "chars_per_token": round(chars / per, 4),
        "bytes_per_token": round(n_bytes / per, 4),
        "tokens_per_word": round(n_tok / max(words, 1), 4),
        "inside_cluster_share": round(n_inside / per, 5),
        "byte_fallback_share": round(n_fallback / per, 5),
        "lossless": lossless,
        "chars_per_pretoken": pretoken_chars(tok, docs),
    }


def pretoken_chars(tok, docs: list[str]) -> float:
    """Characters per pre-token of ``docs`` (NFC, then ``tok``'s normaliser and pre-tokenizer): the most
    characters per token any vocabulary behind that pre-tokenizer can reach (one token per pre-token)."""
    chars = pieces = 0
    for doc in docs:
        text = unicodedata.normalize("NFC", doc)
        chars += len(text)
        if tok.normalizer is not None:
            text = tok.normalizer.normalize_str(text)
        pieces += len(tok.pre_tokenizer.pre_tokenize_str(text)) if tok.pre_tokenizer is not None else 1
    return round(chars / max(pieces, 1), 4)


def measure_languages(tok, docs_by_lang: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """:func:`measure` per language plus token share vs character share across the languages."""
    table = token_bytes(tok)
    out = {lang: measure(tok, docs, table) for lang, docs in docs_by_lang.items()}
    total_tok = sum(m["tokens"] for m in out.values()) or 1
    total_chars = sum(m["chars"] for m in out.values()) or 1
    for m in out.values():
        m["token_share"] = round(m["tokens"] / total_tok, 4)
        m["char_share"] = round(m["chars"] / total_chars, 4)
        m["token_share_over_char_share"] = round(m["token_share"] / max(m["char_share"], 1e-12), 4)
    return out


def gate_failures(
    languages: dict[str, dict],
    min_chars_per_token: dict[str, float],
    sample: dict[str, dict] | None = None,
    vocab_size: int | None = None,
    *,
    origin: str = "trained",
) -> list[str]:
    """One message per language below its minimum chars/token (or without held-out text), saying what
    raises it, with the figures: more text of that language or a larger share of it in the tokenizer's
    sample (``sample``: :func:`sample_report`), a larger vocabulary (``vocab_size``), or a lower minimum.
    ``origin`` says whose tokenizer it is: ``trained`` (``prodip tokenizer train``), ``imported`` (a base
    model's: extend it) or ``extended`` (``prodip tokenizer extend``: more new tokens or more text)."""
    failures = []
    for lang, minimum in min_chars_per_token.items():
        if lang not in languages:
            failures.append(
                f"{lang}: no held-out text audited, so chars/token is unknown (minimum {minimum}); "
                f"add {lang} files to [audit] heldout (--heldout {lang}=PATH)"
            )
        elif languages[lang]["chars_per_token"] < minimum:
            got = languages[lang]["chars_per_token"]
            fixes = []
            s = (sample or {}).get(lang)
            if origin == "imported":
                fixes.append(f"extend the vocabulary with {lang} tokens (`prodip tokenizer extend`)")
            elif origin == "extended":
                fixes.append(
                    f"more [extend] new_tokens (now {vocab_size} tokens in all) or more {lang} text in [extend] inputs"
                )
            elif s:
                fixes.append(
                    f"more {lang} text or a larger {lang} share of the tokenizer's sample ([tokenizer] proportions; "
                    f"it held {s['sample_chars']:,} {lang} characters, {s['sample_share']:.0%} of the sample, "
                    f"of {s['available_chars']:,} available)"
                )
            else:
                fixes.append(f"more {lang} text or a larger {lang} share ([tokenizer] proportions)")
            if origin == "trained":
                fixes.append("a larger [tokenizer] vocab_size" + (f" (now {vocab_size})" if vocab_size else ""))
            table = "[extend]" if origin == "extended" else "[audit]"
            fixes.append(f"or a lower {table} min_chars_per_token.{lang} (measured {got:.3f})")
            failures.append(
                f"{lang}: {got:.3f} chars/token is below the minimum {minimum} (fertility gate); to raise it: "
                + ", ".join(fixes)
            )
    return failures


def sample_report(info: TrainInfo | None) -> dict[str, dict] | None:
    """Per language, the tokenizer's training sample against the text available (``train_info.json``):
    ``{lang: {sample_chars, available_chars, used, sample_share}}`` (``used``: the fraction of the available
    text the sample took), or None for a tokenizer dir without those figures."""
    if info is None or not info.sample_chars:
        return None
    drawn, available = info.sample_chars, info.available_chars
    total = max(sum(drawn.values()), 1)
    return {
        lang: {
            "sample_chars": int(n),
            "available_chars": int(available.get(lang, 0)),
            "used": round(n / max(available.get(lang, 0), 1), 4),
            "sample_share": round(n / total, 4),
        }
        for lang, n in drawn.items()
    }


def warn_cut_samples(sample: dict[str, dict] | None, tokenizer_dir: Path) -> list[str]:
    """Warnings for languages whose text the sample mostly left out, e.g. because ``[tokenizer] proportions``
    held every language to the share the smallest one could fill (logged, and kept in ``fertility.json``)."""
    if not sample:
        return []
    full = [lang for lang, s in sample.items() if s["used"] >= 0.99]
    warnings = []
    for lang, s in sample.items():
        if s["used"] < 0.5:
            why = (
                f"[tokenizer] proportions set the sample's size from {', '.join(full)}'s text, all of which it took"
                if full
                else "[tokenizer] sample_chars capped the sample"
            )
            warnings.append(
                f"{lang}: the tokenizer in {tokenizer_dir} was trained on {s['sample_chars']:,} of {s['available_chars']:,} "
                f"{lang} characters ({s['used']:.1%}): {why}; add text to the smaller language(s) or change proportions"
            )
    for w in warnings:
        log.warning(w)
    return warnings


# --------------------------------------------------------------------------------------------- audit


def load_heldout(
    heldout: dict[str, list[str]],
    *,
    max_chars: int,
    errors: str,
    training_files: Sequence[str] = (),
    text_field: str = "text",
    read_files: dict[str, list[str]] | None = None,
) -> dict[str, list[str]]:
    """Documents per language, at most ``max_chars`` characters each.

    A held-out path may be a file or a folder: every file of a supported suffix under a folder is that
    language's text (:func:`prodip.tokenizer.corpus.expand_inputs`), so a folder must hold one
    language only; the files read are appended to ``read_files`` (per language, in reading order), which
    the audit records and prints.

    Raises:
        ValueError: a held-out file was among the tokenizer's training files, one file is given for two
            languages (e.g. a folder of both languages' files for one of them), or no held-out text.
        FileNotFoundError: a missing held-out path.
    """
    files = expand_inputs(heldout, what="[audit] heldout (--heldout)")
    trained = {os.path.realpath(f) for f in training_files}
    owner: dict[str, str] = {}
    for lang, lang_files in files.items():
        for f in lang_files:
            first = owner.setdefault(os.path.realpath(f), lang)
            if first != lang:
                raise InvalidInput(
                    f"heldout: {f} is held-out text of both {first} and {lang} "
                    f"({first} = {', '.join(map(str, heldout[first]))}; {lang} = {', '.join(map(str, heldout[lang]))}); "
                    "a folder given for a language is all that language's text: give each language its own files"
                )
    docs_by_lang: dict[str, list[str]] = {}
    for lang, lang_files in files.items():
        for f in lang_files:
            if os.path.realpath(f) in trained:
                raise InvalidInput(f"heldout.{lang}: {f} was used to train this tokenizer; audit on text it never saw")
        docs, size = [], 0
        read: list[str] = []
        for f, _, doc in iter_language(lang_files, lang, errors=errors, doc_chars=2000, text_field=text_field):
            if not read or read[-1] != str(f):
                read.append(str(f))
            docs.append(doc[: max_chars - size])
            size += len(docs[-1])
            if size >= max_chars:
                break
        docs_by_lang[lang] = docs
        if read_files is not None:
            read_files[lang] = read
    return docs_by_lang


def format_heldout_files(files: dict[str, list[str]], limit: int = 4) -> str:
    """One line naming the held-out files read per language, e.g. ``held-out files: bn 1 (a.txt); en 1 (b.txt)``
    (at most ``limit`` named per language)."""
    parts = []
    for lang, names in files.items():
        shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
        parts.append(f"{lang} {len(names)} ({shown})")
    return "held-out files: " + "; ".join(parts)


def naive_baseline(tokenizer_dir: Path, baseline_dir: str) -> Path:
    """Reuse or train the naive (GPT-2 byte-level, unbalanced) baseline for ``tokenizer_dir``.

    Raises:
        FileNotFoundError: ``tokenizer_dir`` lacks ``train_config.toml`` (it was not made by
            ``prodip tokenizer train``), so the training inputs are unknown.
    """
    out = Path(baseline_dir) if baseline_dir else tokenizer_dir.with_name(tokenizer_dir.name + "-naive")
    config_path = tokenizer_dir / "train_config.toml"
    if not config_path.is_file():
        raise MissingInput(
            f"{config_path}: missing, so the baseline's training inputs are unknown; train with "
            "`prodip tokenizer train` or pass --baseline-dir of an existing naive tokenizer"
        )
    table = read_toml(config_path).get("tokenizer", {})
    if not isinstance(table, dict):
        raise InvalidInput(f"{config_path}: [tokenizer] must be a table")
    cfg = from_dict(TokenizerTrainConfig, table, source=str(config_path))
    ours = read_train_info(tokenizer_dir)
    try:
        info = read_train_info(out)
    except RecordError:  # a damaged baseline is retrained, not a reason to fail the audit
        info = None

    def text_files(files: dict[str, list[str]]) -> dict[str, list[str]]:
        # each file once: ours lists a file once per copy (its weight), the baseline, trained without weights, once
        return {lang: sorted(set(paths)) for lang, paths in files.items()}

    if (
        (out / "tokenizer.json").is_file()
        and info is not None
        and info.kind == "naive"
        and ours is not None
        and text_files(info.files) == text_files(ours.files)
    ):
        return out
    # the trap it shows: the text corpus's natural mix, without word-count tables or source weights
    naive = dataclasses.replace(cfg.corpus_only(), kind="naive", out_dir=str(out), overwrite=True)
    return train_tokenizer(naive)


def parity_texts(docs_by_lang: dict[str, list[str]], max_chars: int) -> dict[str, list[str]]:
    """The non-empty lines of each language's documents, up to ``max_chars`` characters: one parity
    text per line, so the table counts lines (newlines and whitespace runs are in the tricky list)."""
    out: dict[str, list[str]] = {}
    for lang, docs in docs_by_lang.items():
        out[lang], size = [], 0
        for line in (line for doc in docs for line in doc.splitlines() if line.strip()):
            if size >= max_chars:
                break
            out[lang].append(line)
            size += len(line)
    return out


def parity_failures(parity: dict[str, Any]) -> list[str]:
    """One gate message per runtime whose ids differ from tokenizers' (or that failed or was required)."""
    failures = []
    for name, r in parity["runtimes"].items():
        if r["status"] == "differs":
            bad = {lang: c["texts"] - c["excluded"] - c["identical"] for lang, c in r["languages"].items()}
            m = r["first_mismatch"]
            failures.append(
                f"parity: {name} gives different ids on {sum(bad.values())} texts "
                f"({', '.join(f'{k} {v}' for k, v in bad.items() if v)}; first: {m['language']} {m['text'][:30]!r})"
            )
        elif r["status"] == "error":
            failures.append(f"parity: {name} did not run: {r['reason'][:300]}")
    return failures


def tokenizer_folder(path: str | os.PathLike) -> Path:
    """The folder holding the tokenizer: ``path`` itself, or the folder of a ``tokenizer.json`` file."""
    p = Path(path)
    return p.parent if p.is_file() and p.name == "tokenizer.json" else p


def load_any_tokenizer(path: str | os.PathLike):
    """A prodip tokenizer dir (its special-token convention checked, :func:`load_tokenizer`), or any other
    ``tokenizer.json`` (a Hugging Face model's) as ``tokenizers`` reads it.

    Raises:
        MissingInput: no tokenizer.json. InvalidInput: a prodip tokenizer (it has ``<|pad|>``) that
            breaks the convention.
    """
    folder = tokenizer_folder(path)
    file = folder / "tokenizer.json"
    if not file.is_file():
        raise MissingInput(
            f"{file}: not found; give a prodip tokenizer dir, a Hugging Face folder with a tokenizer.json, "
            "or a tokenizer.json"
        )
    tok = Tokenizer.from_file(str(file))
    if tok.token_to_id(RESERVED_TOKENS[0]) is not None:  # prodip's own: hold it to its convention
        return load_tokenizer(folder)
    return tok


def report_file(report: str, tok_dir: Path) -> Path:
    """Where the audit goes: ``--report`` (its folder made, as every stage makes its output's parents),
    else ``TOKENIZER_DIR/fertility.json``. Checked before the audit's work.

    Raises:
        InvalidInput: ``--report`` is an existing folder, or its folder cannot be made (naming ``--report``
            and the reason).
    """
    if not report:
        return tok_dir / FERTILITY_NAME
    path = Path(report)
    if path.is_dir():
        raise InvalidInput(f"--report {report}: is a folder; name the file to write, e.g. {path / FERTILITY_NAME}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidInput(
            f"--report {report}: cannot make its folder {path.parent} ({err.strerror or err}); choose a writable path"
        ) from None
    return path


def run_audit(cfg: AuditConfig) -> FertilityReport:
    """Audit ``cfg.tokenizer_dir``, write ``fertility.json`` into it and return the report.

    Returns:
        the :class:`FertilityReport` written (``tokenizer_sha256``, ``vocab_size``, ``config``, ``languages``:
        {lang: figures}, ``gate``: {min_chars_per_token, passed, failures}, ``sample``: {lang: {sample_chars,
        available_chars, used, sample_share}} | None, ``sample_warnings``, ``baseline``: None | {kind,
        tokenizer_dir, languages}, ``parity``: None | the tokenizer/parity.py report).

    Raises:
        FileNotFoundError / ValueError: missing tokenizer or held-out files, a held-out file used in
            training, invalid UTF-8 (strict). The gate failing is *not* an exception: see ``gate.passed``.
        FileExistsError: the dir's ``fertility.json`` was written by a newer prodip (its format_version
            named); checked before any work, and the file is left as it is.
        InvalidInput: ``--report`` names a folder, or its folder cannot be made (:func:`report_file`).
    """
    tok_dir = tokenizer_folder(cfg.tokenizer_dir)
    report_path = report_file(cfg.report, tok_dir)
    refuse_newer(FertilityReport, report_path, action="prodip tokenizer audit", instead="audit a copy elsewhere")
    tok = load_any_tokenizer(tok_dir)
    info = read_train_info(tok_dir)
    training = info.training_files() if info is not None else []
    read_files: dict[str, list[str]] = {}
    docs = load_heldout(
        cfg.heldout,
        max_chars=cfg.max_chars,
        errors=cfg.errors,
        training_files=training,
        text_field=cfg.text_field,
        read_files=read_files,
    )
    languages = measure_languages(tok, docs)
    sample = sample_report(info)
    origin = "trained" if tok.token_to_id(RESERVED_TOKENS[0]) is not None else "imported"
    failures = gate_failures(languages, cfg.min_chars_per_token, sample, tok.get_vocab_size(), origin=origin)
    parity = None
    if cfg.parity != "off":
        parity = run_parity(tok_dir, parity_texts(docs, cfg.parity_max_chars), require=cfg.parity == "require")
        failures += parity_failures(parity)
    report: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "tokenizer_sha256": tokenizer_sha256(tok_dir),
        "vocab_size": tok.get_vocab_size(),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": dataclasses.asdict(cfg),
        "heldout_files": read_files,
        "languages": languages,
        # what the tokenizer was trained on: per source its weight, characters available and drawn, licence
        "training_sources": info.sources_as_dicts() if info is not None else None,
        "gate": {"min_chars_per_token": dict(cfg.min_chars_per_token), "passed": not failures, "failures": failures},
        "sample": sample,
        "sample_warnings": warn_cut_samples(sample, tok_dir),
        "baseline": None,
        "parity": parity,
    }
    if cfg.baseline == "naive":
        base_dir = naive_baseline(tok_dir, cfg.baseline_dir)
        base = load_tokenizer(base_dir)
        report["baseline"] = {
            "kind": "naive",
            "tokenizer_dir": str(base_dir),
            "vocab_size": base.get_vocab_size(),
            "tokenizer_sha256": tokenizer_sha256(base_dir),
            "languages": measure_languages(base, docs),
        }
    elif cfg.compare_dir:
        other_dir = tokenizer_folder(cfg.compare_dir)
        other = load_any_tokenizer(other_dir)
        report["baseline"] = {
            "kind": "compare",
            "tokenizer_dir": str(other_dir),
            "vocab_size": other.get_vocab_size(),
            "tokenizer_sha256": tokenizer_sha256(other_dir),
            "languages": measure_languages(other, docs),
        }
    record = FertilityReport.from_dict(report, report_path)
    record.write(report_path)
    return record


def format_table(report: FertilityReport) -> str:
    """The audit as a fixed-width text table (ours, and the baseline's figures beside them)."""
    base = report.baseline.languages if report.baseline is not None else {}
    head = (
        f"{'lang':<5} {'chars/tok':>9} {'ceiling':>7} {'bytes/tok':>9} {'tok/word':>8} {'in-clust%':>9} {'bytefb%':>8} "
        f"{'tok/char share':>14} {'lossless':>8}"
    )
    label = "naive" if report.baseline is not None and report.baseline.kind == "naive" else "other"
    if base:
        head += f" | {label + ' c/t':>9} {label + ' t/w':>9} {label + ' in%':>9} {label + ' share':>11}"
    lines = [f"tokenizer {report.tokenizer_sha256[:12]} (vocab {report.vocab_size})"]
    if report.baseline is not None and label == "other":
        b = report.baseline
        lines.append(f"other: {b.tokenizer_dir} {(b.tokenizer_sha256 or '')[:12]} (vocab {b.vocab_size})")
    if report.heldout_files:
        lines.append(format_heldout_files(report.heldout_files))
    lines += [head, "-" * len(head)]
    nan = float("nan")

    def num(value: float | None) -> float:
        return nan if value is None else float(value)

    for lang, m in report.languages.items():
        line = (
            f"{lang:<5} {num(m.chars_per_token):>9.3f} {num(m.chars_per_pretoken):>7.3f} "
            f"{num(m.bytes_per_token):>9.3f} {num(m.tokens_per_word):>8.3f} "
            f"{100 * num(m.inside_cluster_share):>9.2f} {100 * num(m.byte_fallback_share):>8.3f} "
            f"{num(m.token_share_over_char_share):>14.3f} {str(m.lossless):>8}"
        )
        if lang in base:
            bl = base[lang]
            line += (
                f" | {num(bl.chars_per_token):>9.3f} {num(bl.tokens_per_word):>9.3f} "
                f"{100 * num(bl.inside_cluster_share):>9.2f} {num(bl.token_share_over_char_share):>11.3f}"
            )
        lines.append(line)
    lines.append(
        "ceiling: characters per pre-token, the most chars/token any vocabulary behind this pre-tokenizer reaches"
    )
    if report.parity:
        lines.append(format_parity(report.parity))
    gate = report.gate
    if gate.min_chars_per_token or report.parity:
        # the failures themselves are the command's one error line (StageFailed), not repeated here
        lines.append("gate: " + ("PASSED" if gate.passed else "FAILED"))
    return "\n".join(lines)


def check_gate(
    tokenizer_dir: str | os.PathLike, *, force: bool = False, require_audit: bool = False
) -> FertilityReport | None:
    """Refuse a tokenizer whose fertility audit failed (``prodip train`` calls this).

    Args:
        tokenizer_dir: the tokenizer dir the run uses.
        force: log a warning instead of raising when the audit failed.
        require_audit: also refuse a tokenizer that was never audited.

    Returns:
        the fertility report (``gate.passed`` false only when forced), or None when there is none (and
        ``require_audit`` is false).

    Raises:
        ValueError: the audit's gate failed (message names language, figure and threshold), the
            fertility.json belongs to a different tokenizer.json, or no audit while ``require_audit``.
    """
    path = Path(tokenizer_dir) / FERTILITY_NAME
    fix = f"run `prodip tokenizer audit --tokenizer-dir {tokenizer_dir}`"
    if not path.is_file():
        if require_audit:
            raise InvalidInput(f"{path}: tokenizer was never audited; {fix}")
        log.warning("%s: tokenizer not audited (no fertility gate applied)", tokenizer_dir)
        return None
    report = read_fertility(tokenizer_dir)
    if report.tokenizer_sha256 != tokenizer_sha256(tokenizer_dir):
        raise InvalidInput(f"{path}: audits a different tokenizer.json (stale audit); {fix}")
    if not report.gate.passed:
        message = f"{tokenizer_dir}: tokenizer failed its fertility audit: " + "; ".join(report.gate.failures)
        if not force:
            raise InvalidInput(
                message + " (retrain the tokenizer, or pass --force ([train] force = true) to train anyway)"
            )
        log.warning("%s (forced)", message)
    return report
