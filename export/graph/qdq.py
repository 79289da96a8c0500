"""``com.microsoft.MatMulNBits`` written back as ONNX's int4 ``DequantizeLinear`` + ``MatMul`` (QDQ), same codes."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from prodip.export.graph.helpers import attr


def _unpack_nibbles(packed: np.ndarray, n: int) -> np.ndarray:
    """uint8 [..., ceil(n/2)] -> uint8 values 0..15 [..., n], element 2i from the low nibble (ORT's and ONNX's packing)."""
    pairs = np.stack([packed & 0x0F, packed >> 4], axis=-1)
    return pairs.reshape(packed.shape[:-1] + (-1,))[..., :n]


def _four_bit_tensor(name: str, values: np.ndarray, signed: bool) -> onnx.TensorProto:
    """An INT4 (``signed``: values -8..7) or UINT4 (0..15) initializer of ``values``' shape.

    ONNX packs 4-bit tensors two elements per byte in row-major order, element 2i in the low nibble
    (onnx.proto, ``TensorProto.raw_data``), so the bytes are built here rather than through a
    Python list of every element."""
    flat = (values.astype(np.int16).ravel() & 0x0F).astype(np.uint8)  # two's complement nibble for INT4
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    raw = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8).tobytes()
    data_type = onnx.TensorProto.INT4 if signed else onnx.TensorProto.UINT4
    return onnx.helper.make_tensor(name, data_type, list(values.shape), raw, raw=True)


def matmulnbits_to_qdq(model: onnx.ModelProto) -> int:
    """Replace each 4-bit ``MatMulNBits`` of constant weights by ``MatMul(A, DequantizeLinear(W, s, z))``, in place.

    Layouts: MatMulNBits (ONNX Runtime's ContribOperators.md, bits 4, K x N, block_size b,
    nb = ceil(K/b) blocks): B uint8 [N, nb, b/2], element k of column n in block k // b, low nibble
    first; scales float32 [N * nb] or [N, nb]; zero_points uint8 [N, ceil(nb/2)] packed the same way,
    absent = 8. ONNX ``DequantizeLinear`` (opset 21, blocked: ``axis`` 0, ``block_size`` b): W [K, N],
    s [nb, N], z [nb, N], y = (W - z) * s. So W = codes transposed (UINT4), s and z transposed;
    without zero points W = code - 8 as INT4 and no z (the ONNX default for INT4 is 0). The codes,
    scales and zero points are the MatMulNBits's own, so ONNX Runtime's QDQ fusion
    (DQ + MatMul -> MatMulNBits) rebuilds the very same tensors at session load.

    Nodes with a bias, ``g_idx``, non-constant inputs, bits other than 4 or K not a multiple of b
    (the padded last block has no blocked-DequantizeLinear equivalent the fusion accepts) are left as
    they are. The model must be opset >= 21 (INT4/UINT4 and blocked DequantizeLinear).

    Returns:
        Number of nodes replaced.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    replaced = 0
    for node in list(graph.node):
        if node.op_type != "MatMulNBits" or node.domain != "com.microsoft" or attr(node, "bits", 4) != 4:
            continue
        k, n, block = attr(node, "K"), attr(node, "N"), attr(node, "block_size")
        extra = [i for i in node.input[4:] if i]  # g_idx, bias
        constant = all(i in inits for i in node.input[1:4] if i)
        if extra or not constant or k % block:
            continue
        blocks = k // block
        codes = numpy_helper.to_array(inits[node.input[1]]).reshape(n, blocks * block // 2)
        codes = _unpack_nibbles(codes, k)  # [N, K]
        scales = numpy_helper.to_array(inits[node.input[2]]).reshape(n, blocks)
        zp_name = node.input[3] if len(node.input) > 3 and node.input[3] else None
        p = node.name or node.output[0]
        dq_inputs = [f"{p}_DQ_codes", f"{p}_DQ_scales"]
        if zp_name is not None:
            zps = _unpack_nibbles(numpy_helper.to_array(inits[zp_name]).reshape(n, -1), blocks)  # [N, nb]
            graph.initializer.append(_four_bit_tensor(f"{p}_DQ_codes", codes.T, signed=False))
            graph.initializer.append(_four_bit_tensor(f"{p}_DQ_zero_points", zps.T, signed=False))
            dq_inputs.append(f"{p}_DQ_zero_points")
        else:  # absent zero point = 8: code - 8 as a signed code with DequantizeLinear's default zero point 0
            graph.initializer.append(_four_bit_tensor(f"{p}_DQ_codes", codes.T.astype(np.int16) - 8, signed=True))
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(scales.T), f"{p}_DQ_scales"))
        position = list(graph.node).index(node)
        dq = onnx.helper.make_node(
            "DequantizeLinear", dq_inputs, [f"{p}_DQ_weight"], name=f"{p}_DQ", axis=0, block_size=block
        )
        matmul = onnx.helper.make_node("MatMul", [node.input[0], f"{p}_DQ_weight"], list(node.output), name=p)
        graph.node.remove(node)
        graph.node.insert(position, matmul)
        graph.node.insert(position, dq)
        replaced += 1
    used = {i for node in graph.node for i in node.input} | {o.name for o in graph.output}
    for init in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(init)
    return replaced
