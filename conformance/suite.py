"""The conformance suite: load the reference and every candidate, measure, gate on tolerances.

:func:`evaluate` computes the whole report dict without writing anything (the pytest plugin
uses it); :func:`run_conformance` also writes ``report.json`` + ``report.md`` and records the
verdict in the export's manifest (``prodip run`` and the CLI use it).

    python -m prodip.conformance runs/demo/export --checkpoint runs/demo/train --shards-dir runs/demo/shards
"""

from __future__ import annotations

import json
import logging
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import onnx
import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from prodip.base.config import ConfigError
from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.manifest import (
    CardQuality,
    ExportManifest,
    file_sha256,
    files_table_sha256,
    load_manifest,
    set_conformance,
    tool_versions,
    verify_files,
)
from prodip.base.records import refuse_newer
from prodip.base.specials import read_specials
from prodip.conformance import card, device_runners, measure, runners, speed
from prodip.conformance import tasks as lm_tasks
from prodip.conformance.chat import CONVERSATIONS, GREEDY_CONVERSATION, check_chat, reference_ids
from prodip.conformance.compare import bits_per_char, check_value, load_tolerances, tie_margin
from prodip.conformance.config import DEFAULT_TOLERANCES, ConformanceConfig
from prodip.conformance.inputs import PROMPTS, build_inputs
from prodip.conformance.reload import load_safetensors_model
from prodip.conformance.report import REPORT_FILE, ConformanceReport, write_report
from prodip.conformance.results import CandidateResult, Check, RunOutcome, all_passed, variant_results
from prodip.conformance.runners import TorchRunner, onnx_axes_problems
from prodip.conformance.runtimes import RUNTIME_PROMPTS, check_runtimes, stop_ids
from prodip.conformance.tolerances import compare_with_shipped, require_tables, wasm_table
from prodip.conformance.verdict import merge_verdict
from prodip.conformance.wasm_graph import session_entries, wasm_entry_problems, web_config_differences
from prodip.export.hf import tokenizer_config_differences
from prodip.train.checkpoint import is_hf_folder, load_model, require_checkpoint_tokenizer
from prodip.train.config import ModelConfig
from prodip.train.records import EvalReport

logger = logging.getLogger(__name__)
FORMAT_VERSION = 1
#: Metrics measured on held-out text, which only a shards dir gives: gating one without it is refused.
HELDOUT_METRICS = ("bpc_delta_max",)


@dataclass(frozen=True)
class Candidate:
    """One implementation under test: ``name`` (report label and tolerance table), the manifest
    ``variant`` it belongs to, its ``kind`` (prodip | transformers | onnx | gguf | pte), file ``path``, and
    the tolerance ``table`` (``safetensors_bfloat16`` etc. for a reduced-precision safetensors file).

    A variant's web-only graph (``int4-wasm``: the manifest's ``wasm_path``) is run by ONNX Runtime with the
    ``session_config`` entries its manifest names and ``fp32_matmulnbits`` (float32 ``MatMulNBits``): the
    arithmetic onnxruntime-web's WASM build does on that file (:class:`prodip.conformance.runners.OrtRunner`)."""

    name: str
    variant: str
    kind: str
    path: str
    table: str = ""  # tolerance table; default ``name``
    window: int = 0  # tokens the artifact holds (a .pte's KV-cache window, manifest ``max_seq_len``); 0 = the model's
    session_config: tuple[tuple[str, str], ...] = ()  # ONNX Runtime session config entries (key, value)
    fp32_matmulnbits: bool = False

    @property
    def tolerance_table(self) -> str:
        return self.table or self.name

    @property
    def is_variant_file(self) -> bool:
        """The candidate runs its variant's own file as the variant's runtimes load it (not a second program of
        the same weights, nor the variant's web-only graph): the on-device runtimes, tasks and speed take these."""
        return self.name == self.variant


def plan_candidates(manifest: ExportManifest, only: Optional[list[str]] = None) -> list[Candidate]:
    """Candidates of an export: the safetensors variant twice (prodip's model, transformers),
    each ONNX, GGUF (llama.cpp) and ExecuTorch variant once, and an ONNX variant's web-only graph (the
    int4's ``wasm_path``: what the export's page loads on the WASM device) as ``<variant>-wasm`` after it.

    Args:
        manifest: the export manifest.
        only: candidate or variant names to keep (empty/None = all). A variant's name keeps its web graph, and a
            web graph's name its variant (``int4-wasm`` alone would vouch for int4 without measuring its file).
    Raises:
        ValueError: a variant of unknown format, a web graph entry that names another file or other session
            options than the export's (:func:`_wasm_candidate`), or a name in ``only`` that matches nothing.
    """
    out = []
    for vname, v in manifest.variants.items():
        if v.format == "safetensors":
            # a bf16/fp16 file is not exact: it needs its own table (fail closed until one exists)
            dtype = v.dtype or "float32"
            suffix = "" if dtype == "float32" else f"_{dtype}"
            out += [
                Candidate("safetensors", vname, "prodip", v.path, "safetensors" + suffix),
                Candidate("transformers", vname, "transformers", v.path, "transformers" + suffix),
            ]
        elif v.format in ("onnx", "gguf", "pte"):
            window = getattr(v, "max_seq_len", None) if v.format == "pte" else None
            out.append(Candidate(vname, vname, v.format, v.path, window=int(window or 0)))
            if v.format == "onnx" and v.wasm_path:
                out.append(_wasm_candidate(manifest, vname))
        else:
            raise InvalidInput(
                f"manifest variant {vname!r} has format {v.format!r}; expected 'safetensors', 'onnx', 'gguf' or 'pte'"
            )
    if only:
        unknown = set(only) - {c.name for c in out} - {c.variant for c in out}
        if unknown:
            raise InvalidInput(
                f"ConformanceConfig.variants: {sorted(unknown)} not in this export "
                f"(has {sorted({c.name for c in out})})"
            )
        # a web graph is checked with its variant's own file: the verdict it is part of is the variant's
        web = {c.variant for c in out if c.name in only and c.name == wasm_table(c.variant)}
        out = [c for c in out if c.name in only or c.variant in only or c.variant in web]
    return out


