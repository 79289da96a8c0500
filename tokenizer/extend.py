"""Extend a base model's byte-level BPE with new tokens for a language (``prodip tokenizer extend``).

A base trained mostly on English gives Bangla about one token per UTF-8 byte (1.0-1.5 characters per
token). Extension learns new merges on the user's corpus *as the base tokenizes it* and appends them:

1. Each document of ``[extend] inputs`` is encoded by the base tokenizer (its own normaliser and
   pre-tokenizer, ``add_special_tokens=False``); the tokens of each pre-token (``Encoding.word_ids``)
   form one word of base tokens.
2. HF ``tokenizers``' ``BpeTrainer`` learns merges on those words, each base token written as one
   private-use character, so every pair it merges is a pair the base's own encoding leaves adjacent:
   BPE training continued from the base's state (the base's merges all rank before the new ones, so
   the extended tokenizer first encodes exactly as the base does, then applies the new merges).
3. The new merges are appended in the trainer's order, each one whose two parts are tokens of the
   extended vocabulary and whose result is not (a result the base already has is left out); a new
   token that its own merges do not rebuild (llama.cpp encodes an in-vocabulary pre-token as one token,
   ``ignore_merges``) is dropped with every token built from it. New ids start after the whole base
   vocabulary, added and special tokens included, so **every base id and its decoding is unchanged**.
4. The model's ``embed_tokens`` and ``lm_head`` (tied or not) grow to the new ``vocab_size``; a new
   row is the mean of the base's rows of the pieces the base tokenizer splits the new token into (the
   FVT initialisation, Gee et al. 2022, "Fast Vocabulary Transfer"); rows a padded base
   ``vocab_size`` already had beyond the tokenizer are reused for the first new ids. numpy +
   safetensors, bf16 through ``ml_dtypes`` (round to nearest even), no torch.
5. The held-out text is audited before and after (tokenizer/audit.py: chars/token per language) with
   the same gate as ``prodip tokenizer audit`` and the runtime parity check (tokenizer/parity.py), and
   ``extension.json`` records what was added. The extended tokenizer's audit is also written as
   ``OUT/fertility.json`` (the base as its ``compare`` baseline), the record ``prodip train`` checks the
   gate and tokenizer sha256 of. The folder is written to ``OUT.tmp`` and renamed only when the gate
   passes; a failed gate writes nothing.
6. Files of the base that describe its tokenizer or weights as they were are not copied stale: its
   ``fertility.json`` (replaced by the extension's own audit, or left out without held-out text), its
   slow-tokenizer ``vocab.json``/``merges.txt`` (rewritten from the extended vocabulary and merges), and
   any file that names the sha256 of the base's tokenizer.json, config.json or a rewritten weights file
   (an export's manifest.json, a conformance report); weights in other formats are left out too.

    prodip tokenizer extend BASE_HF_FOLDER --inputs bn=data/bn --new-tokens 4000 --out runs/extended \
        --heldout bn=data/heldout/udhr_ben.txt,en=data/heldout/udhr_eng.txt --min-chars-per-token bn=2.5
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
import unicodedata
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.files import check_safetensors_size, file_sha256
from prodip.base.jsontypes import JSONObject
from prodip.base.records import check_replaceable_dir
from prodip.tokenizer.audit import (
    format_heldout_files,
    gate_failures,
    load_heldout,
    measure_languages,
    parity_failures,
    parity_texts,
)
from prodip.tokenizer.config import AuditConfig, ExtendConfig
from prodip.tokenizer.corpus import expand_inputs, iter_language
from prodip.tokenizer.parity import format_parity, run_parity
from prodip.tokenizer.records import FERTILITY_NAME, FertilityReport
from prodip.tokenizer.records import FORMAT_VERSION as AUDIT_FORMAT_VERSION

log = logging.getLogger(__name__)

RECORD_FILE = "extension.json"
FORMAT_VERSION = 1
#: First code point of the private-use characters that stand for base tokens while training
#: (Supplementary Private Use Area-A: 65,534 code points, none of them whitespace).
_PUA = 0xF0000
_PUA_SIZE = 65534
#: The files the extension writes itself (or leaves out: fertility.json without held-out text; vocab.json and
#: merges.txt only where the base has them); every other file of the base folder is copied unless stale.
_REWRITTEN = (
    "tokenizer.json",
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    RECORD_FILE,
    FERTILITY_NAME,
    "vocab.json",
    "merges.txt",
)
#: Files larger than this are not searched for the base's sha256s (weights, not records).
_RECORD_MAX_BYTES = 16 << 20
#: Weights in other formats hold the base's vocabulary size: left out, not copied stale.
_STALE_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx", ".onnx_data")


# ----------------------------------------------------------------------------------------- the base


def base_tokenizer_path(base: str | os.PathLike) -> Path:
    """The base's ``tokenizer.json``: ``base`` itself or ``base/tokenizer.json``.

    Raises:
        MissingInput: neither exists.
    """
    path = Path(base)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise MissingInput(
            f"{path}: not found; the base is a Hugging Face folder with a tokenizer.json (fast tokenizer)"
        )
    return path


def read_base(path: Path) -> dict[str, Any]:
    """The base ``tokenizer.json`` as a dict, checked to be a byte-level BPE.

    Raises:
        InvalidInput: not JSON, not BPE, byte-fallback (SentencePiece-style) or no ByteLevel decoder.
    """
    try:
        tok_json = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidInput(f"{path}: not valid JSON ({err})") from None
    model = tok_json.get("model") or {}
    decoder = json.dumps(tok_json.get("decoder"))
    if model.get("type") != "BPE" or model.get("byte_fallback") or "ByteLevel" not in decoder:
        raise InvalidInput(
            f"{path}: model {model.get('type')!r} (byte_fallback {model.get('byte_fallback')}), decoder "
            f"{(tok_json.get('decoder') or {}).get('type')!r}: only a byte-level BPE (GPT-2/Llama-3/Qwen2 style) "
            "can be extended"
        )
    return tok_json


def _merge_pair(m: Any) -> tuple[str, str]:
    return tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1])  # type: ignore[return-value]


def all_ids(tok_json: dict[str, Any]) -> dict[str, int]:
    """Token -> id of the model vocabulary and the added tokens together."""
    ids = dict(tok_json["model"]["vocab"])
    ids.update({a["content"]: a["id"] for a in tok_json.get("added_tokens", [])})
    return ids


# ------------------------------------------------------------------------------------------ training


def base_words(base: Tokenizer, docs: Iterator[str], skip_ids: set[int], batch: int = 256) -> Iterator[list[list[int]]]:
    """Per batch of documents (NFC), the base's ids of each pre-token (lists of ids).

    Pre-tokens holding an id of ``skip_ids`` (added/special tokens found in the text) are left out.
    """

    def flush(chunk: list[str]) -> list[list[int]]:
        words: list[list[int]] = []
        for enc in base.encode_batch(chunk, add_special_tokens=False):
            current: list[int] = []
            last: int | None = None
            for i, w in zip(enc.ids, enc.word_ids):
                if w != last and current:
                    words.append(current)
                    current = []
                current.append(i)
                last = w
            if current:
                words.append(current)
        return [w for w in words if len(w) > 1 and not skip_ids.intersection(w)]

    chunk: list[str] = []
    for doc in docs:
        chunk.append(unicodedata.normalize("NFC", doc))
        if len(chunk) == batch:
            yield flush(chunk)
            chunk = []
    if chunk:
        yield flush(chunk)


def learn_merges(
    base: Tokenizer, docs: Iterator[str], *, n_merges: int, min_frequency: int, skip_ids: set[int]
) -> tuple[list[tuple[list[int], list[int]]], int]:
    """BPE training continued from the base's segmentation (HF ``BpeTrainer``).

    Each base id that occurs is written as one private-use character; the trainer then only merges
    pairs of base tokens (or of tokens it built) that the base's encoding leaves side by side.

    Returns:
        ``(merges, words)``: the trainer's merges in order, each as the base-id sequences of its two
        parts; the number of pre-token occurrences trained on.

    Raises:
        InvalidInput: more distinct base tokens than private-use characters (65,534), or no text.
    """
    char_of: dict[int, str] = {}
    lines: list[str] = []
    n_words = 0
    for words in base_words(base, docs, skip_ids):
        out = []
        for w in words:
            for i in w:
                if i not in char_of:
                    if len(char_of) >= _PUA_SIZE:
                        raise InvalidInput(f"the corpus uses more than {_PUA_SIZE} distinct base tokens")
                    char_of[i] = chr(_PUA + len(char_of))
            out.append("".join(char_of[i] for i in w))
        n_words += len(out)
        lines.append(" ".join(out))
    if not n_words:
        raise InvalidInput("[extend] inputs: no text the base splits into more than one token per word")
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=len(char_of) + n_merges,
        min_frequency=min_frequency,
        initial_alphabet=list(char_of.values()),
        limit_alphabet=len(char_of),
        show_progress=False,
    )
    trainer_tok.train_from_iterator(lines, trainer=trainer)
    id_of = {c: i for i, c in char_of.items()}
    merges = json.loads(trainer_tok.to_str())["model"]["merges"]
    return [
        tuple([id_of[c] for c in part] for part in _merge_pair(m))  # type: ignore[misc]
        for m in merges
    ], n_words


def extend_tokenizer_json(
    tok_json: dict[str, Any], merges: list[tuple[list[int], list[int]]], n_new: int
) -> tuple[dict[str, Any], list[tuple[str, int, list[int]]]]:
    """Append up to ``n_new`` of ``merges`` (base-id sequences) to a copy of ``tok_json``.

    Returns:
        ``(extended tokenizer.json dict, [(token, id, base ids it stands for)])``.
    """
    id_to_token = {i: t for t, i in tok_json["model"]["vocab"].items()}
    taken = all_ids(tok_json)
    first = max(taken.values()) + 1
    piece = lambda seq: "".join(id_to_token[i] for i in seq)  # noqa: E731 (byte-level string of base ids)
    known = set(taken)
    added: list[tuple[str, int, list[int]]] = []
    new_merges: list[tuple[str, str]] = []
    for left, right in merges:
        a, b = piece(left), piece(right)
        if a not in known or b not in known or (a + b) in known:
            continue
        known.add(a + b)
        added.append((a + b, first + len(added), left + right))
        new_merges.append((a, b))
    # drop new tokens their own merges do not rebuild, and the tokens built from them, until none is left
    while True:
        vocab = dict(tok_json["model"]["vocab"])
        vocab.update({t: i for t, i, _ in added})
        all_merges = [_merge_pair(m) for m in tok_json["model"]["merges"]] + new_merges
        bpe = models.BPE(vocab=vocab, merges=all_merges, ignore_merges=False)
        bad = {t for t, i, _ in added if [x.id for x in bpe.tokenize(t)] != [i]}
        if not bad:
            break
        removed: set[str] = set()
        kept = []
        for (t, _, seq), m in zip(added, new_merges):
            if t in bad or m[0] in removed or m[1] in removed:
                removed.add(t)
            else:
                kept.append((t, seq, m))
        added = [(t, first + k, seq) for k, (t, seq, _) in enumerate(kept)]
        new_merges = [m for _, _, m in kept]
        log.info(
            "dropped %d new tokens their own merges do not rebuild (and %d built from them)",
            len(bad),
            len(removed) - len(bad),
        )
    added, new_merges = added[:n_new], new_merges[:n_new]
    out = json.loads(json.dumps(tok_json))
    # tokenizers numbers the added tokens that are not in the model's vocabulary after it (len(vocab)
    # onwards), whatever ids tokenizer.json gives them: with new ids after the added ones (Llama 3's
    # 256 specials) they would move. In the model's vocabulary at their own ids, as GPT-2's
    # <|endoftext|> is, they keep them (no merge builds them; the added vocabulary splits them out first).
    vocab = out["model"]["vocab"]
    for a in tok_json.get("added_tokens", []):
        if a["content"] not in vocab:
            vocab[a["content"]] = a["id"]
    vocab.update({t: i for t, i, _ in added})
    as_strings = bool(tok_json["model"]["merges"]) and isinstance(tok_json["model"]["merges"][0], str)
    out["model"]["merges"] += [f"{a} {b}" if as_strings else [a, b] for a, b in new_merges]
    return out, added


# ------------------------------------------------------------------------------------------- weights


def _init_rows(matrix: np.ndarray, pieces: list[list[int]]) -> np.ndarray:
    """(len(pieces), hidden) rows in ``matrix``'s dtype: the float32 mean of each piece list's rows,
    rounded to the dtype (bf16 through ml_dtypes: round to nearest even)."""
    rows = np.stack([matrix[np.asarray(p)].astype(np.float32).mean(axis=0) for p in pieces])
    return rows.astype(matrix.dtype)


def resize_matrix(matrix: np.ndarray, new_vocab: int, first_new: int, pieces: list[list[int]]) -> np.ndarray:
    """``matrix`` (vocab, hidden) grown to (``new_vocab``, hidden): rows below ``first_new`` unchanged,
    rows ``first_new .. first_new+len(pieces)`` the mean of the base rows ``pieces`` name, any other new
    row the mean of all base rows.

    Raises:
        InvalidInput: ``matrix`` has fewer rows than the tokenizer's base vocabulary (``first_new``).
    """
    if matrix.shape[0] < first_new:
        raise InvalidInput(f"an embedding of {matrix.shape[0]} rows is smaller than the tokenizer's {first_new} ids")
    out = np.empty((new_vocab, matrix.shape[1]), dtype=matrix.dtype)
    out[: matrix.shape[0]] = matrix[: min(matrix.shape[0], new_vocab)]
    if matrix.shape[0] < new_vocab:
        out[matrix.shape[0] :] = matrix[:first_new].astype(np.float32).mean(axis=0).astype(matrix.dtype)
    if pieces:
        out[first_new : first_new + len(pieces)] = _init_rows(matrix, pieces)
    return out


_EMBED_KEYS = ("model.embed_tokens.weight",)
_HEAD_KEYS = ("lm_head.weight",)


def resize_model(base: Path, out: Path, first_new: int, pieces: list[list[int]]) -> dict[str, Any]:
    """Write ``out/config.json`` and the safetensors with ``embed_tokens``/``lm_head`` resized.

    Returns:
        ``{vocab_size_before, vocab_size, tied, dtype, files: [names rewritten], shards: [every weights file]}``.

    Raises:
        MissingInput: no config.json or weights. InvalidInput: no ``model.embed_tokens.weight``; a
            weights file truncated or tampered (:func:`prodip.base.files.check_safetensors_size`).
    """
    from safetensors import safe_open  # noqa: PLC0415 (the train extra)
    from safetensors.numpy import load_file, save_file  # noqa: PLC0415 (bf16 through ml_dtypes)

    cfg_path = base / "config.json"
    if not cfg_path.is_file():
        raise MissingInput(f"{cfg_path}: not found; the base folder needs its config.json to resize the model")
    config = json.loads(cfg_path.read_text(encoding="utf-8"))
    before = int(config["vocab_size"])
    new_vocab = max(before, first_new + len(pieces))
    index_path = base / "model.safetensors.index.json"
    if index_path.is_file():
        index = json.loads(index_path.read_text(encoding="utf-8"))
        weight_map: dict[str, str] = index["weight_map"]
    elif (base / "model.safetensors").is_file():
        index, weight_map = None, {}
        check_safetensors_size(base / "model.safetensors")  # before safe_open, which names no file
        with safe_open(str(base / "model.safetensors"), framework="numpy") as f:
            weight_map = {k: "model.safetensors" for k in f.keys()}
    else:
        raise MissingInput(f"{base}: no model.safetensors or model.safetensors.index.json")
    for name in sorted(set(weight_map.values())) if index is not None else []:
        check_safetensors_size(base / name)  # a named error instead of "file not fully covered"
    embed = next((k for k in _EMBED_KEYS if k in weight_map), None)
    if embed is None:
        raise InvalidInput(f"{base}: no tensor {_EMBED_KEYS[0]} in the weights")
    head = next((k for k in _HEAD_KEYS if k in weight_map), None)
    written, dtype, delta = [], "", 0
    for name in sorted({weight_map[embed]} | ({weight_map[head]} if head else set())):
        with safe_open(str(base / name), framework="numpy") as f:
            metadata = f.metadata()
        tensors = load_file(str(base / name))
        for key in (embed, head):
            if key and weight_map[key] == name:
                old = tensors[key]
                tensors[key] = resize_matrix(old, new_vocab, first_new, pieces)
                dtype = str(old.dtype)
                delta += tensors[key].nbytes - old.nbytes
        save_file(tensors, str(out / name), metadata=metadata)
        written.append(name)
    for name in sorted(set(weight_map.values()) - set(written)):
        shutil.copyfile(base / name, out / name)
    if index is not None:
        index = json.loads(json.dumps(index))
        if "total_size" in index.get("metadata", {}):
            index["metadata"]["total_size"] += delta
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    config["vocab_size"] = new_vocab
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return {
        "vocab_size_before": before,
        "vocab_size": new_vocab,
        "tied": head is None,
        "dtype": dtype,
        "files": written,
        "shards": sorted(set(weight_map.values())),
    }


# --------------------------------------------------------------------------------------------- stage


def _docs(inputs: dict[str, list[str]], cfg: ExtendConfig) -> Iterator[str]:
    files = expand_inputs(inputs, what="[extend] inputs (--inputs)")
    for lang, lang_files in files.items():
        size = 0
        for _, _, doc in iter_language(lang_files, lang, errors=cfg.errors, doc_chars=4000, text_field=cfg.text_field):
            yield doc[: cfg.max_chars - size]
            size += min(len(doc), cfg.max_chars - size)
            if size >= cfg.max_chars:
                break


def default_out(base: str) -> Path:
    """``BASE-extended`` beside the base folder (or beside the tokenizer.json's folder)."""
    path = Path(base)
    folder = path if path.is_dir() else path.parent
    return folder.with_name(folder.name + "-extended")


def check_out(out: Path, base_dir: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` the extension must not replace, before any work (nothing is touched).

    The rules of ``prodip export --force`` (:func:`prodip.export.core.check_out_dir`) and of every
    replaced artifact folder (:func:`prodip.base.records.check_replaceable_dir`): ``--out`` may be a
    missing or empty folder; ``--overwrite`` replaces only what an earlier extension wrote (a folder with
    ``extension.json``, whose fertility.json no newer prodip wrote); a symbolic link or a file is refused. And neither ``--out`` nor its build folder
    ``OUT.tmp`` (deleted first) may be the base or a folder holding it, compared as resolved paths (a
    symbolic link to the base, ``--out ..``): replacing it would delete the base being extended.

    Raises:
        InvalidInput: ``--out`` or ``OUT.tmp`` is the base or contains it.
        OutputExists: ``--out`` is a link, a file, an earlier extension without ``overwrite``, or a non-empty
            folder ``prodip tokenizer extend`` did not write (no extension.json).
    """
    base_real = base_dir.resolve()
    for path, what in ((out, "--out"), (out.with_name(out.name + ".tmp"), "its build folder")):
        real = path.resolve()
        if real == base_real or real in base_real.parents:
            where = "is the base folder" if real == base_real else "contains the base folder"
            raise InvalidInput(
                f"--out {out}: {what} {path} {where} {base_dir} being extended; replacing it would delete the "
                "base. Choose another --out"
            )
    check_replaceable_dir(
        out,
        what="tokenizer extension",
        marker=RECORD_FILE,
        records=(FertilityReport,),
        replace=overwrite,
        option="--overwrite true",
        instead="choose another --out",
    )


def _names_a_sha(path: Path, digests: set[str]) -> bool:
    """Whether the (small) file ``path`` contains one of the hex ``digests`` (a record of the base's files)."""
    if path.stat().st_size > _RECORD_MAX_BYTES:
        return False
    data = path.read_bytes()
    return any(d.encode("ascii") in data for d in digests)


def copy_base_files(base_dir: Path, tmp: Path, shards: list[str], base_digests: set[str]) -> list[str]:
    """Copy the base's files the extension does not rewrite into ``tmp``, leaving out the stale ones.

    Left out (each logged): :data:`_REWRITTEN` names, the weights shards (written by :func:`resize_model`),
    weights in other formats (:data:`_STALE_WEIGHTS`: the base's vocabulary size), and any file of at most
    :data:`_RECORD_MAX_BYTES` that names one of ``base_digests`` (sha256 of the base's tokenizer.json,
    config.json and rewritten weights: a record of the base as it was, e.g. an export's manifest.json).

    Returns:
        the names left out as stale (not those rewritten).
    """
    stale = []
    for f in sorted(base_dir.iterdir()):
        if not f.is_file() or f.name in _REWRITTEN or f.name in shards:
            continue
        if f.name.endswith(_STALE_WEIGHTS):
            log.warning("%s: not copied (weights of the base's vocabulary size; the safetensors are resized)", f)
        elif _names_a_sha(f, base_digests):
            log.warning("%s: not copied (it names the sha256 of a base file the extension rewrites)", f)
        else:
            shutil.copyfile(f, tmp / f.name)
            continue
        stale.append(f.name)
    return stale


def write_audit(
    tmp: Path,
    cfg: ExtendConfig,
    base_dir: Path,
    figures: tuple[dict[str, dict], dict[str, dict]],
    vocab_sizes: tuple[int, int],
    record: JSONObject,
) -> None:
    """Write the extended tokenizer's ``fertility.json`` (:class:`FertilityReport`) into ``tmp``.

    The figures are the extension's own held-out audit: ``languages`` the extended tokenizer's, the
    ``baseline`` (kind ``compare``) the base's, ``gate`` and ``parity`` those of ``record``; ``config`` is
    the :class:`AuditConfig` of the ``prodip tokenizer audit`` that measures the same (on ``--out``, the
    base as ``--compare-dir``). ``figures``: (base, extended) :func:`measure_languages` on the held-out
    text; ``vocab_sizes``: (base, extended) ``get_vocab_size()``. This is the record :func:`prodip.tokenizer.audit.check_gate` reads when
    ``prodip train`` takes the folder: its ``tokenizer_sha256`` is the extended tokenizer.json's.
    """
    audit_cfg = AuditConfig(
        tokenizer_dir=str(cfg.out or default_out(cfg.base)),
        compare_dir=str(base_dir),
        heldout={k: list(v) for k, v in cfg.heldout.items()},
        min_chars_per_token=dict(cfg.min_chars_per_token),
        max_chars=cfg.heldout_max_chars,
        parity=cfg.parity,
        parity_max_chars=cfg.heldout_max_chars,
        errors=cfg.errors,
        text_field=cfg.text_field,
    )
    report = {
        "format_version": AUDIT_FORMAT_VERSION,
        "tokenizer_sha256": record["tokenizer_sha256"],
        "vocab_size": vocab_sizes[1],
        "created_utc": record["created_utc"],
        "config": dataclasses.asdict(audit_cfg),
        "heldout_files": record["heldout_files"],
        "languages": figures[1],
        "gate": record["gate"],
        "baseline": {
            "kind": "compare",
            "tokenizer_dir": str(base_dir),
            "vocab_size": vocab_sizes[0],
            "tokenizer_sha256": record["base_tokenizer_sha256"],
            "languages": figures[0],
        },
        "parity": record["parity"],
    }
    path = tmp / FERTILITY_NAME
    FertilityReport.from_dict(report, path).write(path)


def extend(cfg: ExtendConfig) -> dict[str, Any]:
    """Run the extension (module docstring) and return the record written to ``OUT/extension.json``.

    The folder is built under ``OUT.tmp`` and renamed to ``OUT`` only when the gate passes (as every
    artifact: complete, or not there). A failed gate writes nothing and leaves an earlier ``OUT`` as it
    was; the returned record (``gate.passed`` false) says why, and the caller raises.

    Raises:
        InvalidInput: no base, no inputs, a base that is not byte-level BPE, ``new_tokens`` < 1, a
            ``min_chars_per_token`` language without ``heldout`` text.
        MissingInput: missing base files or inputs. OutputExists, InvalidInput: an ``--out`` that must
            not be replaced (:func:`check_out`), checked before any work.
    """

    if not cfg.base:
        raise InvalidInput("[extend] base: no base given (prodip tokenizer extend BASE_FOLDER)")
    if not cfg.inputs:
        raise InvalidInput("[extend] inputs: no corpus to learn new tokens from (--inputs bn=data/bn)")
    if cfg.new_tokens < 1:
        raise InvalidInput(f"[extend] new_tokens: {cfg.new_tokens}, expected at least 1")
    unmeasured = sorted(set(cfg.min_chars_per_token) - set(cfg.heldout))
    if unmeasured:  # a minimum with no text to measure it on would pass unchecked
        raise InvalidInput(
            f"[extend] min_chars_per_token: {', '.join(unmeasured)} has a minimum but no held-out text to measure "
            f"it on; add [extend] heldout (--heldout {unmeasured[0]}=FILE) or drop the minimum"
        )
    started = time.time()
    tok_path = base_tokenizer_path(cfg.base)
    base_dir = tok_path.parent
    out = Path(cfg.out) if cfg.out else default_out(cfg.base)
    check_out(out, base_dir, cfg.overwrite)
    tok_json = read_base(tok_path)
    base = Tokenizer.from_file(str(tok_path))
    skip = {a["id"] for a in tok_json.get("added_tokens", [])}
    heldout_files: dict[str, list[str]] = {}
    heldout = (
        load_heldout(
            cfg.heldout,
            max_chars=cfg.heldout_max_chars,
            errors=cfg.errors,
            text_field=cfg.text_field,
            read_files=heldout_files,
        )
        if cfg.heldout
        else {}
    )
    trained_files = {os.path.realpath(f) for fs in expand_inputs(cfg.inputs).values() for f in fs}
    for lang, paths in expand_inputs(cfg.heldout, what="[extend] heldout").items() if cfg.heldout else ():
        for p in paths:
            if os.path.realpath(p) in trained_files:
                raise InvalidInput(f"heldout.{lang}: {p} is also in [extend] inputs; audit on text it never saw")
    # a margin over new_tokens: some merges are left out (their result is a base token, or not rebuilt)
    merges, n_words = learn_merges(
        base,
        _docs(cfg.inputs, cfg),
        n_merges=cfg.new_tokens + cfg.new_tokens // 4 + 16,
        min_frequency=cfg.min_frequency,
        skip_ids=skip,
    )
    ext_json, added = extend_tokenizer_json(tok_json, merges, cfg.new_tokens)
    if not added:
        raise InvalidInput(
            f"[extend] inputs: no merge occurs {cfg.min_frequency} times that the base lacks; add text or lower min_frequency"
        )
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        (tmp / "tokenizer.json").write_text(json.dumps(ext_json, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        ext = Tokenizer.from_file(str(tmp / "tokenizer.json"))  # the library reads it back, or this fails here
        if any((base_dir / n).is_file() for n in ("vocab.json", "merges.txt")):
            ext.model.save(str(tmp))  # the slow tokenizer's vocab.json + merges.txt, of the extended BPE
        model, stale = None, []
        base_digests = {file_sha256(tok_path)}
        if (base_dir / "config.json").is_file() and tok_path.name == "tokenizer.json" and Path(cfg.base).is_dir():
            model = resize_model(base_dir, tmp, added[0][1], [seq for _, _, seq in added])
            base_digests |= {file_sha256(base_dir / n) for n in ("config.json", *model["files"])}
            stale = copy_base_files(base_dir, tmp, model["shards"], base_digests)
        record: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "config": dataclasses.asdict(cfg),
            "base": str(cfg.base),
            "base_tokenizer_sha256": file_sha256(tok_path),
            "tokenizer_sha256": file_sha256(tmp / "tokenizer.json"),
            "base_vocab": len(all_ids(tok_json)),
            "added_tokens": len(added),
            "added_merges": len(added),
            "first_new_id": added[0][1],
            "vocab": len(all_ids(ext_json)),
            "trained_words": n_words,
            "init": "mean of the base rows of the pieces the base tokenizer splits each new token into",
            "model": model,
            "left_out": stale,
            "weights_sha256": {},
            "heldout_files": heldout_files,
            "fertility": None,
            "gate": None,
            "parity": None,
            "examples": [ext.decode([i]) for _, i, _ in added[:20]],
        }
        if model is not None:
            names = set(model["files"])
            record["weights_sha256"] = {
                n: {"base": file_sha256(base_dir / n), "extended": file_sha256(tmp / n)} for n in sorted(names)
            }
        failures: list[str] = []
        if heldout:
            before = measure_languages(base, heldout)
            after = measure_languages(ext, heldout)
            ceiling = {lang: after[lang]["chars_per_pretoken"] for lang in heldout}
            record["fertility"] = {
                lang: {
                    "chars_per_token_before": before[lang]["chars_per_token"],
                    "chars_per_token_after": after[lang]["chars_per_token"],
                    "tokens_before": before[lang]["tokens"],
                    "tokens_after": after[lang]["tokens"],
                    "chars": after[lang]["chars"],
                    "chars_per_pretoken": ceiling[lang],
                    "lossless": after[lang]["lossless"],
                }
                for lang in heldout
            }
            # a minimum above the pre-tokenizer's ceiling: no number of new tokens reaches it, say so instead
            capped = {k: m for k, m in cfg.min_chars_per_token.items() if k in ceiling and ceiling[k] < m}
            failures = gate_failures(
                after,
                {k: m for k, m in cfg.min_chars_per_token.items() if k not in capped},
                None,
                ext.get_vocab_size(),
                origin="extended",
            )
            failures += [
                f"{k}: {after[k]['chars_per_token']:.3f} chars/token is below the minimum {m} (fertility gate), and "
                f"no vocabulary reaches it: the base's pre-tokenizer cuts {k} into pieces of {ceiling[k]:.3f} "
                f"characters on average; lower [extend] min_chars_per_token.{k} or start from a base whose "
                f"pre-tokenizer keeps {k} words whole"
                for k, m in capped.items()
            ]
            if cfg.parity != "off":
                record["parity"] = run_parity(
                    tmp, parity_texts(heldout, cfg.heldout_max_chars), require=cfg.parity == "require"
                )
                failures += parity_failures(record["parity"])
        record["gate"] = {
            "min_chars_per_token": dict(cfg.min_chars_per_token),
            "passed": not failures,
            "failures": failures,
        }
        record["seconds"] = round(time.time() - started, 1)
        if failures:  # a rejected extension is not left where `data prepare`/`train` would take it
            shutil.rmtree(tmp)
        else:
            if heldout:
                write_audit(tmp, cfg, base_dir, (before, after), (base.get_vocab_size(), ext.get_vocab_size()), record)
            (tmp / RECORD_FILE).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    record["out"] = str(out)
    return record


def format_record(record: dict[str, Any]) -> str:
    """The extension as text: what was added, fertility before/after per language, the gate."""
    lines = [
        f"extended {record['base']} -> {record.get('out', '')}"
        f"{'' if record['gate']['passed'] else ' (not written: the gate failed)'}: +{record['added_tokens']} tokens "
        f"(ids {record['first_new_id']}..{record['first_new_id'] + record['added_tokens'] - 1}), "
        f"vocab {record['base_vocab']} -> {record['vocab']}"
    ]
    if record.get("model"):
        m = record["model"]
        lines.append(
            f"model: vocab_size {m['vocab_size_before']} -> {m['vocab_size']}, "
            f"{'tied' if m['tied'] else 'untied'} embeddings ({m['dtype']}), new rows = mean of their base pieces"
        )
    if record.get("fertility"):
        lines.append(format_heldout_files(record.get("heldout_files") or {}))
        lines.append(
            f"{'lang':<5} {'chars/tok before':>16} {'after':>8} {'ceiling':>8} {'tokens before':>14} {'after':>8}"
        )
        for lang, f in record["fertility"].items():
            lines.append(
                f"{lang:<5} {f['chars_per_token_before']:>16.3f} {f['chars_per_token_after']:>8.3f} "
                f"{f['chars_per_pretoken']:>8.3f} {f['tokens_before']:>14,} {f['tokens_after']:>8,}"
            )
        lines.append(
            "ceiling: characters per pre-token of the base's pre-tokenizer, which no vocabulary behind it exceeds"
        )
    if record.get("parity"):
        lines.append(format_parity(record["parity"]))
    gate = record["gate"]
    # the failures themselves are the command's one error line (StageFailed), not repeated here
    lines.append("gate: " + ("PASSED" if gate["passed"] else "FAILED"))
    return "\n".join(lines)
