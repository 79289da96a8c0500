"""ONNX Runtime decoder over an export dir: token ids in, logits and KV cache out (no HTTP).

:func:`load_export` reads and checks an export dir (manifest, conformance verdict, file hashes,
config.json, tokenizer.json); :class:`OnnxDecoder` runs one forward step of the exported graph
with the I/O of :mod:`prodip.base.onnx_io`: ``input_ids``, ``attention_mask``,
``position_ids``, ``past_key_values.{i}.key|value`` -> ``logits``, ``present.{i}.key|value``.
This module imports neither torch nor ``train/``.

    python -c "from prodip.serve.engine import load_export; print(load_export('EXPORT_DIR', 'fp32').onnx_path)"
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer

from prodip.base import onnx_io
from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.files import file_sha256
from prodip.base.jsontypes import JSONObject
from prodip.base.manifest import (
    MANIFEST_FILE,
    ExportManifest,
    VariantCheck,
    VariantEntry,
    files_table_sha256,
    load_manifest,
)

log = logging.getLogger(__name__)
_MAKE = "`prodip export CHECKPOINT --out EXPORT_DIR`"


@dataclass(frozen=True)
class ModelShape:
    """The keys of an export's ``config.json`` (Hugging Face ``LlamaConfig`` names) serve reads."""

    num_hidden_layers: int
    num_key_value_heads: int
    #: the context window (tokens)
    max_position_embeddings: int
    vocab_size: int
    #: ``head_dim``, or ``hidden_size // num_attention_heads`` when the config has none
    head_dim: int
    eos_token_id: int = 2
    bos_token_id: int = 1
    pad_token_id: int = 0

    @classmethod
    def from_json(cls, config: JSONObject, where: str) -> ModelShape:
        """Read the shape from a parsed ``config.json`` (``where``: its path, for errors).

        Raises:
            InvalidInput: a needed key missing, or a value that is not an integer (the key named).
        """

        def key(name: str, default: int | None = None) -> int:
            if name not in config and default is None:
                raise InvalidInput(f"{where}: missing {name!r}; re-run {_MAKE}")
            value = config.get(name, default)
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidInput(f"{where}: {name} must be an integer, got {value!r}; re-run {_MAKE}")
            return value

        head_dim = config.get("head_dim")
        return cls(
            num_hidden_layers=key("num_hidden_layers"),
            num_key_value_heads=key("num_key_value_heads"),
            max_position_embeddings=key("max_position_embeddings"),
            vocab_size=key("vocab_size"),
            # a config without head_dim (LlamaConfig's default): the hidden size split over the heads
            head_dim=key("head_dim") if head_dim else key("hidden_size") // key("num_attention_heads"),
            eos_token_id=key("eos_token_id", 2),
            bos_token_id=key("bos_token_id", 1),
            pad_token_id=key("pad_token_id", 0),
        )


@dataclass
class ExportInfo:
    """What serve needs from an export dir (paths resolved, verdict checked)."""

    export_dir: Path
    variant: str
    onnx_path: Path
    config: ModelShape
    manifest: ExportManifest
    tokenizer_path: Path
    tokenizer_sha256: str
    verified: bool
    warnings: list[str] = field(default_factory=list)
    #: bounds of the tolerance file the variant's verdict was made with that are looser than the
    #: shipped conformance/tolerances.toml: ``[{table, metric, shipped, used}]`` (empty: none)
    loosened_tolerances: list[JSONObject] = field(default_factory=list)
    #: the variant's shared-buffer graph (manifest ``genai_path``: the same weights, the KV cache
    #: written in place), or None (a standard-operator export has none)
    shared_buffer_path: Optional[Path] = None

    @property
    def max_model_len(self) -> int:
        """Context window (tokens): config.json ``max_position_embeddings``."""
        return self.config.max_position_embeddings


def _read_json(path: Path) -> JSONObject:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingInput(f"{path}: missing; an export dir is written by {_MAKE}") from None
    except json.JSONDecodeError as err:
        raise InvalidInput(f"{path}: not valid JSON ({err}); re-run {_MAKE}") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{path}: a JSON {type(value).__name__}, not an object; re-run {_MAKE}")
    return value


def conformance_check(manifest: ExportManifest, variant: str) -> tuple[bool, str, VariantCheck | None]:
    """Whether the manifest's conformance verdict passes ``variant`` for the export's CURRENT files.

    A variant is verified only when the verdict is complete as ``prodip.conformance.verdict.merge_verdict``
    writes it (:meth:`prodip.base.manifest.Verdict.serve_problem`: per-variant ``variants`` and ``checks``,
    ``export_files_sha256``, ``report``, ``report_sha256``, the tolerances each variant was checked with),
    the variant's own entry passed, and ``export_files_sha256`` equals the sha256 of the manifest's current
    ``files`` table (:func:`prodip.base.manifest.files_table_sha256`): a verdict does not survive a file
    being swapped.

    Returns:
        ``(ok, reason, check)``: reason is "" when ok, else a sentence naming the fix; ``check`` is the
        variant's entry of the verdict's ``checks`` (None when there is none), whose
        ``tolerances.loosened`` lists bounds looser than the shipped tolerance file.
    """
    fix = "run `prodip conformance EXPORT_DIR`"  # the refusal adds ", or pass --allow-unverified"
    verdict = manifest.conformance
    if verdict is None and manifest.conformance_problem:
        return False, f"manifest.json's conformance verdict is damaged ({manifest.conformance_problem}); {fix}", None
    if verdict is None:
        return False, f"manifest.json has no conformance verdict; {fix}", None
    problem = verdict.serve_problem(variant)
    if problem:
        return False, f"the conformance verdict in manifest.json {problem}; {fix}", None
    variants, checks = verdict.variants or {}, verdict.checks or {}
    if variant not in variants:
        return False, f"the conformance verdict does not cover variant {variant!r}; {fix}", None
    check = checks[variant]
    current = files_table_sha256(manifest.files_table())
    measured = str(verdict.export_files_sha256)
    if current != measured:
        return (
            False,
            (
                f"the export's files changed after conformance ran (files table sha256 "
                f"{current[:12]}..., the verdict measured {measured[:12]}...): {fix}"
            ),
            check,
        )
    if not variants[variant]:
        return False, f"variant {variant!r} FAILED conformance (see {check.report or verdict.report}); {fix}", check
    return True, "", check


