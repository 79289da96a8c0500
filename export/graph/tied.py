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
    transpose = producer.get(lm_head.input[1]) if lm_head is not None else None
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
