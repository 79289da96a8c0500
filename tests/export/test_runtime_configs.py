"""What the export writes for the on-device runtimes: genai_config.json, transformers.js names and config."""

from __future__ import annotations

import json

import numpy as np
import pytest

from prodip.base.manifest import load_manifest
from prodip.base.variants import variant_names
from prodip.export.genai import genai_config


def test_genai_config_matches_the_export(gqa_export):
    config = json.loads((gqa_export / "config.json").read_text(encoding="utf-8"))
    gen = json.loads((gqa_export / "generation_config.json").read_text(encoding="utf-8"))
    genai = json.loads((gqa_export / "genai_config.json").read_text(encoding="utf-8"))
    model, decoder, search = genai["model"], genai["model"]["decoder"], genai["search"]
    assert load_manifest(gqa_export).variants["int4"].graph == "contrib"
    # the int4 decoder made for onnxruntime-genai's shared past/present buffer
    assert model["type"] == "llama" and decoder["filename"] == "onnx/model_q4_genai.onnx"
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
    assert search["past_present_share_buffer"] is True
    assert search["do_sample"] is gen["do_sample"] is False


def test_manifest_and_config_name_every_variant_for_both_runtimes(gqa_export):
    manifest = load_manifest(gqa_export)
    assert "genai_config.json" in manifest.files
    want = {"fp32": ("onnx/model.onnx", "fp32"), "fp16": ("onnx/model_fp16.onnx", "fp16")}
    want |= {"int8": ("onnx/model_quantized.onnx", "q8"), "int4": ("onnx/model_q4.onnx", "q4")}
    for name, (path, dtype) in want.items():
        v = manifest.variants[name]
        assert (v.path, v.transformersjs_dtype) == (path, dtype)
        assert v.genai_default is (name == "int4")
        # each variant's shared-buffer graph for onnxruntime-genai, listed and hashed like every file
        assert v.genai_path == path.replace(".onnx", "_genai.onnx") and v.genai_path in manifest.files
        shared = {"model": {"decoder": {"filename": v.genai_path}}, "search": {"past_present_share_buffer": True}}
        assert v.genai_overlay == shared
    config = json.loads((gqa_export / "config.json").read_text(encoding="utf-8"))
    files = {"model.onnx": 1, "model_fp16.onnx": 1, "model_quantized.onnx": 1, "model_q4.onnx": 1}
    # q4 where nothing else is said (onnxruntime-node, WebGPU); q8 on the WASM device (the page's default)
    want_tjs = {"dtype": "q4", "device_config": {"wasm": {"dtype": "q8"}}, "use_external_data_format": files}
    # the page's q4 on WASM: the WASM graph, reading the q4 file's weights, folded to 8-bit at load
    want_tjs["prodip_wasm_q4"] = {
        "model_file_name": "model_wasm",
        "external_data": [{"path": "model_q4.onnx_data", "data": "onnx/model_q4.onnx_data"}],
        "session_config": {"session.disable_quant_qdq": "1"},
    }
    assert config["transformers.js_config"] == want_tjs
    int4 = manifest.variants["int4"]
    assert int4.wasm_path == "onnx/model_wasm_q4.onnx" and int4.wasm_path in manifest.files


