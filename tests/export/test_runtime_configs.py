"""What the export writes for the on-device runtimes: genai_config.json, transformers.js names and config."""

from __future__ import annotations

import json

from prodip.base.manifest import read_manifest
from prodip.export.genai import genai_config


def test_genai_config_matches_the_export(gqa_export):
    config = json.loads((gqa_export / "config.json").read_text(encoding="utf-8"))
    gen = json.loads((gqa_export / "generation_config.json").read_text(encoding="utf-8"))
    genai = json.loads((gqa_export / "genai_config.json").read_text(encoding="utf-8"))
    model, decoder, search = genai["model"], genai["model"]["decoder"], genai["search"]
    assert model["type"] == "llama" and decoder["filename"] == "onnx/model_q4.onnx"
    assert (model["bos_token_id"], model["eos_token_id"], model["pad_token_id"]) == (
        gen["bos_token_id"],
        gen["eos_token_id"],
        gen["pad_token_id"],
    )
    assert model["context_length"] == config["max_position_embeddings"] == search["max_length"]
    assert (decoder["num_attention_heads"], decoder["num_key_value_heads"], decoder["head_size"]) == (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    )
    assert decoder["inputs"]["position_ids"] == "position_ids"
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert search["past_present_share_buffer"] is False  # the graph takes exactly past, not a buffer
    assert search["do_sample"] is gen["do_sample"] is False


def test_manifest_and_config_name_every_variant_for_both_runtimes(gqa_export):
    manifest = read_manifest(gqa_export)
    assert "genai_config.json" in manifest["files"]
    want = {"fp32": ("onnx/model.onnx", "fp32"), "fp16": ("onnx/model_fp16.onnx", "fp16")}
    want |= {"int8": ("onnx/model_quantized.onnx", "q8"), "int4": ("onnx/model_q4.onnx", "q4")}
    for name, (path, dtype) in want.items():
        v = manifest["variants"][name]
        assert (v["path"], v["transformersjs_dtype"]) == (path, dtype)
        assert v["genai_overlay"] == {"model": {"decoder": {"filename": path}}}
        assert v["genai_default"] is (name == "int4")
    config = json.loads((gqa_export / "config.json").read_text(encoding="utf-8"))
    assert config["transformers.js_config"] == {"dtype": "q4"}


def test_genai_config_defaults_without_generation_config():
    cfg = {"vocab_size": 8, "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1}
    cfg |= {"num_hidden_layers": 1, "head_dim": 4, "max_position_embeddings": 16}
    cfg |= {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    out = genai_config(cfg, {}, "onnx/model.onnx")
    assert out["model"]["eos_token_id"] == 2 and out["search"]["max_length"] == 16
    assert out["search"]["do_sample"] is False and out["search"]["past_present_share_buffer"] is False
