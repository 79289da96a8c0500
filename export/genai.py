"""onnxruntime-genai's model package: ``genai_config.json`` for an export's ONNX decoder.

``og.Model(EXPORT_DIR)`` reads ``EXPORT_DIR/genai_config.json``, which names one ONNX file (its
``model.decoder.filename``, relative to the folder, no ``..``), so one folder holds one default
variant: :data:`DEFAULT_ORDER` picks it (int4 first: the smallest and fastest on CPU). Every other
variant is the same config with another file name, which onnxruntime-genai applies with
``og.Config.overlay``; the manifest lists it per variant (``variants[name].genai_overlay``) and
:func:`genai_overlay` builds it. The transformers.js layout keeps all variants in ``onnx/`` under
fixed names, so one folder per variant would mean a second copy of each file.

Fields follow what ``python -m onnxruntime_genai.models.builder`` writes for a Llama model
(type ``llama``, I/O names, sizes); token ids and search defaults come from ``config.json`` and
``generation_config.json``.

The KV cache. Every variant's own file keeps the decoder's contract (a cache of exactly ``past``
positions, an ``attention_mask`` of ``past + T``, masked slots zeroed), which a preallocated
buffer cannot meet, so overlaying it sets ``past_present_share_buffer`` false. For a variant of a
contrib (GroupQueryAttention) export, ``onnx/<file>_genai.onnx`` is the same decoder
made for onnxruntime-genai's shared past/present buffer
(:func:`prodip.export.graph.shared_buffer_graph`: no cache copy per step, as the model builder's
graphs), and ``genai_config.json`` names it with ``past_present_share_buffer`` true; every other
contrib variant has one too (its ``genai_overlay`` names it). The two graphs of a variant read the
same weights file, ``onnx/<file>_data`` (:func:`move_weights_out`): the layout transformers.js
loads with ``use_external_data_format``, which ``config.json`` sets per file.

    python -c "from prodip.export.genai import genai_config; import json; print(json.dumps(genai_config({'vocab_size': 8, 'hidden_size': 8, 'num_attention_heads': 2, 'num_key_value_heads': 1, 'num_hidden_layers': 1, 'head_dim': 4, 'max_position_embeddings': 16, 'bos_token_id': 1, 'eos_token_id': 2, 'pad_token_id': 0}, {}, 'onnx/model.onnx'), indent=1))"
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Optional

import onnx

from prodip.base.manifest import load_manifest
from prodip.base.variants import BY_NAME, GENAI_ORDER
from prodip.export.graph import shared_buffer_graph

GENAI_CONFIG = "genai_config.json"
#: Which ONNX variant ``og.Model(EXPORT_DIR)`` loads: the first of these that the export has.
DEFAULT_ORDER = GENAI_ORDER  # narrowest weights first: prodip.base.variants owns the order
#: Which ONNX variant transformers.js loads on its ``wasm`` device (onnxruntime-web's WASM build) when no
#: dtype is given: the first of these that the export has. Measured in Chromium (bench/browser.py,
#: bench/results/browser_2026-12-02.md): int8 (q8) decodes at or near fp32's speed at a quarter of its
#: bytes, while int4's MatMulNBits runs 3-5x slower than q8 in the WASM build (natively it is the fastest); the
#: page's int4 folded to fp32 at load runs at fp32's speed, still ~2x behind q8 (bench/results/browser_q4_2026-12-03.md).
WASM_ORDER = ("int8", "fp32", "int4", "fp16")


def genai_config(
    config: dict[str, Any], generation_config: dict[str, Any], onnx_file: str, share_buffer: bool = False
) -> dict[str, Any]:
    """The ``genai_config.json`` dict for one ONNX decoder.

    Args:
        config: the export's ``config.json`` (HF Llama field names).
        generation_config: its ``generation_config.json`` (``max_length``, ``do_sample``,
            ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, token ids; absent keys
            take transformers' defaults).
        onnx_file: the decoder's path relative to the export dir, e.g. ``onnx/model_q4.onnx``.
        share_buffer: ``past_present_share_buffer`` (only for a :func:`genai_graph_path` file).
    Returns:
        ``{"model": {...}, "search": {...}}``.
    """
    g = generation_config
    context = int(config["max_position_embeddings"])
    decoder = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "filename": onnx_file,
        "head_size": int(config["head_dim"]),
        "hidden_size": int(config["hidden_size"]),
        "num_attention_heads": int(config["num_attention_heads"]),
        "num_hidden_layers": int(config["num_hidden_layers"]),
        "num_key_value_heads": int(config["num_key_value_heads"]),
        "inputs": {
            "input_ids": "input_ids",
            "attention_mask": "attention_mask",
            "position_ids": "position_ids",
            "past_key_names": "past_key_values.%d.key",
            "past_value_names": "past_key_values.%d.value",
        },
        "outputs": {
            "logits": "logits",
            "present_key_names": "present.%d.key",
            "present_value_names": "present.%d.value",
        },
    }
    model = {
        "type": config.get("model_type", "llama"),  # onnxruntime-genai's names: "llama", "qwen2"
        "vocab_size": int(config["vocab_size"]),
        "context_length": context,
        "bos_token_id": g.get("bos_token_id", config.get("bos_token_id")),
        "eos_token_id": g.get("eos_token_id", config.get("eos_token_id")),
        "pad_token_id": g.get("pad_token_id", config.get("pad_token_id")),
        "decoder": decoder,
    }
    search = {
        "do_sample": bool(g.get("do_sample", False)),
        "max_length": int(g.get("max_length", context)),
        "min_length": int(g.get("min_length", 0)),
        "num_beams": int(g.get("num_beams", 1)),
        "num_return_sequences": 1,
        "past_present_share_buffer": bool(share_buffer),
        "temperature": float(g.get("temperature", 1.0)),
        "top_k": int(g.get("top_k", 50)),
        "top_p": float(g.get("top_p", 1.0)),
        "repetition_penalty": float(g.get("repetition_penalty", 1.0)),
        "length_penalty": float(g.get("length_penalty", 1.0)),
        "early_stopping": True,
        "diversity_penalty": 0.0,
        "no_repeat_ngram_size": int(g.get("no_repeat_ngram_size", 0)),
    }
    return {"model": model, "search": search}


def genai_overlay(onnx_file: str, share_buffer: bool = False) -> dict[str, Any]:
    """What ``og.Config(EXPORT_DIR).overlay(json.dumps(...))`` needs to load ``onnx_file`` instead
    (a variant's contract graph: no shared buffer; its :func:`genai_graph_path` file: shared)."""
    return {"model": {"decoder": {"filename": onnx_file}}, "search": {"past_present_share_buffer": bool(share_buffer)}}


def variant_overlay(export_dir: str | Path, onnx_file: str) -> dict[str, Any]:
    """The manifest's ``genai_overlay`` of the variant whose file is ``onnx_file`` (a copy), or, for a
    file no variant lists, :func:`genai_overlay` of it (no shared buffer)."""
    for variant in load_manifest(export_dir).variants.values():
        if variant.path == onnx_file and variant.genai_overlay is not None:
            return copy.deepcopy(variant.genai_overlay)
    return genai_overlay(onnx_file)


def genai_graph_path(onnx_file: str) -> str:
    """Where the shared-buffer graph of ``onnx_file`` goes: ``onnx/model_q4.onnx`` -> ``onnx/model_q4_genai.onnx``."""
    return onnx_file[: -len(".onnx")] + "_genai.onnx" if onnx_file.endswith(".onnx") else onnx_file + "_genai"


def weights_file(onnx_file: str) -> str:
    """The external-data file of an ONNX variant: ``onnx/model_q4.onnx`` -> ``onnx/model_q4.onnx_data``
    (the name transformers.js reads when ``use_external_data_format`` is set: ``<file>_data``)."""
    return onnx_file + "_data"


def move_weights_out(export_dir: str | Path, onnx_file: str) -> str:
    """Rewrite ``onnx_file`` (relative to ``export_dir``) with its weights in :func:`weights_file`, so that
    a second graph (:func:`write_genai_graph`) can read the same bytes; replaces a ``<file>.data``.

    Tensors under 1 KiB stay in the graph. Called on the export's private folder, which is renamed
    into place only when complete.

    Returns:
        The weights file's path relative to ``export_dir``.
    """
    root = Path(export_dir)
    src, rel = root / onnx_file, weights_file(onnx_file)
    model = onnx.load(str(src))  # reads a previous <file>.data too
    (root / rel).unlink(missing_ok=True)  # onnx appends to an existing external-data file
    onnx.save_model(
        model,
        str(src),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=Path(rel).name,
        size_threshold=1024,
    )
    (root / f"{onnx_file}.data").unlink(missing_ok=True)
    onnx.checker.check_model(str(src))
    return rel


def write_genai_graph(export_dir: str | Path, onnx_file: str) -> str:
    """Write :func:`genai_graph_path` of ``onnx_file`` (relative to ``export_dir``): the decoder made for
    a shared past/present buffer (:func:`prodip.export.graph.shared_buffer_graph`), reading the
    variant's own :func:`weights_file` (call :func:`move_weights_out` first): no second copy.

    Returns:
        The new file's path relative to ``export_dir``.
    Raises:
        ValueError: ``onnx_file`` is not a GroupQueryAttention decoder with the mask-length check,
            or its weights are not in :func:`weights_file`.
    """
    root = Path(export_dir)
    model = onnx.load(str(root / onnx_file), load_external_data=False)  # tensors stay references
    locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    if locations != {Path(weights_file(onnx_file)).name}:
        raise ValueError(f"{onnx_file}: weights in {sorted(locations)}, not {weights_file(onnx_file)}")
    rel = genai_graph_path(onnx_file)
    onnx.save_model(shared_buffer_graph(model), str(root / rel))
    onnx.checker.check_model(str(root / rel))
    return rel


def default_variant(onnx_variants: dict[str, str]) -> Optional[str]:
    """The variant named in ``genai_config.json``: the first of :data:`DEFAULT_ORDER` present."""
    return next((v for v in DEFAULT_ORDER if v in onnx_variants), None)


def transformersjs_config(onnx_variants: dict[str, str], external: Optional[list[str]] = None) -> dict[str, Any]:
    """The ``transformers.js_config`` entry of ``config.json``: the default ``dtype`` (the variant
    :func:`default_variant` picks, as its transformers.js dtype), so ``from_pretrained(dir)`` without a
    dtype loads a file the export has (transformers.js's own default is fp32 in Node, q8 on WASM);
    ``device_config.wasm.dtype``, the first of :data:`WASM_ORDER` present, which transformers.js applies
    over ``dtype`` on its ``wasm`` device (``getSession`` in ``src/models/session.js``, 4.3) and the export's
    page reads the same way; and ``use_external_data_format`` (file name -> 1 chunk, ``<file>_data``) for
    the ``external`` ones.

    Args:
        onnx_variants: variant name -> ONNX path relative to the export dir.
        external: those paths whose weights are in :func:`weights_file`.
    """
    name = default_variant(onnx_variants)
    out: dict[str, Any] = {"dtype": BY_NAME[name].transformersjs_dtype} if name else {}
    wasm = next((v for v in WASM_ORDER if v in onnx_variants), None)
    if wasm is not None and wasm != name:
        out["device_config"] = {"wasm": {"dtype": BY_NAME[wasm].transformersjs_dtype}}
    if external:
        out["use_external_data_format"] = {Path(p).name: 1 for p in external}
    return out


def write_genai_config(
    export_dir: str | Path, onnx_variants: dict[str, str], shared_graph: Optional[str] = None
) -> Optional[str]:
    """Write ``EXPORT_DIR/genai_config.json`` for the default variant.

    Args:
        export_dir: folder holding ``config.json`` and ``generation_config.json``.
        onnx_variants: variant name -> ONNX path relative to ``export_dir``.
        shared_graph: the default variant's :func:`write_genai_graph` file, if written: named
            instead of the variant's own file, with ``past_present_share_buffer`` true.
    Returns:
        The default variant's name, or None (no ONNX variant: nothing written).
    """
    export_dir = Path(export_dir)
    name = default_variant(onnx_variants)
    if name is None:
        return None
    config = json.loads((export_dir / "config.json").read_text(encoding="utf-8"))
    gen_path = export_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text(encoding="utf-8")) if gen_path.is_file() else {}
    table = genai_config(config, gen, shared_graph or onnx_variants[name], share_buffer=shared_graph is not None)
    (export_dir / GENAI_CONFIG).write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    return name