def _wasm_candidate(manifest: ExportManifest, variant: str) -> Candidate:
    """The candidate of ``variant``'s web-only graph (its manifest entry's ``wasm_path``), with the session options
    its ``wasm`` parameters name (``session_config``, e.g. ``session.disable_quant_qdq=1``: ONNX Runtime then
    constant-folds the int4 weights to the 8-bit ``MatMulInteger`` layout at load, as the WASM build does).

    Raises:
        ValueError: the entry names another file than the export's web graph of the variant, or other session
            options than the export writes (:func:`prodip.conformance.wasm_graph.wasm_entry_problems`: each
            problem with its manifest field and value); measuring it would vouch for a file or arithmetic the
            page does not use.
    """
    problems = wasm_entry_problems(manifest, variant)
    if problems:
        raise InvalidInput(
            "; ".join(problems) + ". Re-run `prodip export`, or check the other variants only with --variants "
            "(nothing was measured or written)"
        )
    path = manifest.variants[variant].wasm_path or ""
    entries = session_entries(manifest.variants[variant].wasm)
    return Candidate(wasm_table(variant), variant, "onnx", path, session_config=entries, fp32_matmulnbits=True)


def load_reference(cfg: ConformanceConfig, manifest: ExportManifest) -> tuple[Any, Any, dict[str, Any]]:
    """Load the training model from the checkpoint the manifest names, refusing another one.

    Raises:
        ValueError: the checkpoint's model sha256 differs from ``source_checkpoint.model_sha256``.
        FileNotFoundError: no checkpoint at the path, or it lacks ``tokenizer/tokenizer.json`` (named).
    """

    src = manifest.source_checkpoint
    path = cfg.checkpoint or src.path
    if not path:
        raise InvalidInput(f"{cfg.export_dir}/manifest.json names no source_checkpoint.path; pass --checkpoint")
    if is_hf_folder(path):
        model, model_cfg, info = load_hf_reference(Path(path))
    else:
        model, model_cfg, info = load_model(require_checkpoint_tokenizer(path))
    if info["model_sha256"] != src.model_sha256:
        raise InvalidInput(
            f"checkpoint {info['checkpoint_dir']} has model sha256 {info['model_sha256'][:16]}.., but "
            f"{cfg.export_dir}/manifest.json says the export was made from {str(src.model_sha256)[:16]}.. "
            f"({src.path}); refusing to compare an export with a different checkpoint. Pass the "
            "checkpoint it was exported from, or re-export this one with `prodip export`."
        )
    return model.float().eval(), model_cfg, info


def load_hf_reference(folder: Path) -> tuple[Any, Any, dict[str, Any]]:
    """The reference of an export of a Hugging Face folder (``prodip export HF_FOLDER``): prodip's model
    with the folder's weights (as ``prodip.train.init.load_init`` reads them), and the folder's tokenizer.

    Returns:
        ``(model, ModelConfig, info)`` with ``info`` as ``prodip.train.checkpoint.load_model``'s
        (``checkpoint_dir``, ``step`` 0, ``model_sha256`` of its ``model.safetensors``, ``tokenizer_dir``,
        ``tokenizer_sha256``).
    """
    from prodip.train.init import apply_init, load_init  # noqa: PLC0415
    from prodip.train.model import LlamaForCausalLM  # noqa: PLC0415

    # the folder is the export's manifest source_checkpoint: errors name that, not train's --init-from
    init = load_init(folder, tokenizer_sha256=None, option="the export's source_checkpoint")
    model = LlamaForCausalLM(init.config)
    apply_init(model, init)
    weights = folder / "model.safetensors"
    info = {
        "checkpoint_dir": str(folder.resolve()),
        "step": 0,
        "model_sha256": file_sha256(weights) if weights.is_file() else "",
        "tokenizer_dir": str(folder.resolve()),
        "tokenizer_sha256": file_sha256(folder / "tokenizer.json"),
    }
    return model, init.config, info


