"""The decoder as onnxruntime-genai runs it: a shared past/present buffer, rotary inside
GroupQueryAttention, padding masked by sequence length (:func:`shared_buffer_graph`)."""

from __future__ import annotations

from typing import Optional

import onnx

from prodip.export.graph.helpers import attr
from prodip.export.graph.mask import MASK_CHECK_NODE


def fold_rotary_into_attention(model: onnx.ModelProto) -> int:
    """Let each ``GroupQueryAttention`` rotate its own queries and keys from the packed q/k/v, in place.

    The contrib graph computes ``Split(qkv) -> RotaryEmbedding(q), RotaryEmbedding(k) -> GQA(q, k,
    v)``; this rewrites it as ``GQA(qkv, '', '', ..., cos_cache, sin_cache, position_ids)`` with
    ``do_rotary=1`` (onnxruntime docs/ContribOperators.md, GroupQueryAttention: packed QKV when
    ``key`` and ``value`` are omitted; inputs 7-9), the form onnxruntime-genai's model builder
    writes: three nodes fewer per layer (bench/results/genai_builder_rotary_*).

    The rotation is the same (rotate-half, the same cos/sin tables), with one condition on the
    positions. ONNX Runtime 1.32's CPU kernel rotates a decode step (T = 1) at ``position_ids``
    (B, 1), but a prompt (T > 1) at ``position_ids[0, 0] + t`` for every row: right for every row
    whose positions are consecutive from the same start, which is what onnxruntime-genai feeds
    (positions are column indices, DefaultPositionInputs::CreateAndInitializePositionIDs; its
    padding, on the right, is never read: :func:`right_padded_attention`) and what prodip's serve
    engine feeds (no padding, every row of a batch at the same length), and wrong for a
    left-padded prompt numbered from its first real token (the contract graph's callers may send
    one), so the contract graph keeps the explicit RotaryEmbedding.
    Measured: tests/export/test_runtime_configs.py (prompt and decode, batch 1 and 2, against the
    contract graph).

    Args:
        model: a contrib-graph decoder (:mod:`prodip.export.contrib`), after quantisation.
    Returns:
        The number of GroupQueryAttention nodes folded: one per layer; 0 for an fp16 graph, whose
        contract graph rounds the rotated q/k to fp16 (folding would change its greedy ids).
    """
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    folded = 0
    for node in graph.node:
        # GroupQueryAttention inputs (ContribOperators.md): 0 query (or packed qkv), 1 key, 2 value,
        # 3 past_key, 4 past_value, 5 seqlens_k, 6 total_sequence_length, 7 cos_cache, 8 sin_cache,
        # 9 position_ids, 10 attention_bias. Slots 7-9 must exist (the contrib graph writes them
        # empty ahead of its bias) and be empty: run this before right_padded_attention, which
        # drops trailing empty inputs.
        if node.op_type != "GroupQueryAttention" or attr(node, "do_rotary", 0) or len(node.input) < 10:
            continue
        if any(node.input[i] for i in (7, 8, 9)):
            continue
        rq, rk = producer.get(node.input[0]), producer.get(node.input[1])
        if rq is None or rk is None or not rq.op_type == rk.op_type == "RotaryEmbedding":
            continue
        # RotaryEmbedding(input, position_ids, cos_cache, sin_cache): GQA takes one set for q and k,
        # so both must read the same three; its rotation here is non-interleaved (rotate-half)
        if list(rq.input[1:4]) != list(rk.input[1:4]) or attr(rq, "interleaved", 0) or attr(rk, "interleaved", 0):
            continue
        # q, k, v straight from one Split. An fp16 graph casts them to fp32 first, and there the
        # contract graph's rotated q/k are rounded to fp16 where GroupQueryAttention's are not:
        # logits move by ~1e-3 and greedy ids can differ from the contract graph's, so it keeps
        # its RotaryEmbedding nodes.
        split = producer.get(rq.input[0])
        if split is None or split.op_type != "Split" or list(split.output) != [rq.input[0], rk.input[0], node.input[2]]:
            continue
        position_ids, cos_cache, sin_cache = rq.input[1:4]
        # query = the packed qkv the Split read; key and value empty select GQA's packed mode
        node.input[0], node.input[1], node.input[2] = split.input[0], "", ""
        # the RotaryEmbedding tables are already GQA's layout: (max_position_embeddings, Dh / 2)
        node.input[7], node.input[8], node.input[9] = cos_cache, sin_cache, position_ids
        # replace, not append: the contrib graph sets do_rotary=0 explicitly, and a repeated
        # attribute name is an invalid node
        attrs = [a for a in node.attribute if a.name not in ("do_rotary", "rotary_interleaved")]
        del node.attribute[:]
        node.attribute.extend(attrs)
        node.attribute.extend(
            [onnx.helper.make_attribute("do_rotary", 1), onnx.helper.make_attribute("rotary_interleaved", 0)]
        )
        # The Split and RotaryEmbedding nodes are left unread, not removed: shared_buffer_graph's
        # liveness pass drops them.
        folded += 1
    return folded