def loosened_text(loosened: list[JSONObject]) -> str:
    """``[int8] top1 min 0.95 -> 0.02, ...`` for a list of loosened bounds."""
    return ", ".join(
        f"[{b.get('table')}] {b.get('metric')} {_bound_str(b.get('shipped'))} -> {_bound_str(b.get('used'))}"
        for b in loosened
    )


def _bound_str(bound: Any) -> str:
    if isinstance(bound, dict) and len(bound) == 1:
        ((key, value),) = bound.items()
        return f"{key} {value}"
    return str(bound)


# ---- load_export, one step per function ------------------------------------------------------------


def _read_export_manifest(root: Path) -> ExportManifest:
    """``root/manifest.json`` as a typed record (format_version and fields checked by its owner).

    Raises:
        FileNotFoundError: no export dir, or no manifest in it.
        ValueError: the manifest is not one this prodip reads (file, field or version named).
    """
    if not root.is_dir():
        raise MissingInput(f"{root}: export dir not found; it is written by {_MAKE}")
    try:
        return load_manifest(root)
    except MissingInput:
        raise MissingInput(f"{root / MANIFEST_FILE}: missing; an export dir is written by {_MAKE}") from None


def _onnx_variant(root: Path, manifest: ExportManifest, variant: str) -> VariantEntry:
    """The manifest entry of ``variant``, which must be an ONNX variant.

    Raises:
        ValueError: no such variant, or not ONNX (the export's ONNX variants named).
    """
    onnx_names = manifest.formats("onnx")
    if variant not in onnx_names:
        raise InvalidInput(
            f"{root / MANIFEST_FILE}: no ONNX variant {variant!r}; this export has {', '.join(onnx_names) or 'none'}"
        )
    return manifest.variants[variant]


def _verification(
    root: Path, manifest: ExportManifest, variant: str, allow_unverified: bool
) -> tuple[bool, list[str], list[JSONObject]]:
    """Apply the conformance verdict to serving ``variant``.

    Returns:
        ``(verified, warnings, loosened)``: the warnings to show (unverified, or passed with loosened
        tolerances) and the loosened bounds of a verified variant.
    Raises:
        ValueError: not verified and not ``allow_unverified`` (the reason and the fix named).
    """
    ok, reason, check = conformance_check(manifest, variant)
    if not ok and not allow_unverified:
        raise InvalidInput(f"{root}: refusing to serve: {reason}, or pass --allow-unverified")
    if not ok:  # --allow-unverified was passed: the warning names the fix, not that flag again
        return False, [f"serving unverified variant {variant!r} (--allow-unverified): {reason}"], []
    tol = check.tolerances if check is not None else None
    loosened = list(tol.loosened) if tol is not None else []
    if tol is None or not loosened:
        return True, [], []
    warning = (
        f"variant {variant!r} passed conformance with LOOSENED tolerances ({tol.path}, "
        f"looser than the shipped conformance/tolerances.toml): {loosened_text(loosened)}"
    )
    return True, [warning], loosened


def _served_files(root: Path, manifest: ExportManifest, entry: VariantEntry, variant: str) -> list[str]:
    """Every file serve reads, relative to ``root``, each checked to exist: the variant's graph, its
    external data and shared-buffer graph, config.json, tokenizer.json, and tokenizer_config.json and
    generation_config.json when the manifest lists them (read when present: BOS and EOS conventions).

    Raises:
        FileNotFoundError: one is missing (named).
    """
    if not (root / entry.path).is_file():
        raise MissingInput(f"{root / entry.path}: ONNX file of variant {variant!r} missing; re-run {_MAKE}")
    if entry.genai_path and not (root / entry.genai_path).is_file():
        raise MissingInput(
            f"{root / entry.genai_path}: shared-buffer graph of variant {variant!r} missing; re-run {_MAKE}"
        )
    wanted = ["config.json", "tokenizer.json", entry.path, *entry.external_data]
    wanted += [entry.genai_path] if entry.genai_path else []
    wanted += [rel for rel in ("tokenizer_config.json", "generation_config.json") if rel in manifest.files]
    for rel in wanted:
        if not (root / rel).is_file():
            raise MissingInput(f"{root / rel}: missing ({MANIFEST_FILE} lists it); re-run {_MAKE}")
    return wanted


