"""The 8-bit embedding lookup: ``com.microsoft.GatherBlockQuantized`` with ``bits=8``.

ORT's ``MatMulNBitsQuantizer`` quantises Gathers at 4 bits only; :func:`find_embedding_gather` and
:func:`quantize_embedding_int8` do the 8-bit one with ORT's own MatMulNBits kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.capi._pybind_state import quantize_matmul_8bits

from prodip.export.graph.helpers import attr
from prodip.export.graph.int8 import int8_names


@dataclass(frozen=True)
class EmbeddingGather:
    """The token-embedding lookup of an fp32 decoder: ``Gather(table, input_ids, axis=0)``.

    Attributes:
        node: the Gather's node name; table: its float32 [vocab, hidden] initializer;
        indices: its indices input (``input_ids``); embedding: its output.
    """

    node: str
    table: str
    indices: str
    embedding: str


def find_embedding_gather(graph: onnx.GraphProto) -> Optional[EmbeddingGather]:
    """The Gather (axis 0) of a 2-D float32 initializer by a graph input (``input_ids``), or None.

    Call it on the fp32 graph before quantisation: the first match in node order is returned.
    """
    inits = {t.name: t for t in graph.initializer}
    inputs = {i.name for i in graph.input}
    for n in graph.node:
        if (
            n.op_type == "Gather"
            and n.input[0] in inits
            and n.input[1] in inputs
            and len(inits[n.input[0]].dims) == 2
            and inits[n.input[0]].data_type == onnx.TensorProto.FLOAT
            and attr(n, "axis", 0) == 0
        ):
            return EmbeddingGather(node=n.name, table=n.input[0], indices=n.input[1], embedding=n.output[0])
    return None


def quantize_embedding_int8(model: onnx.ModelProto, emb: EmbeddingGather, block_size: int) -> None:
    """Replace the fp32 embedding Gather by ``com.microsoft.GatherBlockQuantized`` (bits 8), in place.

    The table E float32 [vocab, hidden] is quantised by ONNX Runtime's own MatMulNBits kernel
    (``onnxruntime.capi._pybind_state.quantize_matmul_8bits`` on E^T, K = hidden, N = vocab,
    symmetric): codes uint8 [vocab, hidden/block, block] (code - 128) * scale, scales float32
    [vocab, hidden/block], i.e. exactly the layout GatherBlockQuantized reads for uint8 data with
    ``bits=8`` (data [vocab, hidden], quantize_axis 1, absent zero points = 128; ORT's
    ContribOperators.md). ORT's ``MatMulNBitsQuantizer`` quantises Gathers at 4 bits only, hence
    this helper.

    Args:
        emb: :func:`find_embedding_gather` of the fp32 graph; block_size: weights per scale, one of
            the sizes GatherBlockQuantized accepts (a power of 2, >= 16; checked by the caller).
    Raises:
        ValueError: ``hidden`` is not a multiple of ``block_size`` (a bug of the caller, who checks it).
    """
    graph = model.graph
    init = next(t for t in graph.initializer if t.name == emb.table)
    table = numpy_helper.to_array(init).astype(np.float32)
    vocab, hidden = table.shape
    if hidden % block_size:
        raise ValueError(f"hidden {hidden} is not a multiple of block_size {block_size}")
    blocks = hidden // block_size
    codes = np.zeros((vocab, blocks, block_size), np.uint8)
    scales = np.zeros((vocab, blocks), np.float32)
    zero_points = np.zeros((vocab, blocks), np.uint8)  # unused when symmetric
    # The kernel quantises a MatMul weight B [K, N] (row-major) in blocks along K and writes the
    # codes and scales per output column n. With B = E^T (K = hidden, N = vocab), column n is
    # vocabulary row n: the codes come out [vocab, blocks, block], rows of E. Arguments as ORT's
    # MatMulNBitsQuantizer passes them: (dst, src, scales, zero_points, block_size, N, K, symmetric).
    quantize_matmul_8bits(codes, np.ascontiguousarray(table.T), scales, zero_points, block_size, vocab, hidden, True)
    data, scale = int8_names(emb.table)
    # [vocab, blocks, block] -> [vocab, hidden]: the same bytes, the 2-D data GatherBlockQuantized reads
    graph.initializer.extend(
        [numpy_helper.from_array(codes.reshape(vocab, hidden), data), numpy_helper.from_array(scales, scale)]
    )
    gather = onnx.helper.make_node(
        "GatherBlockQuantized",
        # no zero points: GatherBlockQuantized's default for uint8 data is 2^(bits-1) = 128, the
        # kernel's symmetric zero point
        [data, emb.indices, scale],
        [emb.embedding],
        name=emb.node,
        domain="com.microsoft",
        bits=8,
        block_size=block_size,
        gather_axis=0,
        quantize_axis=1,
    )
    # replaced where it stood: it reads only an initializer and a graph input, so the order stays
    # topological (matched by output too, in case the name is empty or shared)
    old = next(n for n in graph.node if n.name == emb.node and emb.embedding in n.output)
    position = list(graph.node).index(old)
    graph.node.remove(old)
    graph.node.insert(position, gather)
    if not any(emb.table in n.input for n in graph.node):
        graph.initializer.remove(init)
    # a node of a domain the model does not import fails onnx.checker and session load; ORT's
    # contrib operators are all registered at version 1 of com.microsoft
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