def right_padded_attention(model: onnx.ModelProto) -> int:
    """Let every ``GroupQueryAttention`` mask padding by sequence length, as the model builder's graphs do, in place.

    The contrib graph gives GroupQueryAttention every row at full length (``seqlens_k = S - 1``)
    and an ``attention_bias`` (B, 1, T, S) built from the training model's boolean mask, so any
    padding works. ONNX Runtime's CPU kernel takes a slower path with a bias: at a 600-slot
    context one decode call costs 289 us against 213 us without (12 heads, ``head_dim`` 64,
    ONNX Runtime 1.32), ~0.9 ms per step over 12 layers. onnxruntime-genai pads a batch of prompts
    on the right (``PadInputs``, src/models/model.cpp: ``pad_right_`` true) and keeps each row's
    mask as prompt, padding, then generated tokens, which is what GroupQueryAttention's own
    sequence lengths express (onnxruntime docs/ContribOperators.md: ``seqlens_k`` = total
    sequence length - 1 per row): ``seqlens_k = sum(attention_mask) - 1``, ``total_sequence_length``
    = the mask's length, no bias. A row's new token is then written at slot ``seqlens_k`` over its
    first padding slot, and the slots it reads are its real tokens, so right-padded and unpadded
    rows compute what the contract graph computes; a left-padded row does not (it would read its
    padding), which onnxruntime-genai never feeds.

    The nodes that computed the old ``seqlens_k``, ``total_sequence_length`` and bias are left
    unread, not removed (:func:`shared_buffer_graph` prunes them).

    Args:
        model: a contrib-graph decoder (:mod:`prodip.export.contrib`) reading ``attention_mask``.
    Returns:
        The number of GroupQueryAttention nodes rewired.
    """
    graph = model.graph
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    if not gqa:
        return 0
    p = "genai_lengths/"
    int32 = onnx.TensorProto.INT32
    graph.initializer.extend(
        [
            onnx.helper.make_tensor(p + "last", onnx.TensorProto.INT64, [1], [-1]),
            onnx.helper.make_tensor(p + "one", int32, [], [1]),
            onnx.helper.make_tensor(p + "scalar", onnx.TensorProto.INT64, [0], []),
        ]
    )
    # GroupQueryAttention's seqlens_k and total_sequence_length are int32 (type constraint M), the
    # first (B,), the second a scalar: the int64 mask is cast before the sum, and the mask length
    # S (Shape-15 start/end: int64 [1]) is cast and reshaped to shape [] (an empty shape tensor
    # means a scalar, ONNX Reshape).
    nodes = [
        onnx.helper.make_node("Cast", ["attention_mask"], [p + "mask"], to=int32),
        onnx.helper.make_node("ReduceSum", [p + "mask", p + "last"], [p + "count"], keepdims=0),  # (B,)
        onnx.helper.make_node("Sub", [p + "count", p + "one"], [p + "seqlens_k"]),
        onnx.helper.make_node("Shape", ["attention_mask"], [p + "S"], start=1, end=2),
        onnx.helper.make_node("Cast", [p + "S"], [p + "S32"], to=int32),
        onnx.helper.make_node("Reshape", [p + "S32", p + "scalar"], [p + "total"]),  # ()
    ]
    for node in gqa:
        node.input[5], node.input[6] = p + "seqlens_k", p + "total"
        if len(node.input) > 10:
            node.input[10] = ""  # attention_bias: no bias, the kernel's faster path
        while node.input and not node.input[-1]:  # drop the trailing empty optional inputs
            del node.input[-1]
    for i, node in enumerate(nodes):  # at the front: they read a graph input only
        graph.node.insert(i, node)
    return len(gqa)