def make_runner(cand: Candidate, export_dir: Path, model_cfg: Any, threads: int, *, span: int = 0, rows: int = 0):
    """Build the runner of one candidate (loading its file).

    Args:
        span, rows: the longest sequence and the most rows the checks feed (:meth:`InputSet.longest`,
            :meth:`InputSet.rows`); llama.cpp's context is sized to them (0: the model's window, 8 rows).
    """
    if cand.kind == "prodip":
        return runners.TorchRunner(load_safetensors_model(export_dir, cand.path), cand.name)
    if cand.kind == "transformers":
        return runners.TransformersRunner(export_dir, cand.name)
    if cand.kind == "gguf":
        return device_runners.LlamaCppRunner(
            export_dir / cand.path,
            cand.name,
            context=span or model_cfg.max_position_embeddings,
            rows=rows or device_runners.MAX_ROWS,
            threads=threads,
        )
    if cand.kind == "pte":
        return device_runners.ExecuTorchRunner(export_dir / cand.path, cand.name)
    return runners.OrtRunner(
        export_dir / cand.path,
        cand.name,
        num_layers=model_cfg.num_hidden_layers,
        num_kv_heads=model_cfg.num_key_value_heads,
        head_dim=model_cfg.head_dim,
        threads=threads,
        session_config=dict(cand.session_config),
        fp32_matmulnbits=cand.fp32_matmulnbits,
    )


def gate(metrics: dict[str, Any], errors: dict[str, str], table: Optional[dict[str, Any]]) -> list[Check]:
    """Compare metrics with a tolerance table.

    Returns:
        Checks, ``run_errors`` first. A missing table, a gated metric that was not measured (value None) or
        any phase error is a failed check: a gated check never passes unmeasured.
    """
    checks = [Check("run_errors", len(errors), {"equals": 0}, not errors)]
    if table is None:
        return checks + [Check("tolerances", None, None, False, "no table for this candidate in the tolerance file")]
    for metric, tol in table.items():
        if isinstance(tol, str):
            continue
        value = metrics.get(metric)
        note = None
        if metric == "greedy_identical" and metrics.get("greedy_partings"):  # where and why the ids parted
            note = "; ".join(f"prompt {row}: {p['reason']}" for row, p in metrics["greedy_partings"].items())
        checks.append(Check(metric, value, tol, check_value(value, tol), note))
    return checks


def global_metrics(
    export_dir: Path,
    manifest: ExportManifest,
    info: dict[str, Any],
    texts: list[str],
    train_tokenizer: Any,
    model_cfg: Any,
) -> dict[str, Any]:
    """Export-wide facts: config.json vs the checkpoint's ModelConfig (and its ``transformers.js_config``
    web-graph entry vs the manifest's, :func:`prodip.conformance.wasm_graph.web_config_differences`), file hashes,
    tokenizer identity, and the exported vs training tokenizer's ids on the prompt texts.

    ``config_differences``: ``{field: [expected, found]}`` (expected: the checkpoint's, the manifest's)."""

    out: dict[str, Any] = {}
    try:
        raw = json.loads((export_dir / "config.json").read_text(encoding="utf-8"))
        exported = ModelConfig.from_hf_dict(raw)
        diff = {k: [v, getattr(exported, k)] for k, v in model_cfg.to_dict().items() if getattr(exported, k) != v}
        # tokenizer_config.json states the context and special ids too (transformers.js truncates by it)
        diff.update(tokenizer_config_differences(export_dir, model_cfg))
        # the web graph the page loads (file, session options) is the one the manifest's int4-wasm measures
        diff.update(web_config_differences(manifest, raw))
        out["config_matches"] = not diff
        if diff:
            out["config_differences"] = diff  # field: [checkpoint, export]
    except (ValueError, FileNotFoundError) as err:
        out["config_matches"], out["config_error"] = False, str(err)
    try:
        verify_files(export_dir)
        out["manifest_files_ok"] = True
    except (ValueError, FileNotFoundError) as err:
        out["manifest_files_ok"], out["manifest_files_error"] = False, str(err)
    try:  # the model card's licence and source fields in every artifact, and its quality figures
        problems = card.card_problems(export_dir, manifest)
    except Exception as err:  # an unreadable artifact fails the check, it does not crash the suite
        problems = [f"{type(err).__name__}: {str(err).strip()[:400]}"]
    out["card_ok"] = not problems
    if problems:
        out["card_problems"] = problems
    tok_path = export_dir / "tokenizer.json"
    if not tok_path.is_file():
        out.update(
            tokenizer_sha256_match=False, tokenizer_mismatches=len(texts), tokenizer_error=f"{tok_path}: missing"
        )
        return out
    sha = file_sha256(tok_path)
    out["tokenizer_sha256_match"] = sha == info["tokenizer_sha256"] == manifest.tokenizer_sha256
    exported = Tokenizer.from_file(str(tok_path))
    bad = [
        t[:40]
        for t in texts
        if exported.encode(t, add_special_tokens=False).ids != train_tokenizer.encode(t, add_special_tokens=False).ids
        or exported.encode(t).ids != train_tokenizer.encode(t).ids
    ]
    out["tokenizer_mismatches"] = len(bad)
    if bad:
        out["tokenizer_mismatched_texts"] = bad
    return out