def _verify_hashes(root: Path, manifest: ExportManifest, rels: list[str]) -> None:
    """Each of ``rels`` has the sha256 the manifest lists (hashing reads every byte once).

    Raises:
        ValueError: a file the manifest does not list, or whose sha256 differs (both named).
    """
    for rel in rels:
        listed = manifest.files.get(rel)
        if listed is None:
            raise InvalidInput(f"{root / MANIFEST_FILE}: lists no sha256 for {rel}; re-run {_MAKE}")
        got = file_sha256(root / rel)
        if got != listed.sha256:
            raise InvalidInput(
                f"{root / rel}: sha256 {got[:12]}... does not match {MANIFEST_FILE} "
                f"({listed.sha256[:12]}...); the export was modified, re-run {_MAKE}"
            )


def _read_model_config(root: Path) -> ModelShape:
    """The shape the decoder needs, from ``root/config.json``.

    Raises:
        FileNotFoundError: missing. ValueError: not a JSON object, or a needed key missing or not an
            integer (named).
    """
    return ModelShape.from_json(_read_json(root / "config.json"), str(root / "config.json"))


def _tokenizer_file(root: Path, manifest: ExportManifest) -> tuple[Path, str]:
    """``root/tokenizer.json`` and its sha256, checked against the manifest's ``tokenizer_sha256``.

    Raises:
        FileNotFoundError: missing. ValueError: its sha256 differs from the manifest's.
    """
    tok_path = root / "tokenizer.json"
    if not tok_path.is_file():
        raise MissingInput(f"{tok_path}: missing; re-run {_MAKE}")
    tok_sha = file_sha256(tok_path)
    if manifest.tokenizer_sha256 and manifest.tokenizer_sha256 != tok_sha:
        raise InvalidInput(f"{tok_path}: sha256 differs from {MANIFEST_FILE} tokenizer_sha256; re-run {_MAKE}")
    return tok_path, tok_sha


def load_export(
    export_dir: str | Path, variant: str, *, allow_unverified: bool = False, verify_hashes: bool = True
) -> ExportInfo:
    """Read and check an export dir for serving ``variant``.

    The steps, in order: read the manifest (:func:`_read_export_manifest`: format_version and fields), pick
    the ONNX variant (:func:`_onnx_variant`), apply its conformance verdict (:func:`_verification`), check
    that every file serve reads is there (:func:`_served_files`) and has the manifest's sha256
    (:func:`_verify_hashes`), read config.json (:func:`_read_model_config`) and the tokenizer's hash
    (:func:`_tokenizer_file`).

    Args:
        export_dir: dir written by ``prodip export``.
        variant: an ONNX variant of :data:`prodip.base.variants.VARIANTS` the export has.
        allow_unverified: serve even if the verdict is missing or failing (a warning is kept).
        verify_hashes: compare file hashes with the manifest (hashing reads every byte once).
    Returns:
        :class:`ExportInfo`.
    Raises:
        FileNotFoundError: the dir, manifest.json, or a file serve reads is missing (named).
        ValueError: unknown variant, wrong format_version, hash mismatch, or a missing, failing,
            incomplete or stale (files changed since) conformance verdict without ``allow_unverified``.
    """
    root = Path(export_dir)
    manifest = _read_export_manifest(root)
    entry = _onnx_variant(root, manifest, variant)
    verified, warnings, loosened = _verification(root, manifest, variant, allow_unverified)
    served = _served_files(root, manifest, entry, variant)
    if verify_hashes:
        _verify_hashes(root, manifest, served)
    config = _read_model_config(root)
    tok_path, tok_sha = _tokenizer_file(root, manifest)
    shared_path = root / entry.genai_path if entry.genai_path else None
    return ExportInfo(
        root, variant, root / entry.path, config, manifest, tok_path, tok_sha, verified, warnings, loosened, shared_path
    )


def load_tokenizer(info: ExportInfo) -> Tokenizer:
    """The export's tokenizer (its NFC normaliser included), checked against config.json vocab_size.

    Raises:
        ValueError: the tokenizer has more ids than the model's vocab_size.
    """
    tok = Tokenizer.from_file(str(info.tokenizer_path))
    if tok.get_vocab_size() > info.config.vocab_size:
        raise InvalidInput(
            f"{info.tokenizer_path}: {tok.get_vocab_size()} tokens but config.json "
            f"vocab_size is {info.config.vocab_size}; re-run {_MAKE}"
        )
    return tok


