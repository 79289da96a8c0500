"""A tied lm_head and embedding held once in the quantised files.

With ``tie_word_embeddings``, :func:`find_tied_embedding` finds the shared table in the fp32 graph;
:func:`materialize_transposed_weights` gives the lm_head its own transposed initializer so ORT's
quantisers see it; :func:`share_tied_embedding_int4` and :func:`share_tied_embedding_int8` then point
the embedding lookup at the lm_head's quantised tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx
from onnx import numpy_helper

from prodip.export.graph.helpers import attr
from prodip.export.graph.int8 import ROWWISE, int8_names


def materialize_transposed_weights(model: onnx.ModelProto) -> int:
    """Replace ``Transpose(initializer)`` by a transposed initializer, in place.

    The exporter leaves the tied lm_head as ``MatMul(x, Transpose(embed_tokens.weight))`` (one
    stored copy); weight quantisers only touch MatMuls whose weight *is* an initializer, so the
    quantised variants get their own transposed copy (quantised, it costs far less than fp32).
    Every Transpose of an initializer is folded, not only the lm_head's; the original initializer
    is not removed (a tied table's embedding Gather still reads it).

    Returns:
        Number of Transpose nodes folded.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    folded = 0
    for node in list(graph.node):
        if node.op_type != "Transpose" or node.input[0] not in inits:
            continue
        array = numpy_helper.to_array(inits[node.input[0]])
        # no perm attribute: ONNX Transpose reverses the axes, as numpy's transpose(None) does
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        # the initializer takes the Transpose's output name, so its consumers (the lm_head MatMul)
        # need no rewiring; C order, as numpy_helper stores it (the lm_head's: [hidden, vocab])
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(array.transpose(perm)), node.output[0]))
        graph.node.remove(node)
        folded += 1
    return folded


@dataclass(frozen=True)
class TiedEmbedding:
    """A tied lm_head in the fp32 graph: ``Gather(E, ids)`` and ``MatMul(x, Transpose(E))``, E [V, H].

    Attributes:
        table: name of the embedding initializer E (float32 [vocab, hidden]).
        vocab, hidden: E's shape.
        transposed: name of the ``Transpose(E)`` output, i.e. of the [hidden, vocab] initializer
            :func:`materialize_transposed_weights` creates for the lm_head MatMul.
        gather_node, embedding, indices: the embedding Gather's node name, output and indices input.
        logits: output of the lm_head MatMul.
    """

    table: str
    vocab: int
    hidden: int
    transposed: str
    gather_node: str
    embedding: str
    indices: str
    logits: str


def find_tied_embedding(graph: onnx.GraphProto) -> Optional[TiedEmbedding]:
    """The tied embedding of an fp32 decoder graph (before :func:`materialize_transposed_weights`), or None.

    Tied means: the MatMul producing ``logits`` reads ``Transpose(E)`` (perm [1, 0] or default)
    of a 2-D initializer E that is also the data of exactly one Gather (axis 0).

    None also when that Gather has no name: :func:`share_tied_embedding_int4` and
    :func:`share_tied_embedding_int8` name the nodes they write after it.
    """
    inits = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    # "logits": the decoder's output name (prodip.base.onnx_io); its producer is the lm_head
    lm_head = next((n for n in graph.node if n.op_type == "MatMul" and "logits" in n.output), None)
    if lm_head is None:
        return None
    transpose = producer.get(lm_head.input[1])
    if transpose is None or transpose.op_type != "Transpose" or transpose.input[0] not in inits:
        return None
    table = inits[transpose.input[0]]
    # absent perm reverses the axes: [1, 0] for a 2-D table
    perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), [1, 0])
    if len(table.dims) != 2 or perm != [1, 0]:
        return None
    gathers = [
        n
        for n in graph.node
        if n.op_type == "Gather"
        and n.input[0] == table.name
        and next((a.i for a in n.attribute if a.name == "axis"), 0) == 0
    ]
    if len(gathers) != 1 or not gathers[0].name:
        return None
    gather = gathers[0]
    return TiedEmbedding(
        table=table.name,
        vocab=int(table.dims[0]),
        hidden=int(table.dims[1]),
        transposed=transpose.output[0],
        gather_node=gather.name,
        embedding=gather.output[0],
        indices=gather.input[1],
        logits=lm_head.output[0],
    )