def evaluate(cfg: ConformanceConfig) -> dict[str, Any]:
    """Run every check and return the report dict (nothing is written); see :func:`evaluate_run`."""
    return evaluate_run(cfg)[0]


@dataclass(frozen=True)
class Preflight:
    """What :func:`preflight_run` read and accepted: the inputs every check then runs on."""

    export_dir: Path
    manifest: ExportManifest
    tol_path: Path
    tolerances: dict[str, Any]
    candidates: list[Candidate]


def preflight_run(cfg: ConformanceConfig) -> Preflight:
    """Refuse a run's bad arguments and inputs before anything is measured, written or removed
    (:func:`preflight` on the config's export, tolerance file, variants and held-out text).

    Raises:
        ValueError / FileNotFoundError: see :func:`preflight`; also an empty ``export_dir``.
    """
    if not cfg.export_dir:
        raise InvalidInput("ConformanceConfig.export_dir is empty: give the export dir made by `prodip export`")
    export_dir = Path(cfg.export_dir)
    manifest = load_manifest(export_dir)
    tol_path = Path(cfg.tolerances) if cfg.tolerances else DEFAULT_TOLERANCES
    tolerances, candidates = preflight(
        export_dir,
        manifest,
        tol_path,
        cfg.variants,
        shards_dir=cfg.shards_dir,
        heldout_files=cfg.heldout,
        heldout_tokens=cfg.heldout_tokens,
    )
    return Preflight(export_dir, manifest, tol_path, tolerances, candidates)


def evaluate_run(cfg: ConformanceConfig, checked: Optional[Preflight] = None) -> tuple[dict[str, Any], RunOutcome]:
    """Run every check: the report dict (nothing is written) and the typed outcome the verdict is merged from.

    Args:
        cfg: the resolved config.
        checked: its :func:`preflight_run`, when the caller already ran it; run here otherwise.
    Raises:
        ValueError / FileNotFoundError: the export or checkpoint is missing or unreadable, the
            checkpoint differs from the one the manifest names, the tolerance file is bad or lacks
            a checked candidate's table, or a checked variant's file is missing (:func:`preflight`;
            all raised before anything is measured).
    """

    t_start = time.perf_counter()
    checked = checked if checked is not None else preflight_run(cfg)
    export_dir, manifest, tol_path = checked.export_dir, checked.manifest, checked.tol_path
    tolerances, candidates = checked.tolerances, checked.candidates
    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _evaluate(cfg, export_dir, manifest, tol_path, tolerances, candidates, t_start)
    finally:
        torch.set_num_threads(threads_before)


def preflight(
    export_dir: Path,
    manifest: ExportManifest,
    tol_path: Path,
    only: Optional[list[str]] = None,
    *,
    shards_dir: Optional[str] = None,
    heldout_files: Optional[dict[str, str]] = None,
    heldout_tokens: int = 1,
) -> tuple[dict[str, Any], list[Candidate]]:
    """Everything that can be refused before measuring: the tolerance file (strictly validated, a
    complete table for every candidate being checked), the held-out text a gated held-out metric
    (bpc_delta_max, required in every candidate table) needs, and each checked variant's files present.

    Returns:
        ``(tolerances, candidates)``.
    Raises:
        ValueError (``ConfigError``): a bad tolerance file, a missing table (named), or a gated
            held-out metric without ``shards_dir`` or ``heldout_files`` (or with ``heldout_tokens`` 0).
        FileNotFoundError: a file of a checked variant is missing (file and variant named).
    """

    tolerances = load_tolerances(tol_path)
    candidates = plan_candidates(manifest, only)
    require_tables(tolerances, [c.tolerance_table for c in candidates], tol_path)
    if not (shards_dir or heldout_files) or heldout_tokens < 1:
        needs = sorted(
            {
                f"[{c.tolerance_table}] {m}"
                for c in candidates
                for m in HELDOUT_METRICS
                if m in (tolerances.get(c.tolerance_table) or {})
            }
        )
        if needs:
            why = (
                "no shards dir or held-out files were given"
                if not (shards_dir or heldout_files)
                else "heldout_tokens is 0"
            )
            raise ConfigError(
                f"{needs[0].split('] ')[1]} is a required check ({', '.join(needs)} in {tol_path}) and needs "
                f"held-out text, but {why}: pass --shards-dir SHARDS (the run's shards, e.g. runs/demo/shards; "
                "`prodip run` passes its own) or --heldout bn=FILE,en=FILE, and heldout_tokens >= 1. A required check is never passed "
                "unmeasured (nothing was measured or written)"
            )
    missing: dict[str, str] = {}
    for cand in candidates:
        entry = manifest.variants[cand.variant]
        # what the checks read: the artifact, its weights, and the tokenizer its runtime loads (the
        # export's tokenizer.json is read for every variant: the reference ids)
        needed = [cand.path, *entry.external_data, entry.tokenizer, "tokenizer.json"]
        for rel in [r for r in needed if r]:
            if rel not in missing and not (export_dir / rel).is_file():
                missing[rel] = cand.variant
    if missing:
        what = "; ".join(f"{rel} of variant {v!r}" for rel, v in missing.items())
        raise MissingInput(
            f"{export_dir}: missing file(s) listed in manifest.json: {what}. Re-run `prodip export`, or "
            "check the other variants only with --variants (nothing was measured or written)"
        )
    _check_readable(export_dir, manifest, candidates)
    return tolerances, candidates


