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
``generation_config.json``. ``past_present_share_buffer`` is false: the decoder takes a cache of
exactly ``past`` positions and an ``attention_mask`` of ``past + T`` (its contract refuses any
other length), not a preallocated buffer of ``max_length``.

    python -c "from prodip.export.genai import genai_config; import json; print(json.dumps(genai_config({'vocab_size': 8, 'hidden_size': 8, 'num_attention_heads': 2, 'num_key_value_heads': 1, 'num_hidden_layers': 1, 'head_dim': 4, 'max_position_embeddings': 16, 'bos_token_id': 1, 'eos_token_id': 2, 'pad_token_id': 0}, {}, 'onnx/model.onnx'), indent=1))"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from prodip.base.variants import BY_NAME

GENAI_CONFIG = "genai_config.json"
#: Which ONNX variant ``og.Model(EXPORT_DIR)`` loads: the first of these that the export has.
DEFAULT_ORDER = ("int4", "int8", "fp16", "fp32")


def genai_config(config: dict[str, Any], generation_config: dict[str, Any], onnx_file: str) -> dict[str, Any]:
    """The ``genai_config.json`` dict for one ONNX decoder.

    Args:
        config: the export's ``config.json`` (HF Llama field names).
        generation_config: its ``generation_config.json`` (``max_length``, ``do_sample``,
            ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, token ids; absent keys
            take transformers' defaults).
        onnx_file: the decoder's path relative to the export dir, e.g. ``onnx/model_q4.onnx``.
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
        "type": "llama",
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
        "past_present_share_buffer": False,
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


def genai_overlay(onnx_file: str) -> dict[str, Any]:
    """What ``og.Config(EXPORT_DIR).overlay(json.dumps(...))`` needs to load ``onnx_file`` instead."""
    return {"model": {"decoder": {"filename": onnx_file}}}


def default_variant(onnx_variants: dict[str, str]) -> Optional[str]:
    """The variant named in ``genai_config.json``: the first of :data:`DEFAULT_ORDER` present."""
    return next((v for v in DEFAULT_ORDER if v in onnx_variants), None)


def transformersjs_config(onnx_variants: dict[str, str]) -> dict[str, Any]:
    """The ``transformers.js_config`` entry of ``config.json``: the default ``dtype`` (the variant
    :func:`default_variant` picks, as its transformers.js dtype), so ``from_pretrained(dir)`` without a
    dtype loads a file the export has (transformers.js's own default is fp32 in Node, q8 on WASM).

    Args:
        onnx_variants: variant name -> ONNX path relative to the export dir.
    """
    name = default_variant(onnx_variants)
    return {"dtype": BY_NAME[name].transformersjs_dtype} if name else {}


def write_genai_config(export_dir: str | Path, onnx_variants: dict[str, str]) -> Optional[str]:
    """Write ``EXPORT_DIR/genai_config.json`` for the default variant.

    Args:
        export_dir: folder holding ``config.json`` and ``generation_config.json``.
        onnx_variants: variant name -> ONNX path relative to ``export_dir``.
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
    text = json.dumps(genai_config(config, gen, onnx_variants[name]), indent=2) + "\n"
    (export_dir / GENAI_CONFIG).write_text(text, encoding="utf-8")
    return name
