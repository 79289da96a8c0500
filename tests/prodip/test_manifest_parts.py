"""The export manifest's typed parts (issue 22): ``card`` (written by prodip.export.card), ``card_quality``
(prodip.conformance.card), ``export_config`` (the resolved ExportConfig) and each variant's ``quantization``
(prodip.export.quantize / gguf / executorch), declared in prodip.base.manifest: read by attribute, written back
byte for byte, a mistyped field named by its path.

python -m pytest tests/prodip/test_manifest_parts.py -q
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re

import pytest

from prodip.base.manifest import (
    Card,
    CardQuality,
    CardSource,
    ExportManifest,
    ExportSettings,
    GgufQuantization,
    OnnxQuantization,
    PteQuantization,
)
from prodip.base.records import RecordError
from prodip.export.card import build_card
from prodip.export.config import ExportConfig
from prodip.tokenizer.bpe import TrainInfo
from prodip.tokenizer.wordcounts import WORDFREQ_LICENSE
from tests.fixtures import DATA_CARD
from tests.prodip.test_records import _ONNX_ENTRY

#: a fine-tuned checkpoint's data card: its base's pretraining sources (prodip.train.sft._base_sources: ``stage``
#: then ``tokens_seen``), a fine-tuning source (``stage``, ``files``), as train/sft.py writes them
_SFT_DATA_CARD = {
    "sources": [
        {**DATA_CARD["sources"][0], "stage": "pretraining", "tokens_seen": 3000},
        {**{k: v for k, v in DATA_CARD["sources"][2].items() if k != "documents"}, "stage": "pretraining"},
        {**{k: DATA_CARD["sources"][1][k] for k in list(DATA_CARD["sources"][1])[:12]}, "stage": "sft", "files": 2},
    ],
    "tokens_seen_by_language": {"bn": 4000, "en": 2000},
    "tokens_seen_by_source": {"bluck_bn_mcq.jsonl": 900},
    "init_from": {"source": "runs/base/checkpoints/step_0000100"},
}
#: the tokenizer's train_info.json with a wordfreq table (export.card.tokenizer_sources writes its entry in
#: another key order than a source record's card fields)
_TRAIN_INFO = {
    "format_version": 1,
    "kind": "portable",
    "vocab_size": 8192,
    "source_records": [],
    "sources": [
        {
            "language": "bn",
            "source": "wordfreq:bn",
            "kind": "word_counts",
            "license": dict(WORDFREQ_LICENSE, wordlist="large_bn"),
            "version": "3.1.1",
        }
    ],
}

_QUANTIZATION = {
    "fp16": {  # export.quantize.to_fp16
        "tool": "onnxruntime.transformers.float16.convert_float_to_float16",
        "keep_io_types": True,
        "op_block_list": ["Cos", "Softmax"],
        "rope_nodes_kept_fp32": 6,
        "rmsnorm_nodes_kept_fp32": 5,
        "fp16_round_trips_removed": 3,
        "external_data": False,
    },
    "int8": {  # export.quantize.to_int8, a tied embedding not shared
        "tool": "prodip.export.graph.quantize_matmuls_rowwise_int8",
        "algorithm": "RTN, symmetric",
        "format": "MatMulInteger (ONNX), uint8 x uint8, zero points 128",
        "bits": 8,
        "weight_granularity": "per output channel",
        "activation_quantization": "dynamic, per row (token) at run time, symmetric 8-bit; batch-invariant",
        "symmetric": True,
        "matmuls_quantized": 15,
        "op_types": ["MatMul", "Gather"],
        "embedding_quantized": True,
        "embedding_block_size": 16,
        "embedding_shared_with_lm_head": False,
        "embedding_lookup_lowered": 1,
        "materialized_transposes": 0,
        "external_data": True,
        "embedding_layout": "uint8 codes and scales",
        "embedding_not_shared_because": "share_tied_embedding=False",
    },
    "int4": _ONNX_ENTRY["quantization"],  # export.quantize.to_int4 (the entry test_records reads)
    "gguf-q4_k_m": {  # export.gguf.export_gguf
        "tensor_types": {"Q4_K": 10, "Q6_K": 4, "F32": 5},
        "pre": "granite-embed-multi-97m",
        "tokens": 512,
        "quantizer": "llama.cpp llama_model_quantize (LLAMA_FTYPE_MOSTLY_Q4_K_M)",
        "gguf_py_version": "0.17.1",
    },
    "pte-8da4w": {  # export.executorch.export_pte
        "scheme": "8da4w",
        "group_size": 32,
        "quantizer": "torchao Int8DynamicActivationIntxWeightConfig",
        "backend": "xnnpack",
        "runner_metadata": {
            "get_bos_id": 1,
            "get_eos_ids": [2, 4],
            "get_max_seq_len": 96,
            "get_max_context_len": 96,
            "get_vocab_size": 512,
            "get_n_layers": 2,
            "use_kv_cache": True,
            "use_sdpa_with_kv_cache": False,
            "enable_dynamic_shape": True,
        },
        "executorch_version": "1.0.0",
        "torchao_version": "0.14.0",
    },
}
_FORMAT = {"gguf-q4_k_m": "gguf", "pte-8da4w": "pte"}

_CARD_QUALITY = {  # conformance.card.quality_rows + suite._write_quality_card
    "rows": [
        {
            "variant": "safetensors",
            "language": "bn",
            "bpc": 3,
            "bpc_ref": 3,
            "bpc_delta": 0.0,
            "kl_mean": None,
            "kl_p999": None,
            "top1": None,
            "greedy_agreement": None,
            "bytes": 81920,
            "runtimes": ["transformers"],
        },
        {
            "variant": "int4",
            "language": "bn",
            "bpc": 3.0625,
            "bpc_ref": 3.0,
            "bpc_delta": 0.0625,
            "kl_mean": 0.0012,
            "kl_p999": 0.05,
            "top1": 0.97,
            "greedy_agreement": 0.875,
            "bytes": 20480,
            "runtimes": ["ONNX Runtime", "onnxruntime-genai"],
        },
    ],
    "twin": [{"language": "bn", "nll_token": 1.75, "bpc": 2.5, "random_nll_token": 6.25, "random_bpc": 9.0}],
    "export_files_sha256": "d" * 64,
}


def _manifest() -> dict:
    config = ExportConfig(checkpoint="runs/demo/train", out="runs/demo/export")
    return {
        "format_version": 1,
        "prodip_version": "0.1.0",
        "created_utc": "2026-12-01T00:00:00Z",
        "source_checkpoint": {"path": "/r/step_1", "step": 1, "model_sha256": "a" * 64},
        "tokenizer_sha256": "b" * 64,
        "versions": {"python": "3.12.0"},
        "files": {"onnx/model.onnx": {"bytes": 10, "sha256": "c" * 64}},
        "variants": {
            name: {
                "path": f"{name}.bin",
                "format": _FORMAT.get(name, "onnx"),
                "dtype": name,
                "quantization": copy.deepcopy(q),
            }
            for name, q in _QUANTIZATION.items()
        },
        "export_config": dataclasses.asdict(config),
        "card": build_card(_SFT_DATA_CARD, TrainInfo.from_dict(_TRAIN_INFO)).to_dict(),
        "conformance": None,
        "card_quality": copy.deepcopy(_CARD_QUALITY),
    }


def _text(data: dict) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"  # export's layout


def test_parts_read_by_attribute_and_written_back_byte_for_byte(tmp_path):
    data = _manifest()
    path = tmp_path / "manifest.json"
    path.write_text(_text(data), encoding="utf-8")
    m = ExportManifest.read(path)
    card, quality, settings = m.card, m.card_quality, m.export_config
    assert isinstance(card, Card) and isinstance(quality, CardQuality) and isinstance(settings, ExportSettings)
    assert card.license.license == "other" and card.license.license_name == "prodip-data-mix"
    assert card.base_model is None and card.statement.class_ == "unknown"  # a local checkpoint is no Hub id
    assert card.to_dict()["base_model_origin"] == "a prodip checkpoint"
    assert [(s.name, s.stage, s.tokens_seen) for s in card.sources] == [
        ("bn-news", "pretraining", 3000),
        ("en-novels", "pretraining", None),
        ("bluck_bn_mcq.jsonl", "sft", 900),
        ("wordfreq:bn", "tokenizer", None),
    ]
    assert card.sources[2].files == 2 and card.statement.share_alike == ["bn-news", "wordfreq:bn"]
    assert [(r.variant, r.bpc, r.kl_mean, r.bytes) for r in quality.rows] == [
        ("safetensors", 3, None, 81920),
        ("int4", 3.0625, 0.0012, 20480),
    ]
    assert isinstance(quality.rows[0].bpc, int)  # written as 3, not 3.0
    assert quality.twin[0].random_bpc == 9.0 and quality.export_files_sha256 == "d" * 64
    assert settings.variants == ["safetensors", "fp32", "fp16", "int8", "int4"] and settings.int4_block_size == 32
    fp16, int8, int4 = (m.variants[n].quantization for n in ("fp16", "int8", "int4"))
    assert isinstance(fp16, OnnxQuantization) and fp16.op_block_list == ["Cos", "Softmax"] and fp16.bits is None
    assert isinstance(int8, OnnxQuantization) and (int8.bits, int8.embedding_block_size) == (8, 16)
    assert isinstance(int4, OnnxQuantization) and (int4.block_size, int4.accuracy_level, int4.opset) == (32, 4, 21)
    gguf, pte = m.variants["gguf-q4_k_m"].quantization, m.variants["pte-8da4w"].quantization
    assert isinstance(gguf, GgufQuantization) and gguf.tensor_types["Q4_K"] == 10 and gguf.tokens == 512
    assert isinstance(pte, PteQuantization) and pte.runner_metadata.get_eos_ids == [2, 4] and pte.group_size == 32
    m.write(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text(encoding="utf-8") == _text(data)


def test_card_sources_keep_each_writers_key_order(tmp_path):
    """The card's sources come from several writers with their own key orders (a source record's card fields
    then its counts, fine-tuning's ``stage``/``files``, a wordfreq table's entry): each is written back as it
    was read."""
    data = _manifest()
    keys = [list(s) for s in data["card"]["sources"]]
    assert keys[3] == [
        "name",
        "language",
        "origin",
        "license",
        "license_class",
        "license_terms",
        "included_by_choice",
        "notes",
        "stage",
    ]
    assert keys[0][-2:] == ["stage", "tokens_seen"] and keys[2][-3:] == ["stage", "files", "tokens_seen"]
    card = ExportManifest.from_dict(data).card
    assert card is not None and [list(s) for s in card.to_dict()["sources"]] == keys
    assert list(card.to_dict()["statement"])[0] == "class"  # the file's key, not the attribute's name
    entry = card.sources[3].to_dict()
    again = CardSource.model_validate(dict(sorted(entry.items())))
    assert list(again.to_dict()) == sorted(entry) and again == card.sources[3]  # equal whatever the key order


def _set(path: str, value: object):
    """An edit of the manifest dict: ``value`` at dotted ``path`` (``...`` deletes the key)."""

    def edit(data: dict) -> None:
        *parents, last = path.split(".")
        node: object = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]  # type: ignore[index]
        if value is ...:
            del node[last]  # type: ignore[attr-defined]
        else:
            node[int(last) if isinstance(node, list) else last] = value  # type: ignore[index]

    return edit


@pytest.mark.parametrize(
    "path, value, field",
    [
        ("card_quality.rows.1.kl_mean", "small", "card_quality.rows.1.kl_mean"),
        ("card_quality.rows.1.bytes", ..., "card_quality.rows.1.bytes"),
        ("card_quality.rows.0.runtimes", "transformers", "card_quality.rows.0.runtimes"),
        ("card_quality.twin.0.bpc", [2.5], "card_quality.twin.0.bpc"),
        ("card.sources.2.tokens_seen", "many", "card.sources.2.tokens_seen"),
        ("card.sources.0.name", ..., "card.sources.0.name"),
        ("card.statement.class", ..., "card.statement.class"),
        ("card.statement.cleared", "no", "card.statement.cleared"),
        ("card.license.license", None, "card.license.license"),
        ("card.tokens_seen_by_language.bn", 1.5, "card.tokens_seen_by_language.bn"),
        ("export_config.opset", "18", "export_config.opset"),
        ("export_config.variants", ..., "export_config.variants"),
        ("variants.int4.quantization.bits", "4", "variants.int4.quantization.onnx.bits"),
        ("variants.fp16.quantization.tool", ..., "variants.fp16.quantization.onnx.tool"),
        (
            "variants.gguf-q4_k_m.quantization.tensor_types.Q4_K",
            1.5,
            "variants.gguf-q4_k_m.quantization.gguf.tensor_types.Q4_K",
        ),
        (
            "variants.pte-8da4w.quantization.runner_metadata.get_eos_ids",
            2,
            "variants.pte-8da4w.quantization.pte.runner_metadata.get_eos_ids",
        ),
    ],
)
def test_a_mistyped_part_is_named_by_its_path(tmp_path, path, value, field):
    data = _manifest()
    _set(path, value)(data)
    file = tmp_path / "manifest.json"
    file.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(RecordError, match=rf"manifest.json: field '{re.escape(field)}[.']"):  # [.]: int | float
        ExportManifest.read(file)


def test_quantization_of_another_format_is_refused(tmp_path):
    data = _manifest()
    data["variants"]["int4"]["quantization"] = _QUANTIZATION["gguf-q4_k_m"]
    file = tmp_path / "manifest.json"
    file.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(
        RecordError, match=r"field 'variants.int4': .*a gguf variant's, but the variant's format is 'onnx'"
    ):
        ExportManifest.read(file)


def test_export_settings_are_export_configs_fields_in_its_order():
    """``export_config`` is ``dataclasses.asdict(ExportConfig)``: the record declares exactly its fields, in its
    order (a field added to ExportConfig must be added here, or its manifest key is only an untyped extra)."""
    assert list(ExportSettings.model_fields) == [f.name for f in dataclasses.fields(ExportConfig)]