def _check_readable(export_dir: Path, manifest: ExportManifest, candidates: list[Candidate]) -> None:
    """Each checked file has its manifest size, and each ONNX graph parses (weights not loaded).

    A damaged input is the user's to fix (exit 2, file named), not a failed measurement.

    Raises:
        ValueError: a size differing from manifest.json, or an ONNX file protobuf cannot parse.
    """
    for cand in {c.path: c for c in candidates}.values():
        path = export_dir / cand.path
        listed = manifest.files.get(cand.path)
        if listed is not None and path.stat().st_size != listed.bytes:
            raise InvalidInput(
                f"{path}: {path.stat().st_size} bytes, manifest.json says {listed.bytes} (truncated or "
                "replaced); re-run `prodip export` (nothing was measured or written)"
            )
        if cand.kind == "onnx":
            try:
                onnx.load(str(path), load_external_data=False)
            except Exception as err:  # protobuf's DecodeError and friends: the file is not an ONNX model
                raise InvalidInput(
                    f"{path}: not a readable ONNX model ({type(err).__name__}: {str(err).strip()[:200]}); "
                    "re-run `prodip export` (nothing was measured or written)"
                ) from None


def _runtime_tokenizer(cand: Candidate, runner: Any, export_dir: Path, texts: list[str], metrics: dict) -> None:
    """``runtime_tokenizer_mismatches``: prompts (NFC) whose ids from the runtime's own tokenizer differ
    from ``tokenizers``' default encode of the export's ``tokenizer.json`` (BOS included)."""
    manifest_tok = load_manifest(export_dir).variants[cand.variant].tokenizer or "tokenizer.json"
    texts = [unicodedata.normalize("NFC", t) for t in texts]
    want = [e.ids for e in Tokenizer.from_file(str(export_dir / "tokenizer.json")).encode_batch(texts)]
    try:
        got = device_runners.runtime_token_ids(cand.kind, runner, export_dir / manifest_tok, texts)
    except Exception as err:  # a tokenizer the runtime cannot load fails the check
        metrics["runtime_tokenizer_mismatches"] = len(texts)
        metrics["runtime_tokenizer_error"] = f"{type(err).__name__}: {str(err).strip()[:400]}"
        return
    bad = [t[:40] for t, g, w in zip(texts, got, want) if list(g) != list(w)]
    metrics["runtime_tokenizer_mismatches"] = len(bad)
    if bad:
        metrics["runtime_tokenizer_mismatched_texts"] = bad


def check_candidate(
    cand: Candidate,
    export_dir: Path,
    model_cfg: Any,
    inputs: Any,
    ref: Any,
    cfg: ConformanceConfig,
    table: Optional[dict[str, Any]],
) -> CandidateResult:
    """Load one candidate, measure it against the reference outputs and gate it.

    Returns:
        Its result; a candidate that cannot be loaded or run fails with the error recorded, it does not raise.
    """

    logger.info("conformance: measuring %s (%s)", cand.name, cand.path)
    t0, c0 = time.perf_counter(), time.process_time()
    metrics: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if cand.session_config or cand.fp32_matmulnbits:  # how the file was run (a web graph: as its WASM build runs it)
        metrics["session_config"] = dict(cand.session_config)
        metrics["fp32_matmulnbits"] = cand.fp32_matmulnbits
    if cand.kind == "onnx":
        problems = onnx_axes_problems(
            export_dir / cand.path, num_kv_heads=model_cfg.num_key_value_heads, head_dim=model_cfg.head_dim
        )
        metrics["dynamic_axes"] = not problems
        if problems:
            metrics["axes_problems"] = problems
    try:
        runner = make_runner(
            cand,
            export_dir,
            model_cfg,
            cfg.threads,
            span=min(inputs.longest(cfg.greedy_tokens), model_cfg.max_position_embeddings),
            rows=inputs.rows(),
        )
    except Exception as err:  # an unloadable artifact fails, it does not crash the suite
        errors["load"] = f"{type(err).__name__}: {str(err).strip()[:400]}"
    else:
        if cand.kind in ("gguf", "pte"):  # what the runtime reads from the file: context, vocab, special ids
            try:
                problems = device_runners.metadata_problems(
                    cand.kind,
                    runner,
                    model_cfg,
                    stop_ids(export_dir),
                    add_bos=read_specials(export_dir).add_bos,
                    max_seq_len=cand.window,
                )
            except Exception as err:  # an unreadable file fails the check, it does not crash the suite
                problems = [f"{type(err).__name__}: {str(err).strip()[:400]}"]
            metrics["runtime_version"] = device_runners.runtime_version(cand.kind, runner)
            metrics["runtime_metadata_ok"] = not problems
            if problems:
                metrics["runtime_metadata_problems"] = problems
            _runtime_tokenizer(cand, runner, export_dir, list(inputs.texts.values()), metrics)
        m, errors = measure.measure_candidate(
            runner, inputs, ref, greedy_tokens=cfg.greedy_tokens, kv_steps=cfg.kv_steps, tie=tie_margin(table)
        )
        metrics.update(m)
        if hasattr(runner, "close"):
            runner.close()
    checks = gate(metrics, errors, table)
    if table is None:
        checks[-1].note = f"no [{cand.tolerance_table}] table in the tolerance file"
    return CandidateResult(
        cand.variant,
        cand.kind,
        cand.path,
        cand.tolerance_table,
        metrics,
        errors,
        checks,
        time.perf_counter() - t0,
        time.process_time() - c0,
    )