def test_genai_config_defaults_without_generation_config():
    cfg = {"vocab_size": 8, "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1}
    cfg |= {"num_hidden_layers": 1, "head_dim": 4, "max_position_embeddings": 16}
    cfg |= {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    out = genai_config(cfg, {}, "onnx/model.onnx")
    assert out["model"]["eos_token_id"] == 2 and out["search"]["max_length"] == 16
    assert out["search"]["do_sample"] is False and out["search"]["past_present_share_buffer"] is False


def test_shared_buffer_graph_drops_the_cache_copies_and_keeps_the_rest(gqa_export):
    """int4's graph for onnxruntime-genai: no mask-length check, no Where over a past_key_values
    input (the per-step cache copies), the same inputs, outputs and weights as the contract graph."""
    import onnx

    from prodip.export.graph import MASK_CHECK_NODE, shared_buffer_graph

    contract = onnx.load(str(gqa_export / "onnx" / "model_q4.onnx"))
    shared = onnx.load(str(gqa_export / "onnx" / "model_q4_genai.onnx"))
    past = {i.name for i in contract.graph.input if i.name.startswith("past_key_values.")}
    layers = len(past) // 2

    def cache_wheres(m):
        return [n for n in m.graph.node if n.op_type == "Where" and past & set(n.input)]

    assert len(cache_wheres(contract)) == 2 * layers and not cache_wheres(shared)
    assert any(n.name == MASK_CHECK_NODE for n in contract.graph.node)
    assert not any(n.name == MASK_CHECK_NODE for n in shared.graph.node)
    gqa = [n for n in shared.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == layers and all(n.input[3] in past and n.input[4] in past for n in gqa)  # the buffer itself
    assert {i.name for i in shared.graph.input} == {i.name for i in contract.graph.input}
    assert [o.name for o in shared.graph.output] == [o.name for o in contract.graph.output]
    assert {(n.input[5], n.input[6]) for n in gqa} == {("genai_lengths/seqlens_k", "genai_lengths/total")}
    weights = {t.name: t.raw_data for t in contract.graph.initializer}
    kept = {t.name: t.raw_data for t in shared.graph.initializer if not t.name.startswith("genai_lengths/")}
    read = {name for n in shared.graph.node for name in n.input}
    assert kept == {name: data for name, data in weights.items() if name in read}  # the same bytes, no unused ones
    assert len(shared.graph.node) < len(contract.graph.node) - 3 * layers  # Split, 2 RotaryEmbedding per layer
    with pytest.raises(ValueError, match="no GroupQueryAttention"):  # a standard-operator graph
        shared_buffer_graph(onnx.ModelProto())


@pytest.mark.parametrize("variant", variant_names(format="onnx"))
def test_shared_buffer_graph_reads_no_slot_past_the_mask(gqa_export, variant):
    """What onnxruntime-genai's shared buffer feeds the ``_genai`` graph: a cache of capacity C > past,
    the first ``past`` slots filled, the rest NaN (a buffer never written), and a mask of past + 1.
    The step's logits equal the contract graph's on the exact cache, and the present buffer keeps
    the filled slots and gets the new token's keys at slot ``past``."""
    import onnxruntime as ort

    from tests.export.conftest import ort_session, positions, run_ort, source_model

    config = source_model(gqa_export).config
    contract = ort_session(gqa_export, variant)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    genai_path = gqa_export / load_manifest(gqa_export).variants[variant].genai_path
    shared = ort.InferenceSession(str(genai_path), opts, providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(3, config.vocab_size, (1, 10))
    mask = np.ones_like(ids)
    _, past = run_ort(contract, config, ids, mask, positions(mask))  # 10 filled slots
    step_ids, step_mask = np.array([[7]]), np.ones((1, 11), np.int64)
    want, want_present = run_ort(contract, config, step_ids, step_mask, np.array([[10]]), past)
    capacity = 32
    buffers = []
    for layer_cache in past:
        buf = np.full((1, config.num_key_value_heads, capacity, config.head_dim), np.nan, np.float32)
        buf[:, :, :10] = layer_cache
        buffers.append(buf)
    got, present = run_ort(shared, config, step_ids, step_mask, np.array([[10]]), buffers)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for p, w in zip(present, want_present):
        assert p.shape[2] == capacity
        np.testing.assert_array_equal(p[:, :, :11], w)  # filled slots kept, the new token at slot 10


def test_standard_graph_with_external_weights_uses_the_transformersjs_name(tmp_path):
    """A standard-operator export over 2 GB (forced here) keeps one weights file per variant under
    transformers.js's name, ``<file>_data``, listed in ``use_external_data_format``; it has no
    GroupQueryAttention, so no shared-buffer graph, and its genai overlay shares no buffer."""
    import onnxruntime as ort

    from tests.fixtures import build_tiny_export

    export = build_tiny_export(
        tmp_path, export_options={"onnx_graph": "standard", "onnx_external_data": True}, variants=["fp32", "int8"]
    )
    m = load_manifest(export)
    for name in ("fp32", "int8"):
        v = m.variants[name]
        assert v.graph == "standard" and v.external_data == [v.path + "_data"] and v.genai_path is None
        assert "genai_path" not in v.model_fields_set  # not written at all
        assert v.genai_overlay is not None and v.genai_overlay["search"]["past_present_share_buffer"] is False
        assert not (export / (v.path + ".data")).exists()
        ort.InferenceSession(str(export / v.path), providers=["CPUExecutionProvider"])
    config = json.loads((export / "config.json").read_text(encoding="utf-8"))
    assert config["transformers.js_config"]["use_external_data_format"] == {
        "model.onnx": 1,
        "model_quantized.onnx": 1,
    }


@pytest.mark.parametrize("variant", variant_names(format="onnx"))
def test_genai_graph_computes_the_contract_graph_on_what_genai_feeds(gqa_export, variant):
    """The ``_genai`` graph rotates queries and keys inside GroupQueryAttention
    (:func:`prodip.export.graph.fold_rotary_into_attention`; fp16 keeps its RotaryEmbedding nodes)
    and masks padding by sequence length (:func:`prodip.export.graph.right_padded_attention`). Fed
    as onnxruntime-genai feeds it (a NaN-filled buffer of capacity 32; a batch padded on the right,
    PadInputs; position_ids the column index, 0 on padding, DefaultPositionInputs), two prompts of 6
    and 9 tokens and then two decode steps give the contract graph's logits at every real position,
    and each row's buffer holds the contract graph's keys and values of its real tokens, in order."""
    import onnx
    import onnxruntime as ort

    from tests.export.conftest import ort_session, run_ort, source_model

    config = source_model(gqa_export).config
    genai_path = gqa_export / load_manifest(gqa_export).variants[variant].genai_path
    graph = onnx.load(str(genai_path), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == config.num_hidden_layers
    assert all(len(n.input) <= 10 for n in gqa)  # no attention_bias
    if variant == "fp16":  # q/k/v cast to fp32 before rotation: not folded (the contract rounds them)
        assert ops.count("RotaryEmbedding") == 2 * config.num_hidden_layers
    else:
        assert "RotaryEmbedding" not in ops and "Split" not in ops
        assert all(n.input[1] == n.input[2] == "" and n.input[9] == "position_ids" for n in gqa)  # packed q/k/v
    contract = ort_session(gqa_export, variant)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    shared = ort.InferenceSession(str(genai_path), opts, providers=["CPUExecutionProvider"])
    lengths = np.array([6, 9])
    ids = np.random.default_rng(1).integers(3, config.vocab_size, (2, 9))
    mask = (np.arange(9)[None] < lengths[:, None]).astype(np.int64)
    ids[mask == 0] = config.pad_token_id
    pos = np.where(mask == 1, np.arange(9)[None], 0)
    # fp16: a padded row's softmax runs over fewer slots than the contract graph's (which adds
    # float32-min bias on padding), and the fp32 rounding difference can flip an fp16 rounding
    tol = dict(rtol=1e-5, atol=1e-5) if variant != "fp16" else dict(rtol=1e-3, atol=1e-3)
    shape = (2, config.num_key_value_heads, 32, config.head_dim)
    buffers = [np.full(shape, np.nan, np.float32) for _ in range(2 * config.num_hidden_layers)]
    want, want_past = run_ort(contract, config, ids, mask, pos)
    got, buffers = run_ort(shared, config, ids, mask, pos, buffers)
    real = mask.astype(bool)
    np.testing.assert_allclose(got[real], want[real], **tol)
    nxt = want[[0, 1], lengths - 1].argmax(-1)[:, None]  # each row's last real token
    for _ in range(2):  # two decode steps
        for buf, w in zip(buffers, want_past):  # (B, Hkv, slots, Dh): a row's real tokens, in order
            for row in range(2):
                np.testing.assert_allclose(buf[row, :, : real[row].sum()], w[row][:, real[row]], **tol)
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
        step_pos = lengths[:, None].copy()
        lengths = lengths + 1
        want, want_past = run_ort(contract, config, nxt, mask, step_pos, want_past)
        got, buffers = run_ort(shared, config, nxt, mask, step_pos, buffers)
        np.testing.assert_allclose(got, want, **tol)
        nxt = want[:, -1].argmax(-1)[:, None]
        real = mask.astype(bool)
