"""ONNX decoder: the I/O contract, and ONNX Runtime runs every variant for prefill and decode."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from prodip.base.variants import variant_names
from prodip.export.onnx import io_names
from tests.export.conftest import ort_session, positions, run_ort, source_model

ONNX_VARIANTS = variant_names(format="onnx")  # every ONNX row of the table, so a new one is tested
#: max |logit diff| vs the torch model, relative to the torch logits' std, for fp32/fp16; for the
#: quantised variants, the least Pearson correlation of their logits with torch's. Random
#: weights have no structure for 4 bits to preserve, so int4 moves logits a lot (int4 is checked
#: exactly against an independent fake-quantised torch model in test_quantize.py).
REL_TOL = {"fp32": 1e-5, "fp16": 2e-2}
MIN_CORR = {"int8": 0.99, "int4": 0.75}


def _check(variant, got, want, scale, what):
    if variant in REL_TOL:
        err = np.abs(got - want).max() / scale
        assert err < REL_TOL[variant], f"{variant}: {what} max|diff|/std = {err:.3g}"
    else:
        corr = np.corrcoef(got.ravel(), want.ravel())[0, 1]
        assert corr > MIN_CORR[variant], f"{variant}: {what} logits correlation {corr:.3f}"


def _batch(config, seed=0):
    """Left-padded batch: row 0 has 3 pads, row 1 none; (ids (2, 8), mask (2, 8))."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, min(config.vocab_size, 512), size=(2, 8))
    mask = np.ones((2, 8), np.int64)
    mask[0, :3] = 0
    ids[0, :3] = 0
    return ids, mask


def _torch_logits(model, ids, mask):
    with torch.no_grad():
        return model(
            torch.from_numpy(ids), position_ids=torch.from_numpy(positions(mask)), attention_mask=torch.from_numpy(mask)
        ).numpy()


@pytest.mark.parametrize("variant", ONNX_VARIANTS)
def test_io_contract(any_export, variant):
    from prodip.base.manifest import load_manifest

    config = source_model(any_export).config
    rel = load_manifest(any_export).variants[variant].path
    graph = onnx.load(str(any_export / rel)).graph
    want_in, want_out = io_names(config.num_hidden_layers)
    assert [i.name for i in graph.input] == want_in
    assert [o.name for o in graph.output] == want_out

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    def dtype(v):
        return v.type.tensor_type.elem_type

    inputs = {i.name: i for i in graph.input}
    outputs = {o.name: o for o in graph.output}
    assert dims(inputs["input_ids"]) == ["batch_size", "sequence_length"]
    assert dims(inputs["attention_mask"]) == ["batch_size", "total_sequence_length"]
    assert dims(inputs["position_ids"]) == ["batch_size", "sequence_length"]
    for name in ("input_ids", "attention_mask", "position_ids"):
        assert dtype(inputs[name]) == onnx.TensorProto.INT64
    Hkv, Dh = config.num_key_value_heads, config.head_dim
    for name in want_in[3:]:
        assert dims(inputs[name]) == ["batch_size", Hkv, "past_sequence_length", Dh]
        assert dtype(inputs[name]) == onnx.TensorProto.FLOAT
    assert dims(outputs["logits"]) == ["batch_size", "sequence_length", config.vocab_size]
    for name in want_out:
        assert dtype(outputs[name]) == onnx.TensorProto.FLOAT
    for name in want_out[1:]:
        d = dims(outputs[name])
        assert d[0] == "batch_size" and d[1:] == [Hkv, d[2], Dh] and isinstance(d[2], str)


@pytest.mark.parametrize("variant", ONNX_VARIANTS)
def test_prefill_and_decode_match_torch(any_export, variant):
    """Prefill (past = 0, left-padded batch) then 3 decode steps (seq = 1) vs the torch model."""
    model = source_model(any_export)
    config = model.config
    sess = ort_session(any_export, variant)
    ids, mask = _batch(config)
    logits, present = run_ort(sess, config, ids, mask, positions(mask))
    want = _torch_logits(model, ids, mask)
    real = mask.astype(bool)
    scale = want[real].std()
    _check(variant, logits[real], want[real], scale, "prefill")
    assert present[0].shape == (2, config.num_key_value_heads, 8, config.head_dim)
    for step in range(3):
        nxt = logits[:, -1].argmax(-1)[:, None]
        ids = np.concatenate([ids, nxt], axis=1)
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
        logits, present = run_ort(sess, config, nxt, mask, positions(mask)[:, -1:], present)
        assert logits.shape == (2, 1, config.vocab_size)
        assert present[0].shape[2] == 9 + step
        want = _torch_logits(model, ids, mask)[:, -1:]
        _check(variant, logits, want, scale, f"decode step {step}")
    if variant == "fp32":
        top1 = (logits.argmax(-1) == want.argmax(-1)).all()
        assert top1


@pytest.mark.parametrize("variant", ONNX_VARIANTS)
def test_kv_cache_decode_equals_full_recompute_in_ort(gqa_export, variant):
    config = source_model(gqa_export).config
    sess = ort_session(gqa_export, variant)
    ids, mask = _batch(config, seed=3)
    full, _ = run_ort(sess, config, ids, mask, positions(mask))
    _, present = run_ort(sess, config, ids[:, :5], mask[:, :5], positions(mask)[:, :5])
    pos = positions(mask)
    for t in range(5, 8):
        step, present = run_ort(sess, config, ids[:, t : t + 1], mask[:, : t + 1], pos[:, t : t + 1], present)
        scale = full[:, t].std()
        tol = {"fp32": 1e-5, "fp16": 2e-3, "int8": 1e-3, "int4": 1e-3}[variant]
        err = np.abs(step[:, 0] - full[:, t])[mask[:, t] == 1].max() / scale
        assert err < tol, f"{variant}: cached step {t} differs from full recompute by {err:.3g} std"