class OnnxDecoder:
    """One ONNX Runtime session of the exported decoder.

    Two graphs can run here (CONTRACTS.md). The contract graph (``shared_buffer=False``) takes a
    cache of P tokens and returns a new one of P + T (``present = past ++ new``), zeroing masked
    slots on the way. The shared-buffer graph (``shared_buffer=True``: the variant's
    ``*_genai.onnx``, :attr:`ExportInfo.shared_buffer_path`) takes caches with room for more tokens
    than they hold (B, Hkv, capacity, Dh), reads the first ``mask length - T`` slots and writes the
    T new keys and values after them, in place: no copy of the cache and no zeroing per step
    (bench/results/serve_shared_buffer_2026-11-30.md). It needs what the batch scheduler gives it:
    no padding (masks all ones), every row at the same length, positions 0, 1, ... (its rotary
    embedding numbers a prompt's rows from ``position_ids[0, 0]``).

    Args:
        onnx_path: the variant's ``.onnx`` file (or its shared-buffer graph).
        config: the export's config.json as the decoder reads it (:class:`ModelShape`).
        intra_op_threads: ONNX Runtime intra-op threads, 0 = its default.
        spinning: the intra-op threads spin while waiting for work (``session.intra_op.allow_spinning``,
            ONNX Runtime's default and onnxruntime-genai's), also for a while after a run, so the next
            decode step finds them awake (stopping them when a run returns, ``session.force_spinning_stop``,
            decoded one stream 2-7 % slower at 2 threads: bench/results/serve_engine_2026-12-01.md); no
            effect on the numbers, only on speed and CPU time.
        shared_buffer: ``onnx_path`` is a shared-buffer graph.
    Raises:
        ValueError: the graph's inputs/outputs differ from the names of :mod:`prodip.base.onnx_io`.
    """

    #: smallest cache capacity (tokens) the shared-buffer mode allocates; it doubles from there
    MIN_CAPACITY = 64
    #: most tokens a cache is reserved for at once from a request's maximum (``forward``'s ``reserve``):
    #: short answers get one allocation of their maximum; a request allowed more starts here and doubles,
    #: so a client sending a large max_tokens does not hold the whole context per row before it is used
    #: (the 0.4B model: 112 KiB per token and row, 56 MiB a row at 512)
    MAX_RESERVE = 512

    def __init__(
        self,
        onnx_path: str | Path,
        config: ModelShape,
        intra_op_threads: int = 0,
        *,
        shared_buffer: bool = False,
        spinning: bool = True,
    ) -> None:
        self.shared_buffer = shared_buffer
        self.max_positions = config.max_position_embeddings
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if intra_op_threads:
            opts.intra_op_num_threads = intra_op_threads
        if not spinning:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.past_names = onnx_io.past_names(self.num_layers)
        self.present_names = onnx_io.present_names(self.num_layers)
        want_in = set(onnx_io.io_names(self.num_layers)[0])
        have_in = {i.name for i in self.session.get_inputs()}
        have_out = {o.name for o in self.session.get_outputs()}
        if want_in != have_in or not {"logits", *self.present_names} <= have_out:
            raise InvalidInput(
                f"{onnx_path}: graph I/O {sorted(have_in)} -> {sorted(have_out)} is not the "
                f"decoder I/O of prodip.base.onnx_io for {self.num_layers} layers; re-run {_MAKE}"
            )
        self._outputs = ["logits", *self.present_names]
        logits_type = next(o.type for o in self.session.get_outputs() if o.name == "logits")
        self._logits_dtype = np.float16 if logits_type == "tensor(float16)" else np.float32
        self.vocab_size = config.vocab_size
        #: the shared-buffer graph's last decode binding, kept for the next decode step on the same caches
        self._binding: Optional[_DecodeBinding] = None
        #: what a row needs to get the same bits alone as among others (:func:`nbits_row_rule`:
        #: ONNX Runtime's MatMulNBits kernels choose their path by the call's row count):
        #: "none", "one" (a lone row runs with a twin) or "odd" (an odd row count gets a twin)
        self.row_rule = nbits_row_rule(onnx_path, intra_op_threads)

    def empty_past(self, batch: int) -> list[np.ndarray]:
        """Zero-length KV cache for prefill: 2 * layers arrays of (B, Hkv, 0, Dh) float32."""
        shape = (batch, self.num_kv_heads, 0, self.head_dim)
        return [np.zeros(shape, np.float32) for _ in self.past_names]

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[Any],
        reserve: int = 0,
    ) -> tuple[np.ndarray, list[Any]]:
        """Run the graph once.

        The KV cache stays in ONNX Runtime memory between steps (IO binding): ``present`` comes back
        as ``onnxruntime.OrtValue`` objects that can be fed straight back as ``past``, which saves
        copying the whole cache into numpy at every step (most of a step's time at batch 8).
        Use :func:`to_numpy` when the cache itself must change (rows joining or leaving).

        Args:
            input_ids: (B, T) int64.
            attention_mask: (B, P+T) int64, 0 for (left) padding.
            position_ids: (B, T) int64.
            past: 2 * layers caches (B, Hkv, P, Dh) float32 in (layer, key|value) order, each a numpy
                array or an OrtValue from a previous call.
            reserve: shared-buffer graph: the most tokens any row of this call will hold (prompt +
                max new tokens; 0: unknown). A cache that must be (re)allocated gets this capacity when it
                is at most :attr:`MAX_RESERVE` (allocated once, as onnxruntime-genai allocates
                ``max_length``); else it doubles from :attr:`MAX_RESERVE`, never past ``reserve``.
        Returns:
            logits (B, T, V) float32 numpy and present, 2 * layers OrtValues (B', Hkv, P+T, Dh) float32
            (shared-buffer graph: (B', Hkv, capacity >= P+T, Dh), the first P+T slots valid). B' = B,
            or B + 1 when :attr:`row_rule` gave the call a twin row (a copy of the last row, computed
            alongside it): feed ``present`` back as ``past`` as it is, rows ``[:B]`` are the real ones.
            The logits of a shared-buffer decode step (T = 1) are the decoder's output buffer, which
            the next call overwrites: use them, or copy them, before calling again.
        """
        B, T = input_ids.shape
        kept = self._kept_binding(B, T, attention_mask.shape[1], past)
        if kept is not None and not needs_twin(self.row_rule, B):
            # the usual decode step, on the caches of the previous one: the checks below only cost Python
            # between two runs (a twin row's binding has B + 1 rows: _forward_in_place finds it)
            return kept.run(self.session, input_ids, attention_mask, position_ids), kept.caches
        if needs_twin(self.row_rule, B * T):
            # a cache from the previous step has its twin already (no copy); else the last row is
            # doubled once (after a prefill, or when rows left)
            past = past if cache_rows(past[0]) > B else [_with_twin(to_numpy(p)) for p in past]
            logits, present = self._run(
                _with_twin(input_ids), _with_twin(attention_mask), _with_twin(position_ids), past, reserve
            )
            return logits[:B], present
        # every cache of a call has the same rows: the first tells
        past = past if cache_rows(past[0]) == B else [to_numpy(p)[:B] for p in past]  # a twin no longer needed
        return self._run(input_ids, attention_mask, position_ids, past, reserve)

    def decode(
        self, next_ids: Seq[int], lengths: Seq[int], past: list[Any], reserve: int = 0, uniform: bool = True
    ) -> tuple[np.ndarray, list[Any]]:
        """One decode step (T = 1): :meth:`forward` of ``input_ids = next_ids[:, None]``, ``position_ids =
        lengths[:, None]`` and, per row, ``lengths + 1`` ones then zeros as the mask.

        On the kept binding of the shared-buffer graph (the usual step) the ids and positions are written into
        its bound buffers and the mask of a uniform step is one made beforehand (:meth:`_DecodeBinding.decode`):
        no array or OrtValue is made between two runs.

        Args:
            next_ids: each row's last chosen token (B ints, a list or an int64 array).
            lengths: the tokens each row's cache holds, = the new token's position (B ints).
            past, reserve: as for :meth:`forward`.
            uniform: every row holds as many tokens (the caller's word: a uniform step reads ``lengths[0]``
                only); the mask is then all ones.
        Returns:
            as :meth:`forward` with T = 1.
        """
        B = len(next_ids)
        total = int(lengths[0] if uniform else max(lengths)) + 1
        kept = self._kept_binding(B, 1, total, past)
        if kept is not None and not needs_twin(self.row_rule, B):
            return kept.decode(self.session, next_ids, lengths, total, uniform), kept.caches
        positions = np.asarray(lengths, np.int64)[:, None]
        mask = _right_padded_mask(positions, total)
        return self.forward(np.asarray(next_ids, np.int64)[:, None], mask, positions, past, reserve)

    def _run(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[Any],
        reserve: int = 0,
    ) -> tuple[np.ndarray, list[Any]]:
        """:meth:`forward` without twin rows: every input has the same rows."""
        if self.shared_buffer:
            return self._forward_in_place(input_ids, attention_mask, position_ids, past, reserve)
        io = self.session.io_binding()
        io.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids, np.int64))
        io.bind_cpu_input("attention_mask", np.ascontiguousarray(attention_mask, np.int64))
        io.bind_cpu_input("position_ids", np.ascontiguousarray(position_ids, np.int64))
        for name, value in zip(self.past_names, past):
            if isinstance(value, ort.OrtValue):
                io.bind_ortvalue_input(name, value)
            else:
                io.bind_cpu_input(name, np.ascontiguousarray(value, np.float32))
        for name in self._outputs:
            io.bind_output(name)
        self.session.run_with_iobinding(io)
        logits, *present = io.get_outputs()
        return logits.numpy(), present

    def _forward_in_place(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[Any],
        reserve: int = 0,
    ) -> tuple[np.ndarray, list[Any]]:
        """:meth:`forward` on the shared-buffer graph: ``past`` (B, Hkv, capacity, Dh) holds P =
        mask length - T tokens; the T new ones are written after them, in place. A cache without
        room for P + T gets a new one of ``reserve`` tokens when that is more than P + T (at most
        :attr:`MAX_RESERVE` at once, which may be less than :attr:`MIN_CAPACITY`), else of twice the
        capacity (at least P + T and :attr:`MIN_CAPACITY`,
        at most ``max_position_embeddings`` unless P + T is more; its first P slots copied).
        Returns logits and the same caches (OrtValues, each keeping its numpy buffer alive), now
        holding P + T; a decode step's logits are the kept binding's buffer (:class:`_DecodeBinding`)."""
        B, T = input_ids.shape
        total = attention_mask.shape[1]
        held = total - T
        kept = self._kept_binding(B, T, total, past)
        if kept is not None:
            return kept.run(self.session, input_ids, attention_mask, position_ids), kept.caches
        caches = []
        for value in past:
            capacity = value.shape()[2] if isinstance(value, ort.OrtValue) else value.shape[2]
            if capacity < total:
                # the request's own maximum when known: one allocation, no copies on the way, and the
                # attention reads a buffer no longer than needed (a 1024-slot buffer for 144 tokens decoded
                # 3% slower at 2 threads; bench/results/serve_capacity_2026-12-01.md)
                grown = max(self.MIN_CAPACITY, 2 * capacity, total)
                if reserve > total:  # at once up to MAX_RESERVE; past it, doubling; never past the maximum
                    grown = min(reserve, max(total, self.MAX_RESERVE, 2 * capacity))
                grown = min(grown, max(total, self.max_positions))  # never past the context window
                buffer = np.zeros((B, self.num_kv_heads, grown, self.head_dim), np.float32)
                buffer[:, :, :held] = to_numpy(value)[:, :, :held]
                value = buffer
            if not isinstance(value, ort.OrtValue):
                value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value, np.float32))
            caches.append(value)
        if T == 1:  # a decode step: a binding kept for the next steps on these caches
            logits_buffer = np.empty((B, 1, self.vocab_size), self._logits_dtype)
            self._binding = _DecodeBinding.make(
                self.session, self.past_names, self.present_names, caches, logits_buffer
            )
            return self._binding.run(self.session, input_ids, attention_mask, position_ids), caches
        self._binding = None  # a prefill: no longer hold the last decode's caches; the next decode binds anew
        io = self.session.io_binding()  # ONNX Runtime allocates the (B, T, V) logits
        for name, value in zip(self.past_names, caches):
            io.bind_ortvalue_input(name, value)
        io.bind_output("logits")  # first: get_outputs() lists the outputs in the order bound
        for name, value in zip(self.present_names, caches):
            io.bind_ortvalue_output(name, value)
        io.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids, np.int64))
        io.bind_cpu_input("attention_mask", np.ascontiguousarray(attention_mask, np.int64))
        io.bind_cpu_input("position_ids", np.ascontiguousarray(position_ids, np.int64))
        self.session.run_with_iobinding(io)
        logits: np.ndarray = io.get_outputs()[0].numpy()
        return logits, caches

    def _kept_binding(self, rows: int, tokens: int, total: int, past: list[Any]) -> Optional[_DecodeBinding]:
        """The kept decode binding when this call is a decode step (``tokens`` = 1) of ``rows`` rows on
        the very caches ``past`` it holds, with room for ``total`` tokens; else None."""
        kept = self._binding
        if tokens == 1 and kept is not None and kept.rows == rows and kept.capacity >= total:
            # the scheduler hands back the very list the last step returned: one identity test, usually
            return kept if past is kept.caches or _same(kept.caches, past) else None
        return None


