"""The quantised embedding lookup in standard ONNX ops equals ONNX Runtime's GatherBlockQuantized kernel.

Each case is a one-node graph ``com.microsoft.GatherBlockQuantized`` run by ONNX Runtime's CPU kernel
(the reference), then the same graph after :func:`prodip.export.graph.lower_gather_block_quantized`:
the outputs must be bit-identical, for every data layout prodip's int8/int4 files hold (uint8 8-bit
codes; INT4 and UINT4 tables from ORT's quantiser; packed uint8 4-bit codes read from the lm_head),
with and without zero points, and an odd number of blocks (a half-used zero-point byte).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from prodip.export.graph import _pack_nibbles, lower_gather_block_quantized


def _gbq_model(
    data: onnx.TensorProto, scales: np.ndarray, zero_points, bits: int, block: int, hidden: int
) -> onnx.ModelProto:
    inits = [data, numpy_helper.from_array(scales, "scales")]
    inputs = [data.name, "ids", "scales"]
    if zero_points is not None:
        inits.append(zero_points)
        inputs.append(zero_points.name)
    node = helper.make_node(
        "GatherBlockQuantized", inputs, ["emb"], name="emb", domain="com.microsoft",
        bits=bits, block_size=block, gather_axis=0, quantize_axis=1,
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["b", "s", hidden])], inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _run(model: onnx.ModelProto, ids: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"ids": ids})[0]


def _int4_tensor(values: np.ndarray, name: str, dtype: int) -> onnx.TensorProto:
    return helper.make_tensor(name, dtype, values.shape, values.flatten().tolist())


V, H = 37, 96


@pytest.mark.parametrize(
    "layout,block,with_zero_points,hidden",
    [
        ("uint8_bits8", 32, False, H),
        ("uint8_bits8", 16, True, H),
        ("int4", 32, False, H),
        ("int4", 16, True, H),
        ("uint4", 32, True, H),
        ("packed_uint8_bits4", 32, False, H),
        ("packed_uint8_bits4", 32, True, H),  # 3 blocks: the last zero-point byte is half used
        # a partial last block (hidden 48 = 32 + 16): the lowering pads to whole blocks and cuts back
        ("uint8_bits8", 32, False, 48),
        ("int4", 32, True, 48),
        ("packed_uint8_bits4", 32, False, 48),
    ],
)
def test_lowered_lookup_is_bit_identical(layout, block, with_zero_points, hidden):
    H = hidden  # noqa: N806 (the table's width, as in the module's default)
    rng = np.random.default_rng(7)
    blocks = -(-H // block)
    scales = rng.uniform(0.001, 0.1, (V, blocks)).astype(np.float32)
    zero_points, bits = None, 4
    if layout == "uint8_bits8":
        bits = 8
        data = numpy_helper.from_array(rng.integers(0, 256, (V, H)).astype(np.uint8), "data")
        if with_zero_points:
            zero_points = numpy_helper.from_array(rng.integers(0, 256, (V, blocks)).astype(np.uint8), "zp")
    elif layout in ("int4", "uint4"):
        signed = layout == "int4"
        lo, hi, dtype = (-8, 8, TensorProto.INT4) if signed else (0, 16, TensorProto.UINT4)
        data = _int4_tensor(rng.integers(lo, hi, (V, H)), "data", dtype)
        if with_zero_points:
            zero_points = _int4_tensor(rng.integers(lo, hi, (V, blocks)), "zp", dtype)
    else:
        data = numpy_helper.from_array(_pack_nibbles(rng.integers(0, 16, (V, H)).astype(np.uint8)), "data")
        if with_zero_points:
            zero_points = numpy_helper.from_array(
                _pack_nibbles(rng.integers(0, 16, (V, blocks)).astype(np.uint8)), "zp"
            )
    model = _gbq_model(data, scales, zero_points, bits, block, H)
    ids = rng.integers(0, V, (2, 5)).astype(np.int64)
    ref = _run(model, ids)
    assert lower_gather_block_quantized(model) == 1
    onnx.checker.check_model(model)
    assert "GatherBlockQuantized" not in {n.op_type for n in model.graph.node}
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
    out = _run(model, ids)
    assert out.shape == (2, 5, H)
    np.testing.assert_array_equal(out, ref)
    # the codes stay quantised: no float table of [V, H] appears
    assert not any(t.data_type == TensorProto.FLOAT and V * H <= np.prod(t.dims) for t in model.graph.initializer)
