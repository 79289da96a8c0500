"""The decoder's contract checks and output pruning: the mask-length check, unread optional outputs."""

from __future__ import annotations

import onnx

#: Name of the Reshape that enforces the decoder's mask contract: ONNX Runtime's error for a wrong
#: mask length names this node.
MASK_CHECK_NODE = "attention_mask_length_must_equal_past_plus_sequence_length"


def add_mask_length_check(model: onnx.ModelProto) -> None:
    """Make the decoder refuse an ``attention_mask`` whose length is not ``past + T``, in place.

    Every consumer of the ``attention_mask`` input reads ``Reshape(attention_mask, [B, P + T])``
    instead, with B and T from ``input_ids`` and P from ``past_key_values.0.key``: the same tensor
    when the contract holds, and a run-time error otherwise (ONNX Runtime: "Non-zero status code
    returned while running Reshape node. Name:'attention_mask_length_must_equal_past_plus_sequence_length'
    ... The input tensor cannot be reshaped to the requested shape"). Without it a (B, 1) mask is
    silently broadcast over every cache slot (case C3), and GroupQueryAttention reads a shorter mask
    as a preallocated ("static") cache.

    Reshape checks the element count only: a mask of B * (P + T) elements in another 2-D shape
    (e.g. (1, 2 (P + T)) for B = 2) is reshaped, not refused.

    Args:
        model: an exported decoder with the inputs of :mod:`prodip.base.onnx_io`.
    Raises:
        ValueError: the graph has no ``attention_mask`` or no ``past_key_values.0.key`` input.
    """
    graph = model.graph
    checked = "attention_mask_checked"
    names = {i.name for i in graph.input}
    if "attention_mask" not in names or "past_key_values.0.key" not in names:
        raise ValueError("add_mask_length_check: the graph lacks attention_mask or past_key_values.0.key")

    def const(name: str, value: int) -> onnx.NodeProto:
        return onnx.helper.make_node(
            "Constant", [], [name], value=onnx.helper.make_tensor(name, onnx.TensorProto.INT64, [1], [value])
        )

    p = "mask_check/"
    # target shape [B, P + T] (int64 [2]): B = ids_shape[0:1], T = ids_shape[1:2], P = the past
    # axis of (B, Hkv, P, Dh), read with Shape-15's start/end (an int64 [1], no Gather needed).
    # Every entry is positive (B, T >= 1): no 0 or -1, so Reshape infers nothing from the mask.
    nodes = [
        onnx.helper.make_node("Shape", ["input_ids"], [p + "ids_shape"]),
        onnx.helper.make_node("Shape", ["past_key_values.0.key"], [p + "past"], start=2, end=3),
        const(p + "zero", 0),
        const(p + "one", 1),
        const(p + "two", 2),
        onnx.helper.make_node("Slice", [p + "ids_shape", p + "zero", p + "one"], [p + "batch"]),
        onnx.helper.make_node("Slice", [p + "ids_shape", p + "one", p + "two"], [p + "seq"]),
        onnx.helper.make_node("Add", [p + "past", p + "seq"], [p + "total"]),
        onnx.helper.make_node("Concat", [p + "batch", p + "total"], [p + "shape"], axis=0),
        onnx.helper.make_node("Reshape", ["attention_mask", p + "shape"], [checked], name=MASK_CHECK_NODE),
    ]
    # rewire before inserting, so the check itself still reads the raw input
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == "attention_mask":
                node.input[i] = checked
    # at the front: the check reads graph inputs only, and every former mask reader comes after it
    for i, node in enumerate(nodes):
        graph.node.insert(i, node)


def drop_unused_outputs(
    model: onnx.ModelProto, op_types: tuple[str, ...] = ("SkipSimplifiedLayerNormalization",)
) -> int:
    """Blank the optional outputs of ``op_types`` nodes that nothing reads (a kernel then skips them), in place.

    The exporter names every declared output. SkipSimplifiedLayerNormalization (onnxruntime
    docs/ContribOperators.md) has ``output`` and the optional ``mean``, ``inv_std_var`` and
    ``input_skip_bias_sum``; the decoder reads outputs 0 and 3 (:mod:`prodip.export.contrib`).
    An empty name is how ONNX marks an optional output as absent.

    Returns:
        The number of outputs blanked.
    """
    used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    n = 0
    for node in model.graph.node:
        if node.op_type in op_types:
            for i in range(1, len(node.output)):  # output 0 is required by the op's schema
                if node.output[i] and node.output[i] not in used:
                    node.output[i] = ""
                    n += 1
    return n