@dataclass
class _DecodeBinding:
    """An IO binding for decode steps (T = 1) of the shared-buffer graph, kept from step to step while
    the caches stay the same objects (:meth:`OnnxDecoder._forward_in_place`).

    Bound once: the 2 x layers caches as past and present, a logits buffer (rows, 1, V) as the output,
    and (rows, 1) int64 buffers as ``input_ids`` and ``position_ids``, which a step overwrites in place; a
    step binds only ``attention_mask`` (its length grows by one) and runs. Why: the Python between two
    ONNX Runtime runs executes with cold caches (a run streams the weights through L1/L2), so each
    allocation and binding call costs ~10x its warm time; binding the caches and allocating the logits
    each step cost ~0.1 ms (bench/results/serve_profile_2026-12-01.md), the input arrays, their bindings
    and a copy of the logits another ~70 us, ~5 % of an int4 step at 2 threads
    (bench/results/serve_engine_2026-12-01.md).
    """

    io: ort.IOBinding
    caches: list[Any]
    #: (rows, 1, V): the output, overwritten by every run
    logits: np.ndarray
    #: (rows, 1) int64, bound as ``input_ids`` / ``position_ids``
    input_ids: np.ndarray
    position_ids: np.ndarray
    #: the caches' capacity (tokens)
    capacity: int
    #: (rows * capacity,) int64 ones; the all-ones masks of :meth:`decode` are views of it
    ones: np.ndarray = field(default_factory=lambda: np.ones(0, np.int64))
    #: OrtValues of the all-ones (rows, L) masks for L = ``masks_from`` + i, made :data:`MASKS_AT_ONCE` at a time
    masks: list[Any] = field(default_factory=list)
    masks_from: int = 0

    #: all-ones masks made in one go when :meth:`decode` needs a length it has none for: made one per step, each
    #: would cost as much as binding a new array (the Python between two runs runs cold), made together they run warm
    MASKS_AT_ONCE: ClassVar[int] = 64

    @property
    def rows(self) -> int:
        return int(self.logits.shape[0])

    @classmethod
    def make(
        cls,
        session: ort.InferenceSession,
        past_names: list[str],
        present_names: list[str],
        caches: list[Any],
        logits: np.ndarray,
    ) -> _DecodeBinding:
        """Bind ``caches`` (OrtValues (rows, Hkv, capacity, Dh)) as past and present, ``logits`` (rows, 1, V)
        as the output, and new input buffers."""
        rows = int(caches[0].shape()[0])
        io = session.io_binding()
        for name, value in zip(past_names, caches):
            io.bind_ortvalue_input(name, value)
        io.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
        for name, value in zip(present_names, caches):
            io.bind_ortvalue_output(name, value)
        ids, pos = np.zeros((rows, 1), np.int64), np.zeros((rows, 1), np.int64)
        # OrtValues over the numpy buffers (no copy): writing the arrays changes what the next run reads
        io.bind_ortvalue_input("input_ids", ort.OrtValue.ortvalue_from_numpy(ids))
        io.bind_ortvalue_input("position_ids", ort.OrtValue.ortvalue_from_numpy(pos))
        return cls(io, list(caches), logits, ids, pos, int(caches[0].shape()[2]))

    def run(
        self, session: ort.InferenceSession, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray
    ) -> np.ndarray:
        """One decode step: ``input_ids``/``position_ids`` (rows, 1) int64 written into the bound
        buffers, ``attention_mask`` (rows, P + 1) bound; returns :attr:`logits` (overwritten by the next run)."""
        self.input_ids[...] = input_ids
        self.position_ids[...] = position_ids
        self.io.bind_cpu_input("attention_mask", np.ascontiguousarray(attention_mask, np.int64))
        session.run_with_iobinding(self.io)
        return self.logits

    def decode(
        self, session: ort.InferenceSession, next_ids: Seq[int], lengths: Seq[int], total: int, uniform: bool
    ) -> np.ndarray:
        """One decode step of :meth:`OnnxDecoder.decode` (its arguments; ``total`` = the longest row + 1 <=
        :attr:`capacity`): ids and positions written into the bound buffers, the mask an all-ones one made
        beforehand when ``uniform``, else made and bound; returns :attr:`logits` (overwritten by the next run)."""
        self.input_ids[:, 0] = next_ids
        self.position_ids[:, 0] = lengths
        if uniform:
            self.io.bind_ortvalue_input("attention_mask", self._ones_mask(total))
        else:
            self.io.bind_cpu_input("attention_mask", _right_padded_mask(self.position_ids, total))
        session.run_with_iobinding(self.io)
        return self.logits

    def _ones_mask(self, total: int) -> Any:
        """The OrtValue of a (rows, ``total``) int64 mask of ones (``total`` <= :attr:`capacity`)."""
        i = total - self.masks_from
        if not 0 <= i < len(self.masks):
            rows = self.rows
            if self.ones.size == 0:
                self.ones = np.ones(rows * self.capacity, np.int64)  # never written: the masks only read it
            stop = min(total + self.MASKS_AT_ONCE, self.capacity + 1)
            # views of one buffer (OrtValues over numpy memory, no copy); this binding keeps the buffer alive
            self.masks = [
                ort.OrtValue.ortvalue_from_numpy(self.ones[: rows * n].reshape(rows, n)) for n in range(total, stop)
            ]
            self.masks_from, i = total, 0
        return self.masks[i]