def _evaluate(
    cfg, export_dir, manifest, tol_path, tolerances, candidates, t_start
) -> tuple[dict[str, Any], RunOutcome]:

    ref_model, model_cfg, info = load_reference(cfg, manifest)
    train_tok = Tokenizer.from_file(str(Path(info["tokenizer_dir"]) / "tokenizer.json"))
    # every check fits the shortest window of the candidates (a .pte exported with a shorter KV window)
    window = min([model_cfg.max_position_embeddings, *(c.window for c in candidates if c.window)])
    inputs = build_inputs(
        train_tok,
        context_tokens=min(cfg.context_tokens, window) if cfg.context_tokens else window,
        pad_id=model_cfg.pad_token_id,
        greedy_tokens=cfg.greedy_tokens,
        kv_tokens=cfg.kv_tokens,
        shards_dir=cfg.shards_dir,
        heldout_files=cfg.heldout,
        heldout_tokens=cfg.heldout_tokens,
        tokenizer_sha256=info["tokenizer_sha256"],
    )
    texts = list(inputs.texts.values())
    texts += [t for t in (unicodedata.normalize("NFD", x) for x in texts) if t not in texts]  # NFC inside?
    g = global_metrics(export_dir, manifest, info, texts, train_tok, model_cfg)
    g_checks = gate(g, {}, tolerances.get("global", {}))[1:]
    ref = measure.reference_outputs(TorchRunner(ref_model, "reference"), inputs, cfg.greedy_tokens)
    results = {
        cand.name: check_candidate(cand, export_dir, model_cfg, inputs, ref, cfg, tolerances.get(cand.tolerance_table))
        for cand in tqdm(candidates, desc="conformance", unit="candidate", disable=None)
    }
    prompts = {k: train_tok.encode(PROMPTS[k]).ids for k in RUNTIME_PROMPTS}
    chat = check_chat(export_dir, cfg.runtimes, [c.variant for c in candidates], cfg.missing_runtimes)  # None: base
    if chat is not None:  # the chat contract: export-wide checks, and greedy chat decoding in each runtime
        g_checks += [Check.from_dict(c) for c in chat["checks"]]
        prompts["chat"] = reference_ids(export_dir, {GREEDY_CONVERSATION: CONVERSATIONS[GREEDY_CONVERSATION]})[
            GREEDY_CONVERSATION
        ]
    on_device = check_runtimes(  # on each variant's own file (onnxruntime-web runs the int4's web graph itself)
        export_dir,
        [c for c in candidates if c.is_variant_file],
        prompts,
        ref_model,
        model_cfg,
        cfg.runtimes,
        cfg.runtime_tokens,
        cfg.threads,
        missing=cfg.missing_runtimes,
        tolerances=tolerances,
    )
    for name, rt in on_device.items():  # a runtime's failure fails its variant's candidate
        results[name].checks += rt.checks
        results[name].runtimes = rt
    eval_report = EvalReport.read(cfg.eval_json).to_dict() if cfg.eval_json and Path(cfg.eval_json).is_file() else None
    task_figures = _score_tasks(cfg, eval_report, export_dir, candidates, ref_model, model_cfg, train_tok)
    base = lm_tasks.base_heldout(eval_report, info["model_sha256"], inputs)
    g_passed = all_passed(g_checks)
    variants = variant_results(results.values(), g_passed)
    files_sha256 = files_table_sha256(manifest.files_table())
    # the file vs the shipped conformance/tolerances.toml, over the tables this run gated
    tol_figures = compare_with_shipped(
        tolerances, tol_path, ["global", *dict.fromkeys(c.tolerance_table for c in candidates)]
    )
    report = {
        "format_version": FORMAT_VERSION,
        "entry": "conformance.run_conformance",
        "passed": bool(variants) and all(v.passed for v in variants) and g_passed,
        "variants": {v.name: v.passed for v in variants},
        "export_dir": str(export_dir.resolve()),
        "export_manifest_sha256": file_sha256(export_dir / "manifest.json"),  # before the verdict is written
        # stable under the verdict rewrite: sha256 of the manifest's "files" table as canonical JSON
        "export_files_sha256": files_sha256,
        "checkpoint": {"path": str(info["checkpoint_dir"]), "step": info["step"], "model_sha256": info["model_sha256"]},
        "tolerances_file": str(tol_path.resolve()),
        "tolerances_sha256": file_sha256(tol_path),
        "tolerances": tol_figures,
        "config": dict(vars(cfg)),
        "versions": tool_versions(),
        "model": {
            k: getattr(model_cfg, k)
            for k in (
                "vocab_size",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "max_position_embeddings",
            )
        },
        "inputs": {
            "prompts": inputs.texts,
            "items": {i.name: list(i.input_ids.shape) for i in inputs.items},
            "greedy_batch": list(inputs.greedy.input_ids.shape),
            "kv_sequence_tokens": int(inputs.kv_ids.shape[1]),
            "window": window,
            "heldout": inputs.heldout,
        },
        "reference": {
            "seconds": ref.seconds,
            "heldout_bpc": {lang: bits_per_char(ref.nll[lang], h["chars"]) for lang, h in inputs.heldout.items()},
        },
        "global": {"metrics": g, "checks": [c.to_dict() for c in g_checks], "passed": g_passed},
        "chat": chat,
        "runtimes": {"checked": list(cfg.runtimes), "prompts": prompts, "new_tokens": cfg.runtime_tokens},
        "candidates": {k: v.to_dict() for k, v in results.items()},
        "tasks": task_figures,
        "base": base,
        "seconds": time.perf_counter() - t_start,
    }
    return report, RunOutcome(variants, files_sha256, tol_figures)


