"""``prodip export``: checkpoint -> HF safetensors + ONNX fp32/fp16/int8/int4 (+ GGUF, ExecuTorch) + manifest.json.

Everything is built in a hidden temporary folder beside the target and renamed into place at
the end, so an export dir either is complete (with its manifest) or does not exist. Temporary
folders left by a killed export (``.OUT.tmp.<pid>`` whose process is gone) are removed by the next one.

    prodip export runs/demo/train --out runs/demo/export
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from prodip.base.chat import CHAT_TEMPLATE_FILE, chat_contract
from prodip.base.config import dump_toml, to_dict
from prodip.base.errors import InvalidInput, MissingInput, OutputExists
from prodip.base.files import writing
from prodip.base.manifest import MANIFEST_FILE, Card, write_manifest
from prodip.base.specials import read_specials
from prodip.base.variants import (
    BY_NAME,
    DERIVED_ONNX_VARIANTS,
    GGUF_VARIANTS,
    ONNX_DIR,
    ONNX_SOURCE,
    ONNX_VARIANTS,
    PTE_DIR,
    PTE_VARIANTS,
    onnx_files,
    wasm_page_entry,
)
from prodip.export import card as model_card
from prodip.export import executorch as pte_export
from prodip.export import genai, hf, quantize, web
from prodip.export import gguf as gguf_export
from prodip.export.config import VARIANTS, ExportConfig
from prodip.export.limits import check_int4_block_size
from prodip.export.onnx import check_io, export_onnx, resolve_graph
from prodip.export.records import earlier_export, onnx_variant_entry, size_table
from prodip.tokenizer.bpe import TrainInfo, read_train_info
from prodip.tokenizer.portable import require_portable
from prodip.train.checkpoint import (
    TRAINER_STATE_FILE,
    is_hf_folder,
    load_model,
    require_checkpoint_tokenizer,
)
from prodip.train.records import TrainerState

logger = logging.getLogger("export")

ONNX_FILES = onnx_files()
CONFIG_TOML = "export_config.toml"


#: Third-party loggers that narrate every node at INFO; kept at WARNING during an export.
_CHATTY_LOGGERS = (
    "onnxscript",
    "onnx_ir",
    "onnxruntime",
    "torch.onnx",
    "torch.export",
    "torch._export",
    "torch._dynamo",
    "torch.fx",
)


@contextmanager
def _quiet_third_party() -> Iterator[None]:
    saved = {name: logging.getLogger(name).level for name in _CHATTY_LOGGERS}
    for name in _CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR if name.startswith("torch") else logging.WARNING)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


@contextmanager
def _phase(index: int, total: int, name: str) -> Iterator[None]:
    """Print ``[export i/n] name ...`` and the phase's wall time when it ends."""
    print(f"[export {index}/{total}] {name} ...", flush=True)
    t0 = time.perf_counter()
    yield
    print(f"[export {index}/{total}] {name}: {time.perf_counter() - t0:.1f} s", flush=True)