def _replace_embedding_nodes(graph: onnx.GraphProto, tied: TiedEmbedding, new_nodes: list[onnx.NodeProto]) -> None:
    """Swap the nodes computing ``tied.embedding`` from ``tied.indices`` for ``new_nodes``, in place.

    Removed: the producer of ``tied.embedding`` and, walking up its first input, every producer
    up to the indices (e.g. int8's ``Gather -> DequantizeLinear``). Initializers only they read
    are dropped. ``new_nodes`` go where the first removed node was (indices and initializers are
    all they read, so the order stays topological).

    Raises:
        ValueError: ``tied.embedding`` is not computed from ``tied.indices`` along first inputs (a bug).
    """
    producer = {out: node for node in graph.node for out in node.output}
    chain, name = [], tied.embedding
    while name in producer:
        node = producer[name]
        chain.append(node)
        if tied.indices in node.input:  # the lookup itself (Gather or GatherBlockQuantized)
            break
        name = node.input[0]  # the data path: DequantizeLinear's x, Cast's input, ...
    else:
        raise ValueError(f"no path from {tied.indices!r} to {tied.embedding!r}")  # a bug, not an input error
    position = min(list(graph.node).index(n) for n in chain)
    read = {i for n in chain for i in n.input}
    for node in chain:
        graph.node.remove(node)
    for i, node in enumerate(new_nodes):
        graph.node.insert(position + i, node)
    # computed after the insertion: the lm_head tensors the new nodes read are kept
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for init in [t for t in graph.initializer if t.name in read and t.name not in used]:
        graph.initializer.remove(init)


