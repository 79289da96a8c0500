"""The int8 variant's MatMuls: 8-bit weights per output channel, 8-bit activations per token.

:func:`quantize_matmuls_rowwise_int8` rewrites every MatMul with a constant 2-D weight as
``MatMulInteger`` (batch-invariant); :func:`int8_names` and the ``ROWWISE`` constants name the
initializers it writes, which the tied embedding (:mod:`prodip.export.graph.tied`) and the 8-bit
embedding (:mod:`prodip.export.graph.embedding`) read too.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

#: int8 codes: uint8 with zero point 128, so a code c means (c - 128) * scale (symmetric, |c - 128| <= 127).
INT8_ZERO_POINT = 128
#: Prefix of the row-wise int8 graph's shared constants and activation-quantisation nodes.
ROWWISE = "int8_rowwise"


def int8_names(weight: str) -> tuple[str, str]:
    """Names of the codes and scales initializers that replace MatMul weight ``weight`` in the int8 graph."""
    return f"{weight}_Q8", f"{weight}_Q8_scales"


def _rowwise_constants(graph: onnx.GraphProto) -> None:
    """The scalar initializers the row-wise int8 nodes read (added once).

    ``zero_point`` uint8 128 (MatMulInteger's zero points: same type as its operands) and its
    float32 twin; ``qmax`` 127.0 (symmetric codes); ``tiny`` float32's smallest normal (the floor of
    a row scale); ``code_min``/``code_max`` 0.0/255.0 (uint8's range, clipped in float before the
    Cast); ``last_axis`` int64 [-1] (ReduceMax-18 and Unsqueeze-13 take axes as an int64 input).
    """
    if any(t.name == f"{ROWWISE}_zero_point" for t in graph.initializer):
        return
    f32 = np.float32
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(INT8_ZERO_POINT, np.uint8), f"{ROWWISE}_zero_point"),
            numpy_helper.from_array(np.array(INT8_ZERO_POINT, f32), f"{ROWWISE}_zero_point_f"),
            numpy_helper.from_array(np.array(127.0, f32), f"{ROWWISE}_qmax"),
            # an all-zero row has amax 0: the scale is floored here so x / scale is 0, not 0/0 = NaN
            numpy_helper.from_array(np.array(np.finfo(f32).tiny, f32), f"{ROWWISE}_tiny"),
            numpy_helper.from_array(np.array(0.0, f32), f"{ROWWISE}_code_min"),
            numpy_helper.from_array(np.array(255.0, f32), f"{ROWWISE}_code_max"),
            numpy_helper.from_array(np.array([-1], np.int64), f"{ROWWISE}_last_axis"),
        ]
    )


def quantize_weight_per_column_int8(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric 8-bit codes of a MatMul weight, one scale per output column.

    Args:
        weight: float32 [K, N] (MatMul's B: K inputs, N outputs).
    Returns:
        ``(codes, scales)``: codes uint8 [K, N] with zero point 128, i.e. weight ~ (codes - 128) *
        scales, |codes - 128| <= 127 (round half to even); scales float32 [N] = max_k |W[k, n]| / 127
        (1.0 for an all-zero column, whose codes are then all 128).
    """
    weight = np.asarray(weight, np.float32)
    amax = np.abs(weight).max(axis=0)
    # 1.0 for a zero column avoids 0/0; its codes are 128 (value 0) whatever the scale
    scales = np.where(amax > 0, amax / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    # np.rint rounds half to even, as ONNX Round does for the activations; -127..127 keeps the
    # codes symmetric (no -128), so the zero point 128 maps them to 1..255
    codes = np.clip(np.rint(weight / scales), -127, 127) + INT8_ZERO_POINT
    return codes.astype(np.uint8), scales


def quantize_matmuls_rowwise_int8(model: onnx.ModelProto) -> int:
    """Every MatMul with a 2-D constant weight -> 8-bit ``MatMulInteger`` with a scale per row, in place.

    W8A8 with dynamic per-token activation scales and per-output-channel weight scales, in
    standard ONNX operators (LLM.int8's vector-wise quantisation without its outlier split:
    Dettmers et al. 2022, arXiv:2208.07339, sec. 3.1; SmoothQuant's "per-token" activation and
    "per-channel" weight granularity, Xiao et al. 2023, arXiv:2211.10438, sec. 2). For ``y = x @ W``,
    x float32 [..., K], W float32 [K, N]:

    * W -> codes uint8 [K, N] and scales s_w float32 [N] (:func:`quantize_weight_per_column_int8`);
    * per row of x (each token of each sequence), at run time: s_x = max(|x|) / 127 over K (at least
      float32's smallest normal), q = uint8(clip(round(x / s_x) + 128, 0, 255));
    * ``y = float(MatMulInteger(q, codes, 128, 128)) * s_x * s_w``.

    MatMulInteger accumulates in int32, exactly, so a row's result depends on that row alone: the
    graph is batch-invariant bit for bit (a scale shared by the batch, as ``quantize_dynamic``'s
    ``DynamicQuantizeLinear``, is not). Both operands are uint8 on purpose: ONNX Runtime's u8 x s8
    kernels on x86 CPUs without AVX-VNNI pair products in int16 (``vpmaddubsw``), which saturates
    with full-range 8-bit weights (ORT's quantisation docs, "reduce_range"); u8 x u8 does not (on
    the 109 M bench model, u8 x s8 had twice the KL of u8 x u8 against fp32).
    Nodes reading the same x share one quantisation of it (q/k/v, gate/up).

    A 2-D initializer weight is required: a weight computed at run time (or a batched 3-D one) is
    left as an fp32 MatMul. Run it after :func:`materialize_transposed_weights`, so the tied lm_head
    is one of them.

    Returns:
        The number of MatMuls replaced. Initializers ``<W>_Q8`` (codes) and ``<W>_Q8_scales`` replace
        each weight ``<W>`` (``<W>`` is dropped when nothing else reads it).
    """
    return _rowwise_int8(model, requantize_int4=False)


def requantize_int4_matmuls_int8(model: onnx.ModelProto) -> int:
    """Every int4 ``DequantizeLinear`` -> ``MatMul`` -> the row-wise int8 ``MatMulInteger``, 8-bit weights made at load.

    For the 4-bit web file: the int4 codes, scales and zero points stay in the file (a 4-bit
    download), and the weight side becomes ``QuantizeLinear(DequantizeLinear(W4), s8, 128, axis=1)``,
    uint8 codes [K, N] with one scale per output column, s8 = max_k |DQ(W4)[k, n]| / 127 (computed
    here from the same int4 tensors, as :func:`quantize_weight_per_column_int8` would from the
    dequantised weight), feeding :func:`quantize_matmuls_rowwise_int8`'s ``MatMulInteger`` with
    per-token activation scales. Every weight-side node reads constants only, so ONNX Runtime's
    constant folding computes the uint8 codes once at session load when its QDQ transformers are
    off (session option ``session.disable_quant_qdq=1``; with them on it keeps the
    DequantizeLinear and recomputes the weight every call), and decode then runs the int8 file's
    kernels: a quarter of fp32's weight bytes per step. The int8 grid is finer than every int4
    block's (|DQ(W4)| <= max of the column), so requantising adds at most half an int8 step per
    weight.

    A ``DequantizeLinear`` whose input is INT4/UINT4 initializers (blocked along axis 0, or
    per-tensor) and whose output only one MatMul reads as its 2-D weight is converted; other
    MatMuls with a 2-D initializer weight are quantised as in :func:`quantize_matmuls_rowwise_int8`.

    Returns:
        The number of MatMuls replaced (int4 and float ones).
    """
    return _rowwise_int8(model, requantize_int4=True)


def _dequantize_int4(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> np.ndarray | None:
    """float32 [K, N] of an int4 ``DequantizeLinear`` (axis 0, blocked or per-tensor) of initializers, else None."""
    four_bit = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)
    names = [i for i in node.input if i]
    if node.op_type != "DequantizeLinear" or not all(i in inits for i in names):
        return None
    codes_t = inits[node.input[0]]
    if codes_t.data_type not in four_bit or len(codes_t.dims) != 2:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    block = next((a.i for a in node.attribute if a.name == "block_size"), 0)
    codes = numpy_helper.to_array(codes_t).astype(np.float32)
    scales = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
    zeros = numpy_helper.to_array(inits[node.input[2]]).astype(np.float32) if len(names) > 2 else np.zeros_like(scales)
    if scales.ndim == 0:  # per tensor
        return (codes - zeros) * scales
    if axis % 2 != 0 or not block or scales.shape[0] * block < codes.shape[0]:
        return None
    # blocked along K (ONNX DequantizeLinear-21): row k uses scale row k // block
    expand = lambda t: np.repeat(t, block, axis=0)[: codes.shape[0]]  # noqa: E731
    return (codes - expand(zeros)) * expand(scales)


def _rowwise_int8(model: onnx.ModelProto, *, requantize_int4: bool) -> int:
    """:func:`quantize_matmuls_rowwise_int8` and :func:`requantize_int4_matmuls_int8` (which MatMul weights differ)."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    readers: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    _rowwise_constants(graph)
    c = {k: f"{ROWWISE}_{k}" for k in ("zero_point", "zero_point_f", "qmax", "tiny", "code_min", "code_max")}
    # The node list is rebuilt in order: each activation's quantisation nodes go just before the
    # first MatMul reading it (x is produced earlier), so the result stays topologically sorted.
    nodes: list[onnx.NodeProto] = []
    quantized: dict[str, tuple[str, str]] = {}  # x -> (codes, row scales)
    replaced, dropped = 0, set()
    for node in list(graph.node):
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        dq = producers.get(node.input[1]) if node.op_type == "MatMul" and requantize_int4 else None
        dequantized = _dequantize_int4(dq, inits) if dq is not None and readers[node.input[1]] == 1 else None
        if dequantized is None and (weight is None or len(weight.dims) != 2):
            nodes.append(node)
            continue
        x, name = node.input[0], node.name or node.output[0]
        if x not in quantized:
            p = f"{ROWWISE}/{len(quantized)}"
            make = onnx.helper.make_node
            # s_x = max(max|x| / 127, tiny) over the last axis (K): one scale per token, [..., 1]
            # (keepdims) so it broadcasts over K here and over N after the MatMul. Then q = uint8 of
            # clip(round(x / s_x) + 128, 0, 255): Round is half-to-even (ONNX Round), like the
            # weights' np.rint; the Clip comes before the Cast because ONNX's Cast of an
            # out-of-range float to an integer type is undefined (Cast spec), not saturating.
            nodes += [
                make("Abs", [x], [f"{p}/abs"], name=f"{p}/Abs"),
                make(
                    "ReduceMax", [f"{p}/abs", f"{ROWWISE}_last_axis"], [f"{p}/amax"], name=f"{p}/ReduceMax", keepdims=1
                ),
                make("Div", [f"{p}/amax", c["qmax"]], [f"{p}/scale_raw"], name=f"{p}/DivMax"),
                make("Max", [f"{p}/scale_raw", c["tiny"]], [f"{p}/scale"], name=f"{p}/Max"),
                make("Div", [x, f"{p}/scale"], [f"{p}/scaled"], name=f"{p}/Div"),
                make("Round", [f"{p}/scaled"], [f"{p}/rounded"], name=f"{p}/Round"),
                make("Add", [f"{p}/rounded", c["zero_point_f"]], [f"{p}/shifted"], name=f"{p}/Add"),
                make("Clip", [f"{p}/shifted", c["code_min"], c["code_max"]], [f"{p}/clipped"], name=f"{p}/Clip"),
                make("Cast", [f"{p}/clipped"], [f"{p}/codes"], name=f"{p}/Cast", to=onnx.TensorProto.UINT8),
            ]
            quantized[x] = (f"{p}/codes", f"{p}/scale")
        if dequantized is not None:
            # codes at load: QuantizeLinear(DQ(W4), s8 per column, 128) = rint(W / s8) + 128, within
            # 1..255 because s8 is the column's max / 127 (saturation never applies)
            _, scales = quantize_weight_per_column_int8(dequantized)
            wq, ws = int8_names(node.input[1])
            zp = f"{ws}_zero_points"
            graph.initializer.extend(
                [
                    numpy_helper.from_array(scales, ws),
                    numpy_helper.from_array(np.full(scales.shape, INT8_ZERO_POINT, np.uint8), zp),
                ]
            )
            nodes.append(
                onnx.helper.make_node(
                    "QuantizeLinear", [node.input[1], ws, zp], [wq], name=f"{name}/QuantizeLinear", axis=1
                )
            )
        else:
            assert weight is not None  # the test above: a 2-D initializer weight when nothing was dequantised
            codes, scales = quantize_weight_per_column_int8(numpy_helper.to_array(weight))
            wq, ws = int8_names(weight.name)
            graph.initializer.extend([numpy_helper.from_array(codes, wq), numpy_helper.from_array(scales, ws)])
            dropped.add(weight.name)
        q, sx = quantized[x]
        out = node.output[0]
        # y = float(MatMulInteger(q, codes, 128, 128)) * s_x * s_w: scalar zero points (one per
        # tensor, MatMulInteger spec); the int32 sums are converted to float32 before the scales
        # ([..., 1] per row, [N] per column) apply. The last Mul writes the MatMul's output name,
        # so its consumers are not rewired.
        nodes += [
            onnx.helper.make_node(
                "MatMulInteger",
                [q, wq, c["zero_point"], c["zero_point"]],
                [f"{out}/int32"],
                name=f"{name}/MatMulInteger",
            ),
            onnx.helper.make_node(
                "Cast", [f"{out}/int32"], [f"{out}/acc"], name=f"{name}/Cast", to=onnx.TensorProto.FLOAT
            ),
            onnx.helper.make_node("Mul", [f"{out}/acc", sx], [f"{out}/row_scaled"], name=f"{name}/MulRowScale"),
            onnx.helper.make_node("Mul", [f"{out}/row_scaled", ws], [out], name=f"{name}/MulColumnScale"),
        ]
        replaced += 1
    del graph.node[:]
    graph.node.extend(nodes)
    # a replaced weight that some other node still reads stays
    used = {i for n in graph.node for i in n.input}
    for init in [t for t in graph.initializer if t.name in dropped and t.name not in used]:
        graph.initializer.remove(init)
    return replaced