def shared_buffer_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """The decoder as onnxruntime-genai runs it with ``past_present_share_buffer``, in place.

    With a shared buffer, onnxruntime-genai allocates each layer's cache once, ``(B, Hkv,
    max_length, Dh)``, passes it as ``past_key_values.*`` and binds the same memory to
    ``present.*``; ``GroupQueryAttention`` then writes the new keys and values into it at
    ``seqlens_k`` and reads slots ``[0, seqlens_k]`` only (onnxruntime
    docs/ContribOperators.md, GroupQueryAttention's past_key: "When past_key uses same tensor as
    present_key (k-v cache), it is of length max_sequence_length"). No cache is copied per step:
    at a 512-token context int4 decoded at 0.98x the model builder's speed, against 0.54x / 0.42x
    with per-step copies (bench/results/genai_builder_*ctx512*), and with the two rewrites below at
    1.02x / 0.98x (bench/results/genai_builder_rotary_ctx512_cpu_2026-11-30.md). This graph drops
    the two things that copy or refuse such a buffer: the mask-length check (:func:`add_mask_length_check`: the buffer is longer than
    ``past + T`` by design) and the ``Where`` that zeroes masked cache slots before attention
    (it copies every cache tensor each step). Both protect callers that build caches themselves;
    here onnxruntime-genai owns the buffers, and slots past the mask are never read. The
    contract graph (the variant's own file) keeps both for every other runtime. The rotary
    embedding moves into GroupQueryAttention (:func:`fold_rotary_into_attention`), valid for the
    positions onnxruntime-genai feeds, and padding is masked by sequence length, not a bias
    (:func:`right_padded_attention`: onnxruntime-genai pads on the right).

    Args:
        model: a contrib-graph decoder (``GroupQueryAttention``) after :func:`add_mask_length_check`.
    Returns:
        ``model``, edited.
    Raises:
        ValueError: not a GroupQueryAttention decoder, or no mask-length check to remove.
    """
    graph = model.graph
    if not any(n.op_type == "GroupQueryAttention" for n in graph.node):
        raise ValueError("shared_buffer_graph: the decoder has no GroupQueryAttention (standard graph)")
    check = next((n for n in graph.node if n.name == MASK_CHECK_NODE), None)
    if check is None:
        raise ValueError(f"shared_buffer_graph: no {MASK_CHECK_NODE!r} node")
    past = {i.name: i.type.tensor_type.elem_type for i in graph.input if i.name.startswith("past_key_values.")}
    producer = {out: node for node in graph.node for out in node.output}

    def cache_input(name: str) -> Optional[str]:
        """The past input that ``name`` is, through Where(keep, x, 0) and Cast (fp16 graphs cast the
        cache to float16 and back around the Where), when the chain's last type is the input's.

        GroupQueryAttention writes in place only when its past_key/past_value IS the bound buffer;
        any node in between hands it a copy. The type check keeps the dtype GQA reads unchanged
        when the Casts are bypassed."""
        # walking up, the first Cast met is the last one applied: the type GQA reads
        last_cast = None
        while name not in past:
            node = producer.get(name)
            if node is None or node.op_type not in ("Cast", "Where"):
                return None
            if node.op_type == "Cast" and last_cast is None:
                last_cast = attr(node, "to")
            # Where(condition, X, Y): the cache is X, the zeros Y
            name = node.input[1] if node.op_type == "Where" else node.input[0]
        return name if last_cast in (None, past[name]) else None

    # this order: right_padded_attention drops GQA's trailing empty inputs, and
    # fold_rotary_into_attention needs its empty slots 7-9
    fold_rotary_into_attention(model)
    right_padded_attention(model)
    # the check's readers read the raw mask: P, read from the buffer's shape, is its full length,
    # so the check would refuse every call (the buffer is longer than past + T by design)
    rename = {check.output[0]: "attention_mask"}
    nodes = [node for node in graph.node if node is not check]
    for node in nodes:
        if node.op_type == "GroupQueryAttention":  # past_key, past_value: the buffer itself
            for i in (3, 4):
                source = cache_input(node.input[i]) if len(node.input) > i and node.input[i] else None
                if source is None:
                    raise ValueError(f"shared_buffer_graph: {node.name} input {i} is not a past_key_values input")
                node.input[i] = source
        for i, name in enumerate(node.input):
            node.input[i] = rename.get(name, name)
    wanted = {o.name for o in graph.output}
    # drop what fed only the removed nodes (the mask slice the Where read, the check's shape) and
    # what the two rewrites left unread (Split, RotaryEmbedding, the bias and the old seqlens_k);
    # repeated until nothing changes, as removing a node can orphan its producers
    while True:
        used = wanted | {name for node in nodes for name in node.input}
        live = [node for node in nodes if any(out in used for out in node.output if out)]
        if len(live) == len(nodes):
            break
        nodes = live
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input} | wanted
    kept = [t for t in graph.initializer if t.name in used]  # the removed nodes' constants go too
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model