def test_left_padding_does_not_change_real_rows(gqa_export):
    config = source_model(gqa_export).config
    sess = ort_session(gqa_export, "fp32")
    ids, mask = _batch(config, seed=5)
    padded, _ = run_ort(sess, config, ids, mask, positions(mask))
    alone, _ = run_ort(sess, config, ids[:1, 3:], mask[:1, 3:], positions(mask[:1, 3:]))
    np.testing.assert_allclose(padded[0, 3:], alone[0], rtol=1e-4, atol=1e-5)


def test_batch1_seq1_prefill(tied_export):
    """The smallest shapes (batch 1, seq 1, past 0) — dims of size 0/1 are not specialised away."""
    model = source_model(tied_export)
    sess = ort_session(tied_export, "fp32")
    ids, mask = np.array([[70_000 - 1]]), np.ones((1, 1), np.int64)  # the last id of a > 65,536 vocab
    logits, present = run_ort(sess, model.config, ids, mask, positions(mask))
    np.testing.assert_allclose(logits, _torch_logits(model, ids, mask), rtol=1e-4, atol=1e-5)
    assert present[0].shape == (1, model.config.num_key_value_heads, 1, model.config.head_dim)


def test_external_data_layout(tied_export, gqa_export):
    """A contrib variant keeps its weights in ``<file>_data`` (transformers.js's external-data name),
    read by its graph and by its onnxruntime-genai graph, whether the fp32 export was external
    (forced here via onnx_external_data, the > 2 GB path, which wrote ``<file>.data``) or not."""
    from prodip.base.manifest import load_manifest

    for export_dir in (tied_export, gqa_export):
        m = load_manifest(export_dir)
        for name in ONNX_VARIANTS:
            v = m.variants[name]
            assert v.graph == "contrib" and v.external_data == [v.path + "_data"] and v.genai_path is not None
            assert m.files[v.path + "_data"].bytes > m.files[v.path].bytes  # the weights
            assert v.path + ".data" not in m.files and not (export_dir / (v.path + ".data")).exists()
            for rel in (v.path, v.genai_path):
                graph = onnx.load(str(export_dir / rel), load_external_data=False).graph
                locations = {e.value for t in graph.initializer for e in t.external_data if e.key == "location"}
                assert locations == {Path(v.path).name + "_data"}, rel
                onnx.checker.check_model(str(export_dir / rel))
        config = json.loads((export_dir / "config.json").read_text(encoding="utf-8"))
        files = {Path(m.variants[n].path).name: 1 for n in ONNX_VARIANTS}
        assert config["transformers.js_config"]["use_external_data_format"] == files


@pytest.mark.parametrize("variant", ONNX_VARIANTS)
def test_rows_are_batch_invariant(gqa_export, variant):
    """Issue 14 item 1: with equal shapes (no padding), a row's logits are bit-identical in a batch
    of 2 and of 8 rows, for the prefill and for one-token decode steps: no variant computes anything
    across the batch (the former int8 had one activation scale per batch), and serve's scheduler,
    which never pads rows to each other, relies on it (prodip.serve.batching). Batch 1 as well,
    except for 4-bit MatMulNBits, whose one-row kernel path can round differently (serve gives such a
    row a twin where the CPU needs one: prodip.serve.engine.nbits_row_rule). Padding is NOT invariant: a left-padded
    row's attention sums run over a shifted axis (fp32 logits move by ~1e-6)."""
    config = source_model(gqa_export).config
    sess = ort_session(gqa_export, variant)
    rng = np.random.default_rng(7)
    V = min(config.vocab_size, 512)
    mine = rng.integers(3, V, (1, 6))
    results = {}
    for rows in [1, 2, 8] if variant != "int4" else [2, 8]:
        others = [rng.integers(3, V, (rows - 2, 6))] if rows > 2 else []
        ids = np.concatenate([mine] * min(rows, 2) + others)
        mask = np.ones(ids.shape, np.int64)
        logits, past = run_ort(sess, config, ids, mask, positions(mask))
        steps = [logits[0]]
        for _ in range(3):
            nxt = np.concatenate([[[int(logits[0, -1].argmax())]], rng.integers(3, V, (rows - 1, 1))])
            mask = np.concatenate([mask, np.ones((rows, 1), np.int64)], axis=1)
            logits, past = run_ort(sess, config, nxt, mask, positions(mask)[:, -1:], past)
            steps.append(logits[0])
        results[rows] = steps
    for rows, steps in results.items():
        for i, (got, want) in enumerate(zip(steps, results[8])):
            np.testing.assert_array_equal(got, want, err_msg=f"{variant}: batch {rows} vs 8, step {i}")


def test_onnx_files_hold_no_build_paths(gqa_export):
    """No file of an export names the machine it was built on (the exporter's stack traces are dropped)."""
    from prodip.base.manifest import load_manifest

    root = str(Path(__file__).resolve().parents[2])
    for rel in load_manifest(gqa_export).files:
        if rel.endswith(".onnx"):
            data = (gqa_export / rel).read_bytes()
            assert root.encode() not in data and b"pkg.torch.onnx.stack_trace" not in data, rel
