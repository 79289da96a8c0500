"""GatherBlockQuantized in standard ONNX operators, for onnxruntime-web's WASM build, which lacks it."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from prodip.export.graph.helpers import attr

#: The lowered embedding lookup's node names start with the GatherBlockQuantized node's name and this.
LOWERED_GBQ = "_dequantized_gather"


def _uint4_codes(init: onnx.TensorProto) -> tuple[np.ndarray, int]:
    """A 4-bit initializer's codes as unsigned uint8 values 0..15 and the offset added to them.

    UINT4 codes are returned as they are (offset 0); INT4 codes c (-8..7) as c + 8 (offset 8), so
    that ``(c + 8) - (z + 8) == c - z``: one unsigned layout for both.
    """
    # to_array gives ml_dtypes int4/uint4 arrays, which cannot hold c + 8: widen first
    values = numpy_helper.to_array(init).astype(np.int16)
    offset = 8 if init.data_type == onnx.TensorProto.INT4 else 0
    return (values + offset).astype(np.uint8), offset


def _pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """uint8 values 0..15 [..., n] -> uint8 [..., ceil(n/2)], element 2i in the low nibble (ORT's packing)."""
    # an odd count leaves the last byte's high nibble 0 (GatherBlockQuantized's zero points are
    # [rows, ceil(blocks / 2)]); unpack() slices it off again
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros(codes.shape[:-1] + (1,), np.uint8)], axis=-1)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def _lower_gbq(graph: onnx.GraphProto, node: onnx.NodeProto, inits: dict, producer: dict) -> list[onnx.NodeProto]:
    """The standard-op nodes computing GatherBlockQuantized ``node``'s output (see
    :func:`lower_gather_block_quantized`); new initializers are appended to ``graph``.

    ``inits`` maps initializer names to tensors, ``producer`` output names to nodes (to find the
    shared tied table's Reshape). The output is float32 (*ids_shape, hidden), with float32 scales
    (what prodip's quantisers write).

    Raises:
        ValueError: another gather/quantize axis, a data type other than uint8/INT4/UINT4, or
            scales whose blocks do not cover the row.
    """
    make = onnx.helper.make_node
    # defaults as in the GatherBlockQuantized schema: bits 4, block_size 128, gather_axis 0,
    # quantize_axis 1
    bits, block = attr(node, "bits", 4), attr(node, "block_size", 128)
    if attr(node, "gather_axis", 0) != 0 or attr(node, "quantize_axis", 1) not in (1, -1):
        raise ValueError(f"{node.name}: only gather_axis 0 and quantize_axis 1 are lowered")
    data, ids, scales = node.input[0], node.input[1], node.input[2]
    zero_points = node.input[3] if len(node.input) > 3 and node.input[3] else None
    p = f"{node.name}{LOWERED_GBQ}"
    init = inits.get(data)  # None for the shared tied table: a Reshape's output, not an initializer
    # INT4/UINT4 tensors are repacked as uint8 bytes, two codes per byte, low nibble first: the
    # layout unpack() decodes, and GatherBlockQuantized's own for uint8 data with bits 4
    if init is not None and init.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        codes, offset = _uint4_codes(init)
        data = f"{p}/packed_codes"
        graph.initializer.append(numpy_helper.from_array(_pack_nibbles(codes), data))
        if zero_points:  # the same type as data (spec), so the same offset, which cancels in code - zp
            zps, _ = _uint4_codes(inits[zero_points])
            zero_points = f"{p}/packed_zero_points"
            graph.initializer.append(numpy_helper.from_array(_pack_nibbles(zps), zero_points))
        # the spec's default for int4/uint4 data is 0; INT4 codes are shifted by 8, so 0 is 8
        default_zero_point = 8 if offset else 0
    elif init is not None and init.data_type != onnx.TensorProto.UINT8:
        raise ValueError(f"{node.name}: data type {init.data_type} is not lowered")
    else:
        default_zero_point = 1 << (bits - 1)  # the spec's default for uint8 data: 2^(bits-1)
    # blocks per row from the scales [vocab, ceil(hidden / block)], which counts a partial last block
    scale_init = inits.get(scales)
    blocks = int(scale_init.dims[-1]) if scale_init is not None else None
    if init is not None:  # uint8 with bits 4 holds two codes per byte; INT4/UINT4 dims count codes
        hidden = int(init.dims[-1]) * (2 if init.data_type == onnx.TensorProto.UINT8 and bits == 4 else 1)
    else:  # the shared tied table: Reshape(MatMulNBits B, [vocab, hidden / 2])
        shape = inits[producer[data].input[1]]
        hidden = int(numpy_helper.to_array(shape)[-1]) * (2 if bits == 4 else 1)
    blocks = blocks or hidden // block

    def const(name: str, value: Any, dtype: Any = np.int64) -> str:
        graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype), f"{p}/{name}"))
        return f"{p}/{name}"

    last = const("last_axis", [-1])  # int64 [-1]: Unsqueeze-13 and Slice take axes as inputs
    sixteen = const("sixteen", 16.0, np.float32) if bits == 4 else None
    # the ids' shape (e.g. [B, T]) heads every target shape below: rows are gathered per id
    new = [make("Shape", [ids], [f"{p}/ids_shape"], name=f"{p}/Shape")]

    def rows_float(src: str, tag: str) -> str:
        """Gather rows of ``src`` by the ids, as float32 (exact for uint8 values): nibbles are then
        split and zero points subtracted in float arithmetic, over the ops listed in
        :func:`lower_gather_block_quantized`."""
        new.append(make("Gather", [src, ids], [f"{p}/{tag}_rows"], name=f"{p}/Gather_{tag}", axis=0))
        new.append(
            make("Cast", [f"{p}/{tag}_rows"], [f"{p}/{tag}_f"], name=f"{p}/Cast_{tag}", to=onnx.TensorProto.FLOAT)
        )
        return f"{p}/{tag}_f"

    def unpack(x: str, tag: str, n: int) -> str:
        """float32 packed bytes [..., k] -> float32 nibbles [..., n] (n <= 2k), low nibble first.

        hi = floor(x / 16), lo = x - 16 hi (exact in float32 for 0..255); lo and hi are stacked on
        a new last axis, [..., k, 2], and reshaped to [*ids_shape, 2k], which interleaves them as
        element 2i (low), 2i+1 (high); the Slice drops the padding nibble of an odd count."""
        new.extend(
            [
                make("Div", [x, sixteen], [f"{p}/{tag}_div"], name=f"{p}/Div_{tag}"),
                make("Floor", [f"{p}/{tag}_div"], [f"{p}/{tag}_hi"], name=f"{p}/Floor_{tag}"),
                make("Mul", [f"{p}/{tag}_hi", sixteen], [f"{p}/{tag}_hi16"], name=f"{p}/Mul16_{tag}"),
                make("Sub", [x, f"{p}/{tag}_hi16"], [f"{p}/{tag}_lo"], name=f"{p}/SubLo_{tag}"),
                make("Unsqueeze", [f"{p}/{tag}_lo", last], [f"{p}/{tag}_lo1"], name=f"{p}/UnsqueezeLo_{tag}"),
                make("Unsqueeze", [f"{p}/{tag}_hi", last], [f"{p}/{tag}_hi1"], name=f"{p}/UnsqueezeHi_{tag}"),
                make(
                    "Concat",
                    [f"{p}/{tag}_lo1", f"{p}/{tag}_hi1"],
                    [f"{p}/{tag}_pairs"],
                    name=f"{p}/Concat_{tag}",
                    axis=-1,
                ),
                make(
                    "Concat",
                    [f"{p}/ids_shape", const(f"{tag}_tail", [-1])],
                    [f"{p}/{tag}_shape"],
                    name=f"{p}/Shape_{tag}",
                    axis=0,
                ),
                make(
                    "Reshape",
                    [f"{p}/{tag}_pairs", f"{p}/{tag}_shape"],
                    [f"{p}/{tag}_all"],
                    name=f"{p}/Reshape_{tag}",
                ),
                make(
                    "Slice",
                    [f"{p}/{tag}_all", const(f"{tag}_start", [0]), const(f"{tag}_end", [n]), last],
                    [f"{p}/{tag}_n"],
                    name=f"{p}/Slice_{tag}",
                ),
            ]
        )
        return f"{p}/{tag}_n"

    code_rows = rows_float(data, "codes")  # a tensor name (``codes`` above is the INT4 initializer's array)
    if bits == 4:
        code_rows = unpack(code_rows, "codes", hidden)
    # GBQ quantises a row in blocks of block_size; the last block may be partial (hidden 48, block 32:
    # 2 blocks). Pad the codes to whole blocks so they reshape to [..., blocks, block], and cut the
    # padding off the result; the padded codes are multiplied by the last block's scale and dropped.
    padded = blocks * block
    if padded < hidden:
        raise ValueError(f"{node.name}: {blocks} blocks of {block} do not cover {hidden} columns")
    if padded != hidden:
        pad = [const("pad_widths", [0, padded - hidden]), const("pad_value", 0.0, np.float32), last]
        new.append(make("Pad", [code_rows, *pad], [f"{p}/codes_padded"], name=f"{p}/PadBlocks", mode="constant"))
        code_rows = f"{p}/codes_padded"
    new.append(
        make(
            "Concat",
            [f"{p}/ids_shape", const("block_shape", [blocks, block])],
            [f"{p}/blocked_shape"],
            name=f"{p}/ShapeBlocked",
            axis=0,
        )
    )
    new.append(make("Reshape", [code_rows, f"{p}/blocked_shape"], [f"{p}/blocked"], name=f"{p}/ReshapeBlocked"))
    # zero points and scales are per block, [..., blocks]: a trailing axis broadcasts them over the
    # block's codes in [..., blocks, block]
    if zero_points:
        zp = rows_float(zero_points, "zero_points")
        if bits == 4:
            zp = unpack(zp, "zero_points", blocks)
        new.append(make("Unsqueeze", [zp, last], [f"{p}/zero_points_1"], name=f"{p}/UnsqueezeZeroPoints"))
        zp = f"{p}/zero_points_1"
    else:
        zp = const("default_zero_point", float(default_zero_point), np.float32)  # a scalar broadcasts
    # (code - zero_point) * scale, in this order and in float32: the kernel's computation
    new.append(make("Sub", [f"{p}/blocked", zp], [f"{p}/centred"], name=f"{p}/SubZeroPoint"))
    new.append(make("Gather", [scales, ids], [f"{p}/scale_rows"], name=f"{p}/Gather_scales", axis=0))
    new.append(make("Unsqueeze", [f"{p}/scale_rows", last], [f"{p}/scale_1"], name=f"{p}/UnsqueezeScale"))
    new.append(make("Mul", [f"{p}/centred", f"{p}/scale_1"], [f"{p}/scaled"], name=f"{p}/MulScale"))
    new.append(
        make(
            "Concat",
            [f"{p}/ids_shape", const("hidden", [padded])],
            [f"{p}/out_shape"],
            name=f"{p}/ShapeOut",
            axis=0,
        )
    )
    # the last node writes the GatherBlockQuantized's output name: its consumers are not rewired
    if padded == hidden:
        new.append(make("Reshape", [f"{p}/scaled", f"{p}/out_shape"], [node.output[0]], name=f"{p}/ReshapeOut"))
        return new
    new.append(make("Reshape", [f"{p}/scaled", f"{p}/out_shape"], [f"{p}/out_padded"], name=f"{p}/ReshapeOut"))
    cut = [const("cut_start", [0]), const("cut_end", [hidden]), last]
    new.append(make("Slice", [f"{p}/out_padded", *cut], [node.output[0]], name=f"{p}/SliceBlocks"))
    return new