def share_tied_embedding_int4(model: onnx.ModelProto, tied: TiedEmbedding) -> Optional[str]:
    """Make the int4 embedding lookup read the lm_head's MatMulNBits weights, in place.

    Layouts (ONNX Runtime's contrib-op spec, docs/ContribOperators.md (the schemas registered in
    onnxruntime 1.32), and its CPU kernel contrib_ops/cpu/quantization/gather_block_quantized.cc):

    * ``com.microsoft.MatMulNBits`` (lm_head, K = hidden, N = vocab, bits 4, block_size b):
      B uint8 [vocab, hidden/b, b/2], blocks along K, two 4-bit codes per byte, element 2i in the
      low nibble and 2i+1 in the high one; scales float32 [vocab, hidden/b]; zero_points uint8
      [vocab, ceil((hidden/b)/2)] packed the same way, absent = 8 (2^(bits-1)). Weight =
      (code - zero_point) * scale, i.e. row n of B holds vocab entry n's embedding vector.
    * ``com.microsoft.GatherBlockQuantized`` with uint8 data and ``bits=4`` follows MatMulNBits's
      conventions exactly: data uint8 [vocab, hidden/2] packed along the last axis, low nibble
      first; quantize_axis must be the last axis and gather_axis 0; scales [vocab, hidden/b];
      zero_points uint8 [vocab, ceil((hidden/b)/2)], low nibble first, absent = 8.

    With hidden a multiple of b, B's bytes read row-major ARE that data tensor, so the Gather reads
    ``Reshape(B, [vocab, hidden/2])`` (no copy in the file; ORT may fold it at session load) and
    the very same scales and zero points. The embedding's own uint4 tensors are dropped. The
    embedding then holds the lm_head's codes (ORT's C++ RTN), bit for bit; ORT's numpy Gather
    quantiser differed from them only at rounding ties (2 of 2.1 M codes on a random demo-shaped
    model).

    Args:
        model: the int4 graph after ``MatMulNBitsQuantizer`` (lm_head MatMulNBits, embedding
            GatherBlockQuantized); tied: :func:`find_tied_embedding` of its fp32 graph.
    Returns:
        None when shared, else why not (the graph is then left as it was).
    """
    graph = model.graph
    # the quantiser keeps output names, so the lm_head is found by tied.logits and the lookup by
    # tied.embedding
    mnb = next((n for n in graph.node if n.op_type == "MatMulNBits" and n.output[0] == tied.logits), None)
    producer = {out: node for node in graph.node for out in node.output}
    gbq = producer.get(tied.embedding)
    if mnb is None:
        return "the lm_head is not a MatMulNBits node"
    if gbq is None or gbq.op_type != "GatherBlockQuantized":
        return "the embedding is not a GatherBlockQuantized node"
    block = attr(mnb, "block_size")
    # K = hidden, N = vocab: B's row n is then vocabulary entry n (the layout above); bits 4 is
    # MatMulNBits's default
    if (attr(mnb, "K"), attr(mnb, "N"), attr(mnb, "bits", 4)) != (tied.hidden, tied.vocab, 4):
        return f"MatMulNBits K/N/bits {attr(mnb, 'K')}/{attr(mnb, 'N')}/{attr(mnb, 'bits')} do not match the table"
    if tied.hidden % block:
        return f"hidden {tied.hidden} is not a multiple of block_size {block} (MatMulNBits pads the last block)"
    weight, scales = mnb.input[1], mnb.input[2]
    # symmetric int4 has none; both ops then use 8, so leaving it out keeps the two in agreement
    zero_points = mnb.input[3] if len(mnb.input) > 3 and mnb.input[3] else None
    shape = f"{weight}_as_embedding_shape"
    data = f"{weight}_as_embedding"
    # Reshape's shape input must be int64 (ONNX Reshape); [vocab, hidden/2] is B [vocab, hidden/b, b/2]
    # with its last two axes merged: the same bytes, no second table in the file
    graph.initializer.append(numpy_helper.from_array(np.array([tied.vocab, tied.hidden // 2], np.int64), shape))
    reshape = onnx.helper.make_node("Reshape", [weight, shape], [data], name=f"{tied.gather_node}_shared_reshape")
    gather = onnx.helper.make_node(
        "GatherBlockQuantized",
        [data, tied.indices, scales] + ([zero_points] if zero_points else []),
        [tied.embedding],
        name=gbq.name,
        domain="com.microsoft",
        bits=4,
        block_size=block,
        # the spec's constraints for packed uint8 data: gather rows (axis 0), blocks along the
        # last axis (the packing axis), as MatMulNBits blocks along K
        gather_axis=0,
        quantize_axis=1,
    )
    _replace_embedding_nodes(graph, tied, [reshape, gather])
    return None


def share_tied_embedding_int8(model: onnx.ModelProto, tied: TiedEmbedding) -> Optional[str]:
    """Make the int8 embedding lookup read the lm_head's row-wise int8 weights, in place.

    After :func:`quantize_matmuls_rowwise_int8` the lm_head is ``MatMulInteger(q, C, 128, 128)`` with
    codes C uint8 [hidden, vocab] and one scale per vocabulary entry s float32 [vocab]: the tied
    table E [vocab, hidden] is ~ (C^T - 128) * s[:, None]. The embedding becomes
    ``(float(Gather(Transpose(C), ids)) - 128) * Unsqueeze(Gather(s, ids), -1)`` in standard
    operators; ONNX Runtime folds the constant Transpose when it loads the session, so the file
    holds the table once. The embedding's fp32 table is dropped.

    Args:
        model: the graph after :func:`quantize_matmuls_rowwise_int8`; tied: :func:`find_tied_embedding`
            of its fp32 graph.
    Returns:
        None when shared, else why not (the graph is then left as it was).
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    # the lm_head's weight is tied.transposed (materialize_transposed_weights)
    codes, scales = (inits.get(name) for name in int8_names(tied.transposed))
    if codes is None or scales is None:
        return f"no row-wise int8 codes of the lm_head weight {tied.transposed!r}"
    if list(codes.dims) != [tied.hidden, tied.vocab]:
        return f"the lm_head codes {codes.name!r} are {list(codes.dims)}, not [hidden, vocab] = [{tied.hidden}, {tied.vocab}]"
    p = f"{tied.gather_node}_shared"
    make = onnx.helper.make_node
    # C [hidden, vocab] -> [vocab, hidden] so a Gather on axis 0 reads one vocabulary entry per id;
    # the codes are cast to float32 before the zero point is subtracted (in uint8, codes below 128
    # cannot go negative); the row scales s[ids] (B, T) get a trailing axis to broadcast over
    # hidden. The Gather keeps the old lookup's node name.
    new = [
        make("Transpose", [codes.name], [f"{p}/table"], name=f"{p}/Transpose", perm=[1, 0]),
        make("Gather", [f"{p}/table", tied.indices], [f"{p}/codes"], name=tied.gather_node, axis=0),
        make("Cast", [f"{p}/codes"], [f"{p}/codes_f"], name=f"{p}/Cast", to=onnx.TensorProto.FLOAT),
        make("Sub", [f"{p}/codes_f", f"{ROWWISE}_zero_point_f"], [f"{p}/centred"], name=f"{p}/Sub"),
        make("Gather", [scales.name, tied.indices], [f"{p}/row_scale"], name=f"{p}/GatherScale", axis=0),
        make("Unsqueeze", [f"{p}/row_scale", f"{ROWWISE}_last_axis"], [f"{p}/row_scale_1"], name=f"{p}/Unsqueeze"),
        make("Mul", [f"{p}/centred", f"{p}/row_scale_1"], [tied.embedding], name=f"{p}/Mul"),
    ]
    _replace_embedding_nodes(graph, tied, new)
    return None


def share_tied_embedding_int4_qdq(model: onnx.ModelProto, tied: TiedEmbedding) -> Optional[str]:
    """Make the embedding lookup of a QDQ int4 graph read the lm_head's 4-bit weight, in place.

    After ``MatMulNBitsQuantizer(quant_format=QDQ)`` the lm_head is ``MatMul(x, DequantizeLinear(W,
    s, z))`` (ONNX opset 21, blocked: ``axis`` 0, ``block_size`` b): W UINT4 [hidden, vocab]
    (INT4 when symmetric), s float32 [hidden/b, vocab], z UINT4 [hidden/b, vocab] or absent (0,
    the ONNX default for int4 types), weight = (W - z) * s. Column v of W is vocabulary entry v's
    embedding vector, so the lookup becomes, in standard operators::

        codes = Transpose(Cast(W, uint8|int8))            # [vocab, hidden], constant
        rows  = Cast(Gather(codes, ids), float)           # [*ids, hidden]
        rows  = Reshape(rows, [*ids, hidden/b, b])
        out   = (rows - Gather(Transpose(Cast(z, float)), ids)[..., None])
                * Gather(Transpose(s), ids)[..., None]     # then Reshape to [*ids, hidden]

    which is ``DequantizeLinear``'s formula on the same codes, so the embedding holds the
    lm_head's dequantised weights bit for bit. Every operand of the Cast/Transpose chains is an
    initializer, so ONNX Runtime constant-folds them at session load (native and onnxruntime-web
    alike): one byte per weight in memory, the 4-bit table once in the file. The DequantizeLinear
    node itself is left alone, so ONNX Runtime's QDQ fusion still turns the lm_head into
    ``MatMulNBits`` (a DequantizeLinear output with a second consumer would not be fused).

    Args:
        model: the QDQ int4 graph (lm_head ``DequantizeLinear`` + ``MatMul``; embedding still the
            fp32 ``Gather``); tied: :func:`find_tied_embedding` of its fp32 graph.
    Returns:
        None when shared, else why not (the graph is then left as it was).
    """
    graph = model.graph
    make = onnx.helper.make_node
    producer = {out: node for node in graph.node for out in node.output}
    inits = {t.name: t for t in graph.initializer}
    lm_head = producer.get(tied.logits)
    if lm_head is None or lm_head.op_type != "MatMul":
        return "the lm_head is not a MatMul"
    dq = producer.get(lm_head.input[1])
    if dq is None or dq.op_type != "DequantizeLinear":
        return "the lm_head's weight is not a DequantizeLinear output"
    weight, scales = dq.input[0], dq.input[1]
    zero_points = dq.input[2] if len(dq.input) > 2 and dq.input[2] else None
    if weight not in inits or scales not in inits or (zero_points and zero_points not in inits):
        return "the lm_head's DequantizeLinear inputs are not initializers"
    w = inits[weight]
    if w.data_type not in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return f"the lm_head's weight has data type {w.data_type}, not INT4/UINT4"
    block = attr(dq, "block_size", 0)
    if attr(dq, "axis", 1) != 0 or not block:
        return "the lm_head's DequantizeLinear is not blocked along axis 0"
    if list(w.dims) != [tied.hidden, tied.vocab]:
        return f"the lm_head's weight has shape {list(w.dims)}, not [hidden, vocab] {[tied.hidden, tied.vocab]}"
    if tied.hidden % block:
        return f"hidden {tied.hidden} is not a multiple of block_size {block}"
    p = f"{tied.gather_node}_shared"
    code_type = onnx.TensorProto.INT8 if w.data_type == onnx.TensorProto.INT4 else onnx.TensorProto.UINT8

    def const(name: str, value: list[int]) -> str:
        graph.initializer.append(numpy_helper.from_array(np.asarray(value, np.int64), f"{p}/{name}"))
        return f"{p}/{name}"

    last = const("last_axis", [-1])
    nodes = [
        # constants, folded at load: codes one per byte (Gather has no 4-bit types), rows = vocab entries
        make("Cast", [weight], [f"{p}/codes_kn"], name=f"{p}/CastCodes", to=code_type),
        make("Transpose", [f"{p}/codes_kn"], [f"{p}/codes"], name=f"{p}/TransposeCodes", perm=[1, 0]),
        make("Transpose", [scales], [f"{p}/scales"], name=f"{p}/TransposeScales", perm=[1, 0]),
        # per step: the ids' rows
        make("Shape", [tied.indices], [f"{p}/ids_shape"], name=f"{p}/Shape"),
        make("Gather", [f"{p}/codes", tied.indices], [f"{p}/code_rows"], name=f"{p}/GatherCodes", axis=0),
        make("Cast", [f"{p}/code_rows"], [f"{p}/code_rows_f"], name=f"{p}/CastRows", to=onnx.TensorProto.FLOAT),
        make(
            "Concat",
            [f"{p}/ids_shape", const("blocks", [tied.hidden // block, block])],
            [f"{p}/blocked_shape"],
            name=f"{p}/BlockedShape",
            axis=0,
        ),
        make("Reshape", [f"{p}/code_rows_f", f"{p}/blocked_shape"], [f"{p}/blocked"], name=f"{p}/Blocked"),
    ]
    centred = f"{p}/blocked"
    if zero_points:
        nodes += [
            make("Cast", [zero_points], [f"{p}/zp_kn"], name=f"{p}/CastZeroPoints", to=onnx.TensorProto.FLOAT),
            make("Transpose", [f"{p}/zp_kn"], [f"{p}/zp"], name=f"{p}/TransposeZeroPoints", perm=[1, 0]),
            make("Gather", [f"{p}/zp", tied.indices], [f"{p}/zp_rows"], name=f"{p}/GatherZeroPoints", axis=0),
            make("Unsqueeze", [f"{p}/zp_rows", last], [f"{p}/zp_rows1"], name=f"{p}/UnsqueezeZeroPoints"),
            make("Sub", [centred, f"{p}/zp_rows1"], [f"{p}/centred"], name=f"{p}/SubZeroPoints"),
        ]
        centred = f"{p}/centred"
    nodes += [
        make("Gather", [f"{p}/scales", tied.indices], [f"{p}/scale_rows"], name=f"{p}/GatherScales", axis=0),
        make("Unsqueeze", [f"{p}/scale_rows", last], [f"{p}/scale_rows1"], name=f"{p}/UnsqueezeScales"),
        make("Mul", [centred, f"{p}/scale_rows1"], [f"{p}/scaled"], name=f"{p}/MulScales"),
        make(
            "Concat",
            [f"{p}/ids_shape", const("hidden", [tied.hidden])],
            [f"{p}/out_shape"],
            name=f"{p}/OutShape",
            axis=0,
        ),
        make("Reshape", [f"{p}/scaled", f"{p}/out_shape"], [tied.embedding], name=f"{p}/Reshape"),
    ]
    _replace_embedding_nodes(graph, tied, nodes)
    return None