def _score_tasks(cfg, eval_report, export_dir, candidates, ref_model, model_cfg, train_tok) -> Optional[dict[str, Any]]:
    """lm-evaluation-harness tasks on the checkpoint and each ONNX variant checked (``prodip.conformance.tasks``),
    or None when neither ``[conformance] tasks`` nor eval.json's names any."""
    settings = lm_tasks.task_plan(cfg, eval_report)
    if settings is None:
        return None
    onnx = {c.variant: c.path for c in candidates if c.kind == "onnx" and c.is_variant_file}
    return lm_tasks.evaluate_tasks(
        settings, export_dir, onnx, ref_model, model_cfg, train_tok, cfg.threads, eval_report=eval_report
    )


def _refuse_newer_report(out: Path) -> None:
    """Refuse to replace a ``report.json``/speed record in ``out`` written by a newer prodip.

    Raises:
        OutputExists: the earlier file was written by a newer prodip (its format_version named).
    """
    # none, or a damaged one: replaced
    refuse_newer(ConformanceReport, out / REPORT_FILE, action="prodip conformance", instead="give another --out")
    refuse_newer(speed.SpeedReport, out / speed.SPEED_FILE, action="prodip conformance", instead="give another --out")


def _remove_previous_report(out: Path) -> None:
    """Delete an earlier ``report.json``/``report.md`` in ``out`` once the new run's inputs were accepted and
    measuring starts, so a run that stops mid-way (a runtime crash, Ctrl-C) never leaves an older PASSED
    report looking current. A refused run (bad arguments or inputs) removes nothing.

    Raises:
        OutputExists: the earlier ``report.json`` was written by a newer prodip (its format_version
            named); nothing is deleted.
    """
    _refuse_newer_report(out)
    for name in ("report.json", "report.md", speed.SPEED_FILE):
        if (out / name).is_file():
            logger.info("conformance: removing the previous %s before this run", out / name)
            (out / name).unlink()


def _measure_speed(
    cfg: ConformanceConfig, report: dict[str, Any], previous: Optional[speed.SpeedReport]
) -> speed.SpeedReport:
    """Time every checked variant in every runtime that runs it (``prodip.conformance.speed``), from the English
    runtime prompt this report's runtimes decoded, cut to leave room for the new tokens in the checks' window, and
    merge the figures into ``previous`` (the earlier speed.json: :func:`speed.merge_speed` keeps the rows this run
    did not time when they are of the same export files, machine and settings)."""
    export_dir = Path(cfg.export_dir)
    manifest = load_manifest(export_dir)
    model_cfg = ModelConfig.from_hf_dict(json.loads((export_dir / "config.json").read_text(encoding="utf-8")))
    room = max(1, int(report["inputs"]["window"]) - cfg.speed_tokens)
    prompt = list(report["runtimes"]["prompts"]["en"])[:room]
    run = speed.measure_speed(
        export_dir,
        plan_candidates(manifest, cfg.variants),
        prompt,
        PROMPTS["en"],
        model_cfg,
        runtimes=cfg.runtimes,
        threads=cfg.threads,
        new_tokens=cfg.speed_tokens,
        rounds=cfg.speed_rounds,
        export_files_sha256=report["export_files_sha256"],
    )
    return speed.merge_speed(previous, run, {name: v.format for name, v in manifest.variants.items()})