def _right_padded_mask(positions: np.ndarray, total: int) -> np.ndarray:
    """(B, ``total``) int64 mask of each row's ``positions[b, 0] + 1`` ones then zeros: its past and the new
    token, padding on the right (a shared-buffer decode step of rows of several lengths)."""
    return (np.arange(total) <= positions).astype(np.int64)


def open_decoder(
    info: ExportInfo, intra_op_threads: int = 0, shared_kv_buffer: bool = True, spinning: bool = True
) -> OnnxDecoder:
    """The decoder serve runs for ``info``: its shared-buffer graph when ``shared_kv_buffer`` and the
    export has one (:attr:`ExportInfo.shared_buffer_path`), else the contract graph; ``spinning``: see
    :class:`OnnxDecoder`."""
    if shared_kv_buffer and info.shared_buffer_path is not None:
        return OnnxDecoder(
            info.shared_buffer_path, info.config, intra_op_threads, shared_buffer=True, spinning=spinning
        )
    return OnnxDecoder(info.onnx_path, info.config, intra_op_threads, spinning=spinning)


#: ONNX Runtime's default for ``session.qdq_matmulnbits_accuracy_level`` (onnxruntime_session_options_config_keys.h):
#: the accuracy level of the MatMulNBits its QDQ fusion makes
QDQ_MATMULNBITS_ACCURACY_LEVEL = 4


