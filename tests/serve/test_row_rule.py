"""OnnxDecoder.row_rule (serve/engine.py nbits_row_rule): what ONNX Runtime's MatMulNBits kernels need,
on this CPU, for a row to get the same bits in a call of any row count, checked against the kernels
themselves on fresh inputs: the rule's twin rows make every row equal to it among 16 rows, and a rule
other than "none" is only given where some row count really differs without it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from prodip.serve.engine import nbits_row_rule, needs_twin

K, N = 256, 192


def matmulnbits(path, block_size: int, accuracy_level: int) -> ort.InferenceSession:
    """A one-node 4-bit MatMulNBits graph (K x N, symmetric blocks) written to ``path``."""
    rng = np.random.default_rng(1)
    blocks = K // block_size
    weights = rng.integers(0, 256, (N, blocks, block_size // 2), dtype=np.uint8)
    scales = (rng.random(N * blocks) * 0.05).astype(np.float32)
    node = helper.make_node(
        "MatMulNBits",
        ["A", "B", "S"],
        ["Y"],
        domain="com.microsoft",
        K=K,
        N=N,
        bits=4,
        block_size=block_size,
        accuracy_level=accuracy_level,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
        [numpy_helper.from_array(weights, "B"), numpy_helper.from_array(scales, "S")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    onnx.save(model, str(path))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def as_qdq(src, dst) -> ort.InferenceSession:
    """The graph at ``src`` with its MatMulNBits as int4 DequantizeLinear + MatMul (the export's qdq int4
    layout, same codes), written to ``dst``; ONNX Runtime fuses it back to MatMulNBits at load."""
    from prodip.export.graph import matmulnbits_to_qdq

    model = onnx.load(str(src))
    del model.opset_import[:]
    model.opset_import.extend([helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    assert matmulnbits_to_qdq(model) == 1
    onnx.save(model, str(dst))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(str(dst), opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    ("block_size", "accuracy_level", "layout"),
    [(32, 0, "matmulnbits"), (32, 4, "matmulnbits"), (128, 4, "matmulnbits"), (32, 4, "qdq"), (128, 4, "qdq")],
)
def test_row_rule_makes_rows_invariant(tmp_path, block_size, accuracy_level, layout):
    path = tmp_path / "m.onnx"
    session = matmulnbits(path, block_size, accuracy_level)
    if layout == "qdq":  # the rule is read from the DequantizeLinear + MatMul pairs ONNX Runtime fuses
        mnb_rule = nbits_row_rule(path, 2)
        path = tmp_path / "m_qdq.onnx"
        session = as_qdq(tmp_path / "m.onnx", path)
        assert nbits_row_rule(path, 2) == mnb_rule
    rule = nbits_row_rule(path, 2)
    assert rule in ("none", "one", "odd")
    a = np.random.default_rng(5).standard_normal((16, K)).astype(np.float32)  # not the probe's inputs
    ref = session.run(None, {"A": a})[0]
    plain_differs = False
    for m in range(1, 16):
        rows = a[:m]
        plain_differs |= not np.array_equal(session.run(None, {"A": rows})[0], ref[:m])
        if needs_twin(rule, m):
            rows = np.concatenate([rows, rows[-1:]])
        got = session.run(None, {"A": rows})[0][:m]
        np.testing.assert_array_equal(got, ref[:m], err_msg=f"rule {rule!r}, {m} rows")
    assert plain_differs == (rule != "none"), f"rule {rule!r} but rows differ without twins: {plain_differs}"


def test_no_matmulnbits_needs_no_twin(tmp_path):
    """A graph without MatMulNBits (fp32 MatMul) gets rule "none" without probing."""
    w = numpy_helper.from_array(np.ones((K, N), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "W"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(tmp_path / "m.onnx"))
    assert nbits_row_rule(tmp_path / "m.onnx") == "none"