def lower_gather_block_quantized(model: onnx.ModelProto) -> int:
    """Replace every ``com.microsoft.GatherBlockQuantized`` (GBQ) by standard ONNX operators, in place.

    onnxruntime-web's WebGPU/JSEP WASM build -- the one transformers.js loads in a browser, also
    for its ``wasm`` device -- has no CPU kernel for GBQ ("Could not find an implementation for
    GatherBlockQuantized(1)"), while Gather, Cast, Floor, Sub, Mul, Reshape, Concat, Shape, Slice
    and Unsqueeze it has. The quantised bytes stay as they are (a 4-bit table stays 4 bits per
    weight in the file and in memory, a table shared with a tied lm_head stays shared); only rows
    indexed by the ids are dequantised, at run time:

    * gather the code rows (uint8 [..., H] for 8 bits; packed uint8 [..., H/2] for 4 bits, element
      2i in the low nibble: unpacked in float32 as ``hi = floor(x / 16)``, ``lo = x - 16 hi``, exact
      for 0..255), the zero-point rows (packed the same way for 4 bits) and the scale rows;
    * ``(code - zero_point) * scale`` per block of ``block_size`` along the last axis, in float32,
      the operation GBQ's CPU kernel performs (contrib_ops/cpu/quantization/gather_block_quantized.cc),
      so the embedding is bit-identical to GBQ's on ONNX Runtime CPU.

    Absent zero points are GBQ's defaults: 2^(bits-1) for uint8 data, 0 for INT4 data. INT4/UINT4
    initializers are rewritten as packed uint8 (INT4 codes and zero points offset by 8, which the
    subtraction cancels). Only GBQs with ``gather_axis`` 0 over 2-D data quantised along its last
    axis occur in prodip's graphs; any other raises ValueError (a bug, not an input error).

    Returns:
        The number of GBQ nodes replaced.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    nodes, lowered, read = [], 0, set()
    for node in graph.node:
        if node.op_type != "GatherBlockQuantized":
            nodes.append(node)
            continue
        read.update(node.input)
        # in the GBQ's place: the new nodes read what it read, so the order stays topological
        nodes.extend(_lower_gbq(graph, node, inits, producer))
        lowered += 1
    if lowered:
        del graph.node[:]
        graph.node.extend(nodes)
        # INT4/UINT4 tables and zero points were repacked under new names: the originals go;
        # uint8 data and the scales are still read by the Gathers and stay
        used = {i for n in graph.node for i in n.input}
        for init in [t for t in graph.initializer if t.name in read and t.name not in used]:
            graph.initializer.remove(init)
    return lowered