def check_out_dir(out: Path, force: bool) -> None:
    """Refuse to overwrite a non-empty ``out`` without ``force``, and with it unless ``out`` is an export.

    ``--force`` replaces an earlier export only: a folder whose ``manifest.json`` is an export
    manifest (``format_version``, ``source_checkpoint``, ``files``, ``variants``) and that holds no
    file the manifest does not list (``conformance/`` reports aside). Any other non-empty folder, or a
    symbolic link, is refused even with ``force``, so a mistyped ``--out`` never deletes files
    prodip did not write.

    Raises:
        FileExistsError: ``out`` exists and is not empty (pass --force to replace an export), holds
            something that is not an export (no manifest, or one that is not an export manifest), an
            export of a newer prodip (its manifest's format_version named), or is a file.
    """
    if out.is_symlink():
        raise OutputExists(
            f"{out}: is a symbolic link; give --out as the real folder path "
            f"(the export replaces the folder, not what a link points to)"
        )
    if out.is_file():
        raise OutputExists(f"{out}: is a file; --out must name a folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not force:
        raise OutputExists(f"{out}: exists and is not empty; choose another --out or pass --force")
    manifest = earlier_export(out)
    listed = set(manifest.files)
    # every file there must be one the export wrote (its manifest lists it), or the manifest itself
    strays = [
        p
        for p in out.rglob("*")
        if p.is_file()
        and p.relative_to(out).as_posix() not in listed
        and p.name != MANIFEST_FILE
        and not p.relative_to(out).as_posix().startswith("conformance/")
    ]
    if strays:
        raise OutputExists(
            f"{out}: holds files its export manifest does not list ({strays[0].relative_to(out)}"
            f"{f' and {len(strays) - 1} more' if len(strays) > 1 else ''}); --force only "
            f"replaces an export as written. Move those files, or choose another --out"
        )


def _pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this machine (``os.kill(pid, 0)``; EPERM counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temp_dirs(out: Path) -> list[Path]:
    """Delete ``.{out.name}.tmp.<pid>`` / ``.{out.name}.old.<pid>`` folders beside ``out`` left by a
    killed export (SIGKILL skips the cleanup), when process ``pid`` no longer exists.

    A folder whose pid is alive (another export running now, or pid reuse) is kept.

    Args:
        out: the export dir about to be written.
    Returns:
        The folders removed (each logged at WARNING with its size in MiB).
    """
    parent = out.parent
    if not parent.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.(tmp|old)\.(\d+)$")
    removed = []
    for path in sorted(parent.iterdir()):
        m = pattern.match(path.name)
        if not m or not path.is_dir() or path.is_symlink() or _pid_alive(int(m.group(2))):
            continue
        mib = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
        shutil.rmtree(path, ignore_errors=True)
        logger.warning("removed %s (%.1f MiB) left by export process %s, which no longer runs", path, mib, m.group(2))
        removed.append(path)
    return removed


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished temp dir to ``out``, replacing an old ``out`` (only after success)."""
    if out.exists():
        old = out.with_name(f".{out.name}.old.{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def _build_onnx(model: Any, root: Path, cfg: ExportConfig, step) -> dict[str, dict[str, Any]]:
    """Write the requested ONNX variants into ``root/onnx``; returns their manifest entries."""
    wanted = [v for v in ONNX_VARIANTS if v in cfg.variants]
    if not wanted:
        return {}
    (root / ONNX_DIR).mkdir()
    fp32 = root / ONNX_FILES["fp32"]
    graph = resolve_graph(cfg.onnx_graph, model.config)
    with step(f"ONNX fp32 decoder ({graph} graph, opset {cfg.opset})"):
        export_onnx(model, fp32, opset=cfg.opset, external_data=cfg.onnx_external_data or None, graph=graph)
        check_io(fp32, model.config)
    out = {"fp32": onnx_variant_entry("fp32", ONNX_FILES["fp32"], "float32", None, root)}
    ext = bool(out["fp32"]["external_data"])  # the derived files follow the fp32 file's layout
    builders = {
        "fp16": ("float16", lambda dst: quantize.to_fp16(fp32, dst, external_data=ext)),
        "int8": (
            "int8",
            lambda dst: quantize.to_int8(
                fp32,
                dst,
                block_size=cfg.int8_block_size,
                quantize_embeddings=cfg.int8_quantize_embeddings,
                external_data=ext,
            ),
        ),
        "int4": (
            "int4",
            lambda dst: quantize.to_int4(
                fp32,
                dst,
                block_size=cfg.int4_block_size,
                symmetric=cfg.int4_symmetric,
                quantize_embeddings=cfg.int4_quantize_embeddings,
                quantize_lm_head=cfg.int4_quantize_lm_head,
                accuracy_level=cfg.int4_accuracy_level,
                # ONNX Runtime's QDQ fusion gives the qdq file's MatMulNBits its default accuracy level only
                layout="qdq" if cfg.int4_accuracy_level == quantize.QDQ_FUSED_ACCURACY_LEVEL else "matmulnbits",
                external_data=ext,
            ),
        ),
    }
    for name in [w for w in wanted if w != "fp32"]:
        dtype, build = builders[name]
        with step(f"ONNX {name} ({'float16 conversion' if name == 'fp16' else 'quantisation'})"):
            params = build(root / ONNX_FILES[name])
            check_io(root / ONNX_FILES[name], model.config)
        out[name] = onnx_variant_entry(name, ONNX_FILES[name], dtype, params, root)
    if "fp32" not in cfg.variants:  # built only as the source of the others
        for rel in [ONNX_FILES["fp32"], *out.pop("fp32")["external_data"]]:
            (root / rel).unlink()
    for entry in out.values():  # contrib: ONNX Runtime's fused operators; standard: ONNX operators only
        entry["graph"] = graph
    return out


def check_onnx_targets(config: Any, cfg: ExportConfig) -> None:
    """Refuse ONNX variant options the model's sizes make void (nothing written yet; the option ranges
    themselves were checked by :class:`ExportConfig`).

    Raises:
        InvalidInput: an int4 block size that blocks none of the MatMul weights
            (:func:`prodip.export.limits.check_int4_block_size`).
    """
    if "int4" in cfg.variants:
        qdq = cfg.int4_accuracy_level == quantize.QDQ_FUSED_ACCURACY_LEVEL  # the layout _build_onnx picks
        check_int4_block_size(config, cfg.int4_block_size, qdq=qdq)


def check_device_targets(config: Any, cfg: ExportConfig, tokenizer_dir: Optional[Path]) -> None:
    """Refuse GGUF/.pte variants the model or tokenizer cannot be represented in (nothing written yet).

    Raises:
        InvalidInput: naming the target and the limit (see ``export.gguf.check_representable`` and
            ``export.executorch.check_representable``), or a GGUF without a tokenizer dir.
        MissingInput: the ``gguf``/``executorch`` package (pip extra ``runtimes``) is not installed.
    """
    wanted = [v for v in cfg.variants if v in GGUF_VARIANTS or v in PTE_VARIANTS]
    for name in wanted:
        module = "gguf" if name in GGUF_VARIANTS else "executorch"
        if importlib.util.find_spec(module) is None:
            raise MissingInput(
                f"variant {name} needs the {module!r} package: pip install -e '.[runtimes]' "
                "(gguf for llama.cpp files, executorch for .pte programs)"
            )
    if any(v in GGUF_VARIANTS for v in wanted):
        if tokenizer_dir is None:
            raise InvalidInput("GGUF variants carry the tokenizer; this export has no tokenizer dir")
        tokens = gguf_export.tokenizer_size(Path(tokenizer_dir))
        for name in (v for v in wanted if v in GGUF_VARIANTS):
            gguf_export.check_representable(config, name, tokens)
        gguf_export.check_tokenizer(Path(tokenizer_dir))
        if "gguf-q4_k_m" in wanted:
            gguf_export.llama_cpp_lib_dir()
    for name in (v for v in wanted if v in PTE_VARIANTS):
        pte_export.check_representable(config, name, cfg.pte_group_size, cfg.pte_max_seq_len)
    if any(v in PTE_VARIANTS for v in wanted) and tokenizer_dir is not None:
        require_portable(tokenizer_dir, "executorch")


def _build_devices(
    model: Any, root: Path, cfg: ExportConfig, tokenizer_dir: Optional[Path], step, card: Card
) -> dict[str, dict[str, Any]]:
    """Write the requested GGUF and ExecuTorch variants; returns their manifest entries."""
    out: dict[str, dict[str, Any]] = {}
    for name in (v for v in GGUF_VARIANTS if v in cfg.variants):
        v = BY_NAME[name]
        with step(f"GGUF {name} (llama.cpp)"):
            quant = gguf_export.export_gguf(model, Path(tokenizer_dir), root / v.path, name, card=card)
        out[name] = {"path": v.path, "format": "gguf", "dtype": v.dtype, "quantization": quant}
    pte = [v for v in PTE_VARIANTS if v in cfg.variants]
    chat = chat_contract(tokenizer_dir) if tokenizer_dir else None
    if pte:
        tok = pte_export.write_tokenizer(Path(tokenizer_dir), root / PTE_DIR) if tokenizer_dir else None
        tok_rel = tok.relative_to(root).as_posix() if tok else None
        if chat is not None:  # ExecuTorch's tokenizers have no template engine: the app reads this file
            (root / PTE_DIR / CHAT_TEMPLATE_FILE).write_text(chat["chat_template"], encoding="utf-8")
        bos, eos = model.config.bos_token_id, model.config.eos_token_id
        # the ids generation_config.json lists (hf.generation_config): eos, end of turn, an import's others
        stops = read_specials(tokenizer_dir).stop_ids if tokenizer_dir else ()
        eos_ids = list(dict.fromkeys([eos, *([] if chat is None else [chat["end_of_turn_id"]]), *stops]))
    for name in pte:
        v = BY_NAME[name]
        with step(f"ExecuTorch {name} (XNNPACK)"):
            quant = pte_export.export_pte(
                model,
                root / v.path,
                name,
                bos_id=bos,
                eos_ids=eos_ids,
                group_size=cfg.pte_group_size,
                max_seq_len=cfg.pte_max_seq_len,
            )
        # the program's KV-cache window (tokens): conformance checks it within this window
        window = cfg.pte_max_seq_len or model.config.max_position_embeddings
        out[name] = {
            "path": v.path,
            "format": "pte",
            "dtype": v.dtype,
            "quantization": quant,
            "tokenizer": tok_rel,
            "max_seq_len": window,
        }
    return out


def export_model(
    model: Any,
    cfg: ExportConfig,
    *,
    tokenizer_dir: Optional[Path],
    source_checkpoint: dict[str, Any],
    tokenizer_sha256: Optional[str],
    data_card: Optional[dict[str, Any]] = None,
    tokenizer_info: Optional[TrainInfo] = None,
) -> Path:
    """Export an in-memory ``prodip.train.model.LlamaForCausalLM`` into ``cfg.out`` (atomically).

    Args:
        model: the model (eval mode; any parameter dtype, ONNX is traced in float32).
        cfg: export settings (``cfg.checkpoint`` is only recorded).
        tokenizer_dir: folder with ``tokenizer.json`` etc. to copy, or None for none.
        source_checkpoint: ``{"path", "step", "model_sha256"}`` for the manifest.
        tokenizer_sha256: sha256 of ``tokenizer.json`` for the manifest.
        data_card: the checkpoint's ``data_card`` (sources, tokens seen, base model) for the model card
            (``prodip.export.card``); None: the card says the training data is unrecorded.
        tokenizer_info: the tokenizer's ``train_info.json`` (``prodip.tokenizer.bpe.read_train_info``: its inputs'
            records and word-count tables, e.g. wordfreq's CC-BY-SA lists), or None.
    Returns:
        The export dir ``cfg.out``.
    Raises:
        FileExistsError: ``cfg.out`` is not empty and ``cfg.force`` is false.
        FileNotFoundError: ``tokenizer_dir`` lacks ``tokenizer.json``.
    """
    out = Path(cfg.out)
    check_out_dir(out, cfg.force)
    check_onnx_targets(model.config, cfg)  # refused before anything is written
    check_device_targets(model.config, cfg, tokenizer_dir)
    if tokenizer_dir is not None:
        chat_contract(tokenizer_dir)  # a half chat tokenizer (template without markers) too
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_dirs(out)
    tmp = out.with_name(f".{out.name}.tmp.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    derived = sum(v in cfg.variants for v in DERIVED_ONNX_VARIANTS)
    devices = sum(v in cfg.variants for v in (*GGUF_VARIANTS, *PTE_VARIANTS))
    onnx_any = derived > 0 or ONNX_SOURCE in cfg.variants
    total = 2 + derived + 3 * onnx_any + devices  # ONNX: the fp32 graph, the runtime packages, the page
    counter = iter(range(1, total + 1))
    step = lambda name: _phase(next(counter), total, name)  # noqa: E731
    t0 = time.perf_counter()
    try:
        with _quiet_third_party(), writing(tmp, shown_as=out):  # a full disk: one line naming the file
            _build_all(
                model, cfg, tmp, tokenizer_dir, source_checkpoint, tokenizer_sha256, step, data_card, tokenizer_info
            )
        check_out_dir(out, cfg.force)  # again: someone may have written there meanwhile
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(size_table(out), flush=True)
    print(f"[export] done in {time.perf_counter() - t0:.1f} s -> {out}", flush=True)
    return out


def _build_all(
    model: Any,
    cfg: ExportConfig,
    tmp: Path,
    tokenizer_dir: Optional[Path],
    source_checkpoint: dict[str, Any],
    tokenizer_sha256: Optional[str],
    step,
    data_card: Optional[dict[str, Any]] = None,
    tokenizer_info: Optional[TrainInfo] = None,
) -> None:
    """Write every requested artifact and the manifest into the private folder ``tmp``."""
    card = model_card.build_card(data_card, tokenizer_info, cfg.base_model_id)
    with step(f"HF layout (config.json, model.safetensors {cfg.safetensors_dtype}, tokenizer)"):
        hf.write_hf(model, tmp, dtype=cfg.safetensors_dtype, tokenizer_dir=tokenizer_dir)
    # model.safetensors is always written (it is what transformers loads), so it is always a variant:
    # listed in the manifest and checked by conformance, whatever `variants` names
    variants = {
        "safetensors": {
            "path": hf.WEIGHTS_FILE,
            "format": "safetensors",
            "dtype": cfg.safetensors_dtype,
            "quantization": None,
        }
    }
    variants.update(_build_onnx(model, tmp, cfg, step))
    if any(v["format"] == "onnx" for v in variants.values()):
        with step("ONNX runtime packages (weights in <file>_data, onnxruntime-genai shared-buffer graphs)"):
            _write_runtime_configs(tmp, variants)
        with step("browser page (index.html; web/: transformers.js, onnxruntime-web's WASM build)"):
            if web.library_sources() is None:
                logger.warning("browser page without its library files: %s not installed", web.node_modules())
            web.write_web_page(tmp)
    variants.update(_build_devices(model, tmp, cfg, tokenizer_dir, step, card))
    with step("manifest.json (sha256 of every file), README.md model card, licence metadata"):
        model_card.write_card(tmp, card, variants)
        (tmp / CONFIG_TOML).write_text(dump_toml({"export": to_dict(cfg)}), encoding="utf-8")
        for path in tmp.rglob("*"):  # onnx/safetensors create some files 0600; exports are shared
            path.chmod(0o755 if path.is_dir() else 0o644)
        write_manifest(
            tmp,
            source_checkpoint=source_checkpoint,
            tokenizer_sha256=tokenizer_sha256,
            variants=variants,
            export_config=dataclasses.asdict(cfg),
            card=card,
        )


def _write_runtime_configs(root: Path, variants: dict[str, dict[str, Any]]) -> None:
    """onnxruntime-genai's ``genai_config.json`` and transformers.js's ``config.json`` entry, and per
    ONNX variant in its manifest entry: ``transformersjs_dtype``, ``genai_overlay`` (what
    ``og.Config.overlay`` needs to load it), ``genai_default`` (named by ``genai_config.json``).
    A contrib (GroupQueryAttention) variant's weights move to ``<file>_data``, read by both its
    graph and its shared-buffer graph for onnxruntime-genai (``genai_path``, ``genai.write_genai_graph``);
    a standard graph's external weights (over 2 GB, or asked for) move there too, for transformers.js."""
    onnx_paths = {name: v["path"] for name, v in variants.items() if v["format"] == "onnx"}
    shared: dict[str, str] = {}  # variant -> its shared-buffer graph (contrib graphs: GroupQueryAttention)
    for name, path in onnx_paths.items():
        contrib = variants[name].get("graph") == "contrib"
        if contrib or variants[name].get("external_data"):  # one weights file, under transformers.js's name
            variants[name]["external_data"] = [genai.move_weights_out(root, path)]
            if (
                isinstance(variants[name].get("quantization"), dict)
                and "external_data" in variants[name]["quantization"]
            ):
                variants[name]["quantization"]["external_data"] = True  # where the weights ended up
        if contrib:
            shared[name] = variants[name]["genai_path"] = genai.write_genai_graph(root, path)
    default = genai.default_variant(onnx_paths)
    genai.write_genai_config(root, onnx_paths, shared_graph=shared.get(default))
    config_path = root / hf.CONFIG_FILE
    config = json.loads(config_path.read_text(encoding="utf-8"))
    external = [p for n, p in onnx_paths.items() if variants[n].get("external_data")]  # every one <file>_data
    config["transformers.js_config"] = genai.transformersjs_config(onnx_paths, external)
    wasm = _write_wasm_int4(root, variants)
    if wasm is not None:
        config["transformers.js_config"]["prodip_wasm_q4"] = wasm
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    for name, path in onnx_paths.items():
        variants[name].update(
            transformersjs_dtype=BY_NAME[name].transformersjs_dtype,
            genai_overlay=(
                genai.genai_overlay(shared[name], share_buffer=True) if name in shared else genai.genai_overlay(path)
            ),
            genai_default=name == default,
        )


def _write_wasm_int4(root: Path, variants: dict[str, dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The int4 variant's file for onnxruntime-web's WASM build (:func:`quantize.to_int4_wasm`), beside it.

    Written when the int4 variant is the qdq layout; recorded in its manifest entry (``wasm_path``, ``wasm``: the
    writer's parameters; its size, what it adds to the export, is in the manifest's ``files``). Returns the
    ``transformers.js_config.prodip_wasm_q4`` entry the export's page reads (transformers.js
    ``model_file_name``, the ``externalData`` it passes to onnxruntime-web: the int4 file's weights,
    read by both graphs, and the session options), or None when not written.
    """
    entry = variants.get("int4")
    quant = entry.get("quantization") if entry else None
    if entry is None or not isinstance(quant, dict) or quant.get("format") != "QDQ":
        return None
    src = root / entry["path"]
    rel = str(Path(entry["path"]).with_name(f"{quantize.WASM_INT4_MODEL_FILE_NAME}_q4.onnx"))
    params = quantize.to_int4_wasm(src, root / rel)
    entry.update(wasm_path=rel, wasm=params)
    return wasm_page_entry(entry["path"], rel, params)


def export_checkpoint(cfg: ExportConfig) -> Path:
    """Export a training checkpoint: the Python entry of ``prodip export`` and ``prodip run``.

    Args:
        cfg: export settings; ``cfg.checkpoint`` is a step dir, checkpoints dir or run dir.
    Returns:
        The export dir.
    Raises:
        ValueError: empty ``checkpoint``/``out``; a checkpoint file whose sha256 differs from its
            manifest, or a missing/extra/mis-shaped tensor (named, with both shapes), from
            ``prodip.train.checkpoint.load_model``.
        FileNotFoundError: no checkpoint at ``cfg.checkpoint``, or it lacks ``tokenizer/tokenizer.json``.
        FileExistsError: ``cfg.out`` is not empty and ``cfg.force`` is false.
    """
    if not cfg.checkpoint:
        raise InvalidInput("ExportConfig.checkpoint is empty: give a checkpoint/run dir made by `prodip train`")
    if not cfg.out:
        raise InvalidInput("ExportConfig.out is empty: give the export dir to create (--out DIR)")
    check_out_dir(Path(cfg.out), cfg.force)  # fail before the (slow) load
    if is_hf_folder(cfg.checkpoint):
        return export_hf_folder(cfg)
    ckpt = require_checkpoint_tokenizer(cfg.checkpoint).resolve()
    out_real = Path(cfg.out).resolve()
    if ckpt == out_real or out_real in ckpt.parents:
        raise InvalidInput(
            f"--out {cfg.out} contains the checkpoint {cfg.checkpoint}; replacing it would delete "
            f"the checkpoint being exported. Choose another --out"
        )
    model, _, info = load_model(ckpt)
    state = TrainerState.read(Path(info["checkpoint_dir"]) / TRAINER_STATE_FILE)
    resolve_graph(cfg.onnx_graph, model.config)  # --onnx-graph contrib on a shape it cannot run: before any work
    source = {
        "path": str(Path(info["checkpoint_dir"]).resolve()),
        "step": info["step"],
        "model_sha256": info["model_sha256"],
    }
    return export_model(
        model,
        cfg,
        tokenizer_dir=Path(info["tokenizer_dir"]),
        source_checkpoint=source,
        tokenizer_sha256=info["tokenizer_sha256"],
        data_card=state.data_card,
        tokenizer_info=read_train_info(Path(info["tokenizer_dir"])),
    )


def export_hf_folder(cfg: ExportConfig) -> Path:
    """Export a Hugging Face Llama folder unchanged (``prodip export HF_FOLDER``): its weights, its own
    tokenizer, special tokens and chat template, no training step.

    The folder is read as ``prodip train --init-from`` reads it (:func:`prodip.train.init.load_init`;
    what prodip's Llama cannot compute is refused naming the config key), so the export's logits are
    the folder's. The card's ``base_model`` is ``cfg.base_model_id``, else the config's
    ``_name_or_path`` when it looks like a Hub id (``owner/name``), else none; the local path is
    recorded only in the manifest.

    Raises:
        MissingInput: no ``tokenizer.json`` in the folder (its tokenizer travels into every artifact).
        InvalidInput: see :func:`prodip.train.init.hf_model_config` (a missing size key named) and
            :func:`prodip.train.init.apply_init` (a tensor the config does not imply), each naming ``prodip export``.
    """
    from prodip.base.files import file_sha256  # noqa: PLC0415
    from prodip.train.init import apply_init, load_init  # noqa: PLC0415
    from prodip.train.model import LlamaForCausalLM  # noqa: PLC0415

    folder = Path(cfg.checkpoint).resolve()
    if not (folder / "tokenizer.json").is_file():
        raise MissingInput(
            f"{folder / 'tokenizer.json'}: not found; `prodip export HF_FOLDER` ships the folder's own fast "
            "tokenizer (save it with tokenizer.save_pretrained into the folder)"
        )
    out_real = Path(cfg.out).resolve()
    if folder == out_real or out_real in folder.parents:
        raise InvalidInput(f"--out {cfg.out} contains the folder {cfg.checkpoint} being exported; choose another --out")
    # errors name the command the user typed, not train's --init-from
    init = load_init(folder, tokenizer_sha256=None, option="prodip export")
    model = LlamaForCausalLM(init.config)
    apply_init(model, init)
    model.eval()
    resolve_graph(cfg.onnx_graph, model.config)
    weights = folder / hf.WEIGHTS_FILE
    source = {
        "path": str(folder),
        "step": 0,
        "model_sha256": file_sha256(weights) if weights.is_file() else "",
    }
    return export_model(
        model,
        cfg,
        tokenizer_dir=folder,
        source_checkpoint=source,
        tokenizer_sha256=file_sha256(folder / "tokenizer.json"),
        data_card={"imported": model_card.imported_base(folder, cfg.base_model_id)},
    )


__all__ = [
    "ExportConfig",
    "VARIANTS",
    "export_checkpoint",
    "export_model",
    "check_out_dir",
    "remove_stale_temp_dirs",
]