def needs_twin(rule: str, rows: int) -> bool:
    """Whether a call of ``rows`` rows (batch x tokens) runs with a twin row under ``rule``
    (:func:`nbits_row_rule`)."""
    return (rule == "one" and rows == 1) or (rule == "odd" and rows % 2 == 1)


def nbits_row_rule(onnx_path: str | Path, intra_op_threads: int = 0, rows: int = 16) -> str:
    """How the graph's ``com.microsoft.MatMulNBits`` nodes treat a row depending on the call's row
    count M (batch x tokens), on this CPU at ``intra_op_threads``.

    ONNX Runtime's MLAS picks a MatMulNBits kernel by M, and a row's bits can depend on it. Measured
    with onnxruntime 1.32 on an AVX-512 VNNI Xeon (bench/results/serve_speed_2026-12-01.md):
    accuracy_level 0/1 run M = 1 through a path of its own (~1e-5 off the same row among others);
    accuracy_level 4 with block_size 32 gives every row the same bits whatever M; accuracy_level 4
    with block_size >= 64 runs the last row of an odd M through a one-row kernel. The path depends
    on the shapes, attributes, CPU and thread count, not on the values, so each distinct node
    configuration is run as a one-node graph with random weights of its shapes and dtypes, at
    M = 1 .. ``rows``, and every row compared bitwise with the same row at M = ``rows``.

    Returns:
        "none": every row the same whatever M (also: no MatMulNBits node, in the file or fused from
        int4 DequantizeLinear + MatMul at load); "one": only a lone row
        differs (it must run with a twin); "odd": rows differ when M is odd (an odd call gets a twin).
        Any other pattern is logged as a warning and answered "odd" (the closest rule).
    """
    model = onnx.load(str(onnx_path), load_external_data=False)
    inits = {t.name: t for t in model.graph.initializer}
    configs: dict[tuple[_NBitsAttrs, _NBitsInputs], None] = {}  # ordered set: one probe per configuration
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
            continue
        attr = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        ins = tuple(
            (i, tuple(inits[name].dims), inits[name].data_type)
            for i, name in enumerate(node.input)
            if i > 0 and name and name in inits
        )
        configs[(tuple(sorted(attr.items())), ins)] = None
    # the qdq int4 layout (prodip.export.quantize.to_int4): ONNX Runtime's QDQ fusion makes each int4
    # DequantizeLinear (blocked along K) + MatMul a MatMulNBits at session load, with accuracy_level from
    # session.qdq_matmulnbits_accuracy_level (default 4) and the fused tensors' shapes; probed as that node
    consumers: dict[str, list[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.op_type)
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or consumers.get(node.output[0]) != ["MatMul"]:
            continue
        weight = inits.get(node.input[0])
        attr = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if weight is None or weight.data_type not in (TensorProto.INT4, TensorProto.UINT4) or len(weight.dims) != 2:
            continue
        if not attr.get("block_size") or attr.get("axis", 1) != 0:
            continue
        (k, n), block = (int(d) for d in weight.dims), int(attr["block_size"])
        blocks = -(-k // block)
        scale_type = inits[node.input[1]].data_type if node.input[1] in inits else TensorProto.FLOAT
        ins = ((1, (n, blocks, block // 2), TensorProto.UINT8), (2, (n * blocks,), scale_type))
        if len(node.input) > 2 and node.input[2]:
            ins += ((3, (n * -(-blocks // 2),), TensorProto.UINT8),)
        fused = {"K": k, "N": n, "bits": 4, "block_size": block, "accuracy_level": QDQ_MATMULNBITS_ACCURACY_LEVEL}
        configs[(tuple(sorted(fused.items())), ins)] = None
    bad: set[int] = set()
    for attrs, ins in configs:
        bad |= _nbits_bad_row_counts(attrs, ins, intra_op_threads, rows)
    if not bad:
        return "none"
    if bad == {1}:
        return "one"
    if any(m % 2 == 0 for m in bad):
        log.warning(
            "%s: MatMulNBits rows differ at row counts %s on this CPU; batch invariance is not assured",
            onnx_path,
            sorted(bad),
        )
    return "odd"


#: a MatMulNBits node's attributes as sorted (name, value) pairs, and its constant inputs as
#: (input index, dims, onnx dtype): hashable, so the probe below is cached per configuration
_NBitsAttrs = tuple[tuple[str, Any], ...]
_NBitsInputs = tuple[tuple[int, tuple[int, ...], int], ...]


@functools.lru_cache(maxsize=256)  # per process: a server's decoders, a test's many sessions
def _nbits_bad_row_counts(attrs: _NBitsAttrs, ins: _NBitsInputs, threads: int, rows: int) -> frozenset[int]:
    """Row counts M < ``rows`` at which a row of a one-node MatMulNBits graph (``attrs``: sorted
    (name, value) pairs; ``ins``: (input index, dims, onnx dtype) of its constant inputs) differs
    from the same row at M = ``rows``."""
    attr = dict(attrs)
    rng = np.random.default_rng(0)
    names, tensors = ["A"], []
    float_type: int = TensorProto.FLOAT
    for index, dims, dtype in ins:
        np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
        if np.issubdtype(np_dtype, np.integer):
            value = rng.integers(0, 256 if index != 4 else 1, dims).astype(np_dtype)  # 4: g_idx, all zero
        else:
            value = (rng.random(dims) * 0.02).astype(np_dtype)
            float_type = dtype if index == 2 else float_type  # scales: the activations' type
        while len(names) < index:
            names.append("")
        names.append(f"in{index}")
        tensors.append(numpy_helper.from_array(value, f"in{index}"))
    K, N = int(attr["K"]), int(attr["N"])
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", **attr)
    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info("A", float_type, ["M", K])],
        [helper.make_tensor_value_info("Y", float_type, ["M", N])],
        tensors,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    session = ort.InferenceSession(
        helper.make_model(graph, opset_imports=opsets).SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    a = rng.standard_normal((rows, K)).astype(helper.tensor_dtype_to_np_dtype(float_type))
    ref = session.run(None, {"A": a})[0]
    return frozenset(m for m in range(1, rows) if not np.array_equal(session.run(None, {"A": a[:m]})[0], ref[:m]))


def _same(a: list[Any], b: list[Any]) -> bool:
    """Whether two lists hold the very same objects, in order."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def cache_rows(value: Any) -> int:
    """Rows (batch dim) of a cache tensor, a numpy array or an OrtValue."""
    return int(value.shape()[0] if isinstance(value, ort.OrtValue) else value.shape[0])


def _with_twin(a: np.ndarray) -> np.ndarray:
    """``a`` (B, ...) with its last row once more (B + 1, ...) (a copy)."""
    return np.concatenate([a, a[-1:]])


def to_numpy(value: Any) -> np.ndarray:
    """A cache tensor as numpy (copies an OrtValue out of ONNX Runtime memory)."""
    array: np.ndarray = value.numpy() if isinstance(value, ort.OrtValue) else value
    return array