def _write_quality_card(
    cfg: ConformanceConfig, report: dict[str, Any], speed_report: Optional[speed.SpeedReport] = None
) -> dict[str, Any]:
    """Write the quality card into the export's README.md from this report (figures measured once), and the speed
    table from ``speed_report`` after it.

    Rows of variants this run did not check are kept from the manifest's previous card when it was
    measured on the same export files (as :func:`merge_verdict` keeps their verdicts)."""
    export_dir = Path(cfg.export_dir)
    manifest = load_manifest(export_dir)
    eval_report = None
    if cfg.eval_json and Path(cfg.eval_json).is_file():
        eval_report = EvalReport.read(cfg.eval_json).to_dict()
    elif cfg.eval_json:
        logger.warning("conformance: %s not found; the card has no random-twin comparison", cfg.eval_json)
    rows, twin = card.quality_rows(report, manifest, eval_report)
    task_rows = (
        lm_tasks.card_rows(report["tasks"], eval_report, report["checkpoint"]["model_sha256"])
        if report.get("tasks")
        else []
    )
    task_settings = (report.get("tasks") or {}).get("settings")
    previous = manifest.card_quality
    if previous is not None and previous.export_files_sha256 == report["export_files_sha256"]:
        checked = {r.variant for r in rows}
        rows = [r for r in previous.rows if r.variant not in checked] + rows
        twin = twin or previous.twin
        if not task_rows:
            task_rows, task_settings = previous.tasks, previous.task_settings
        elif previous.tasks and previous.task_settings == task_settings:
            task_rows = lm_tasks.keep_unchecked(task_rows, previous.tasks, list(manifest.variants))
    extra: dict[str, Any] = {"tasks": task_rows, "task_settings": task_settings} if task_rows else {}
    forgetting = lm_tasks.forgetting_rows(report)
    if forgetting:
        extra["forgetting"] = forgetting
    if task_rows and cfg.task_peers:
        extra["task_peers"] = lm_tasks.read_peers(cfg.task_peers)
    quality = CardQuality(rows=rows, twin=twin, export_files_sha256=report["export_files_sha256"], **extra)
    card.write_quality(export_dir, quality, speed.render_speed(speed_report) if speed_report is not None else "")
    return quality.to_dict()


def run_conformance(cfg: ConformanceConfig) -> dict[str, Any]:
    """Check an export, write ``report.json`` + ``report.md`` and the manifest verdict.

    The verdict is merged into the manifest's slot (:func:`merge_verdict`): a run on some variants
    keeps the earlier verdicts of the others for the same export files.

    Args:
        cfg: the resolved config; ``out`` defaults to ``EXPORT_DIR/conformance``.
    Returns:
        The report dict (``report["passed"]`` is the verdict; ``report["report_json"]`` its path).
    Raises:
        ValueError / FileNotFoundError: see :func:`evaluate`; also ``out`` inside the export but
            outside its ``conformance/`` folder (nothing is written then).
        FileExistsError: ``out`` holds a ``report.json`` of a newer prodip.
        Every refusal comes before the previous report is removed: a refused run changes nothing.
    """

    out = Path(cfg.out) if cfg.out else Path(cfg.export_dir) / "conformance"
    export_root = Path(cfg.export_dir).resolve()
    if out.resolve().is_relative_to(export_root) and not out.resolve().is_relative_to(export_root / "conformance"):
        raise InvalidInput(
            f"ConformanceConfig.out={out} is inside the export but not under its conformance/ "
            "folder; files there would break the export's manifest (leave --out unset)"
        )
    # every refusal (an unreadable or newer export, a bad tolerance or peers file, no held-out text, a missing
    # variant file) comes before the previous report is removed: manifest.json names that report and its sha256
    if cfg.export_dir:  # an export of a newer prodip is named as such, before the other inputs are read
        load_manifest(export_root)
    _refuse_newer_report(out)
    checked = preflight_run(cfg)
    if cfg.task_peers:
        lm_tasks.read_peers(cfg.task_peers)
    # read before it is removed: a run on some variants or runtimes keeps the others' rows (speed.merge_speed)
    previous_speed = speed.read_previous(out / speed.SPEED_FILE) if cfg.speed else None
    _remove_previous_report(out)
    report, outcome = evaluate_run(cfg, checked)
    speed_report = _measure_speed(cfg, report, previous_speed) if cfg.speed else None
    report["speed"] = (
        {"file": speed.SPEED_FILE, "rows": len(speed_report.rows), "failed": len(speed_report.failed),
         "kept": sum(r.earlier for r in speed_report.entries()),
         "skipped": speed_report.skipped, "seconds": speed_report.seconds}
        if speed_report is not None else {"off": "[conformance] speed = false"}
    )  # fmt: skip
    if cfg.write_manifest and report["global"]["metrics"].get("card_ok"):
        report["card_quality"] = _write_quality_card(cfg, report, speed_report)
    paths = write_report(report, out, cfg)
    if speed_report is not None:
        speed_report.write(out / speed.SPEED_FILE)
    report["report_json"] = str(paths["json"])
    if cfg.write_manifest:
        export_dir = Path(cfg.export_dir).resolve()
        rj = paths["json"].resolve()
        rel = rj.relative_to(export_dir).as_posix() if rj.is_relative_to(export_dir) else str(rj)
        manifest = load_manifest(export_dir)
        set_conformance(
            export_dir,
            merge_verdict(manifest.conformance, outcome, list(manifest.variants), rel, paths["sha256"]),
        )
    logger.info("conformance %s: %s", "PASSED" if report["passed"] else "FAILED", paths["md"])
    return report
