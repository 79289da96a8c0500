"""fp16, int8 and int4 variants of the fp32 ONNX decoder, made with ONNX Runtime's own tools.

* fp16: ``onnxruntime.transformers.float16.convert_float_to_float16`` with ``keep_io_types``
  (inputs, outputs and the KV cache stay float32); ops that overflow or lose too much in fp16
  stay fp32 (:func:`fp16_op_block_list`), and so does the RoPE angle computation (every node
  upstream of Cos/Sin: positions * inverse frequencies).
* int8: 8-bit weights per output channel and 8-bit activations per token (W8A8): MatMul ->
  ONNX ``MatMulInteger`` (uint8 x uint8, int32 sums), embedding Gather -> GatherBlockQuantized(bits=8)
  quantised by ORT's ``quantize_matmul_8bits``; batch-invariant (see :func:`to_int8`).
* int4: ``onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer`` (weight-only,
  blockwise RTN; MatMul -> com.microsoft.MatMulNBits, embedding Gather -> GatherBlockQuantized).

Both then lower the GatherBlockQuantized lookup to standard ONNX operators over the same quantised
bytes (:func:`prodip.export.graph.lower_gather_block_quantized`): onnxruntime-web's WASM build, which
transformers.js runs in browsers, has no kernel for it; the embedding stays bit-identical
(bench/results/wasm_embedding_2026-12-01.md).

Tied embeddings (``tie_word_embeddings``: the lm_head weight IS the embedding table): the quantisers
only see the lm_head weight once :func:`materialize_transposed_weights` has made it an initializer of
its own, so they quantise the table twice (embedding Gather and lm_head MatMul). The int8 and int4
variants then rewire the embedding lookup to read the lm_head's quantised tensors and drop the
embedding's own copy (:func:`share_tied_embedding_int4`, :func:`share_tied_embedding_int8`), so the
file holds the quantised table once, as the fp32 file does.

Each function returns the quantisation parameters recorded in the manifest.

    python -c "from prodip.export.quantize import fp16_op_block_list; print(fp16_op_block_list())"
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import onnx
import onnx.version_converter
from onnxruntime.quantization import matmul_nbits_quantizer as mnb
from onnxruntime.quantization.quant_utils import QuantFormat
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16
from onnxruntime.transformers.onnx_model import OnnxModel

from prodip.base.errors import InvalidInput
from prodip.export.graph import (
    _ancestors,
    _rmsnorm_nodes,
    find_embedding_gather,
    find_tied_embedding,
    fold_fp16_round_trips,
    lower_gather_block_quantized,
    materialize_transposed_weights,
    matmulnbits_to_qdq,
    onnx_opset,
    quantize_embedding_int8,
    quantize_matmuls_rowwise_int8,
    requantize_int4_matmuls_int8,
    share_tied_embedding_int4,
    share_tied_embedding_int4_qdq,
    share_tied_embedding_int8,
)
from prodip.export.limits import check_nbits_options, supported_block_sizes

logger = logging.getLogger(__name__)

#: Ops kept in fp32 in the fp16 variant, on top of ORT's DEFAULT_OP_BLOCK_LIST. Pow/ReduceMean/
#: Sqrt/Reciprocal are RMSNorm's mean of squares (x**2 overflows fp16 above |x| = 256);
#: Softmax sums exponentials; Cos/Sin take RoPE angles up to max_position_embeddings radians,
#: where fp16's spacing (0.5 at 1024) would scramble positions.
# In the contrib graph the same computations are ONNX Runtime's fused operators: RMSNorm inside
# SkipSimplifiedLayerNormalization, softmax inside GroupQueryAttention, the RoPE tables read by
# RotaryEmbedding; they stay fp32 too (their weights are tiny; the MatMul weights are what fp16 halves).
FP16_EXTRA_BLOCKED_OPS = (
    "Pow",
    "ReduceMean",
    "Sqrt",
    "Reciprocal",
    "Softmax",
    "Cos",
    "Sin",
    "SkipSimplifiedLayerNormalization",
    "GroupQueryAttention",
    "RotaryEmbedding",
)
PROTOBUF_LIMIT_BYTES = 2 * 1024**3
#: ONNX opset introducing the INT4/UINT4 tensor types GatherBlockQuantized's weights use.
INT4_MIN_OPSET = 21
#: The quantised embedding lookup in the int8/int4 files (:func:`prodip.export.graph.lower_gather_block_quantized`).
WASM_EMBEDDING_LAYOUT = (
    "Gather of the quantised code, zero-point and scale rows, (code - zero_point) * scale per block in "
    "standard ONNX ops (no GatherBlockQuantized: onnxruntime-web's WASM build has no kernel for it)"
)
#: int8 default: 64 weights per scale in the (untied) embedding table.
INT8_BLOCK_SIZE = 64


def fp16_op_block_list() -> list[str]:
    """Op types the fp16 variant keeps in fp32: ORT's DEFAULT_OP_BLOCK_LIST + :data:`FP16_EXTRA_BLOCKED_OPS`."""
    return sorted(set(DEFAULT_OP_BLOCK_LIST) | set(FP16_EXTRA_BLOCKED_OPS))


def _too_big(model: onnx.ModelProto) -> bool:
    return not _all_inline(model) or model.ByteSize() >= PROTOBUF_LIMIT_BYTES - 64 * 1024**2


def _save(model: onnx.ModelProto, path: Path, external: bool = False) -> bool:
    """Save, with weights in ``<name>.data`` beside it if asked or over 2 GB; True if external."""
    external = external or _too_big(model)
    if external:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=1024,
        )
        onnx.checker.check_model(str(path))
    else:
        onnx.save_model(model, str(path))
        onnx.checker.check_model(model)
    return external


def _all_inline(model: onnx.ModelProto) -> bool:
    return not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def to_fp16(src: str | os.PathLike, dst: str | os.PathLike, *, external_data: bool = False) -> dict[str, Any]:
    """Write an fp16 copy of the fp32 decoder ``src`` to ``dst``; float32 inputs and outputs.

    Args:
        external_data: keep weights in ``<dst>.data`` (automatic above 2 GB).

    Returns:
        Quantisation parameters: tool, keep_io_types, blocked op types and the number of nodes
        kept fp32 for RoPE.
    """
    model = onnx.load(str(src))
    rope_nodes = sorted(_ancestors(model.graph, {"Cos", "Sin"}))
    norm_nodes = sorted(_rmsnorm_nodes(model.graph))
    blocked = fp16_op_block_list()
    big = _too_big(model)  # onnx.shape_inference serialises the model: impossible above 2 GB
    model16 = convert_float_to_float16(
        model,
        keep_io_types=True,
        op_block_list=blocked,
        node_block_list=rope_nodes + norm_nodes,
        disable_shape_infer=big,
    )
    folded = fold_fp16_round_trips(model16)
    OnnxModel(model16).topological_sort()  # the converter appends its input Casts at the end
    del model16.graph.value_info[:]  # some of the converter's value_info entries are stale
    if not big:
        model16 = onnx.shape_inference.infer_shapes(model16)
    external = _save(model16, Path(dst), external_data)
    return {
        "tool": "onnxruntime.transformers.float16.convert_float_to_float16",
        "keep_io_types": True,
        "op_block_list": blocked,
        "rope_nodes_kept_fp32": len(rope_nodes),
        "rmsnorm_nodes_kept_fp32": len(norm_nodes),
        "fp16_round_trips_removed": folded,
        "external_data": external,
    }


def to_int8(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    block_size: int = INT8_BLOCK_SIZE,
    quantize_embeddings: bool = True,
    share_tied_embedding: bool = True,
    lower_embedding: bool = True,
    external_data: bool = False,
) -> dict[str, Any]:
    """8-bit weights and 8-bit per-token activations (W8A8, ``MatMulInteger``) of the fp32 decoder ``src``.

    Every MatMul with a constant weight becomes ONNX's ``MatMulInteger`` over uint8 codes with one
    scale per output channel, fed the activations quantised per row (token) at run time
    (:func:`prodip.export.graph.quantize_matmuls_rowwise_int8`). The embedding Gather becomes
    ``com.microsoft.GatherBlockQuantized`` (bits 8, ``block_size`` weights per scale) over a table
    quantised by ONNX Runtime's own kernel (``quantize_matmul_8bits``), or, when the embeddings are
    tied, reads the lm_head's codes and scales (:func:`share_tied_embedding_int8`).

    Batch-invariant by construction: weights are constants, every activation scale belongs to one
    row, and MatMulInteger sums in int32 exactly, so a row's result does not depend on the other
    rows of its batch. (``quantize_dynamic`` has one activation scale for the whole batch: a
    request's tokens change with its neighbours. An 8-bit MatMulNBits is invariant too, but on CPUs
    without AVX-VNNI its int8 kernel costs 6x as much for 8 rows as for 1, and 2.2x as much as
    MatMulInteger's for 8 rows: bench/results/serve_int8_rowwise_2026-11-30.md.)

    Args:
        block_size: weights per scale of the untied embedding table (GatherBlockQuantized accepts
            16, 32, 64, 128 and 256); the largest of those dividing hidden and <= block_size is used.
        quantize_embeddings: embedding Gather -> GatherBlockQuantized (or the shared table); otherwise
            it stays fp32.
        share_tied_embedding: with tied embeddings, the embedding reads the lm_head's 8-bit codes
            (one table in the file); False quantises a second copy (for comparison).
        lower_embedding: GatherBlockQuantized -> standard ONNX ops over the same bytes
            (:func:`prodip.export.graph.lower_gather_block_quantized`; onnxruntime-web's WASM build
            has no GatherBlockQuantized kernel). False keeps it (for comparison).
        external_data: keep weights in ``<dst>.data`` (automatic above 2 GB).
    Returns:
        Quantisation parameters, with ``embedding_shared_with_lm_head`` (and, for a tied model that
        is not shared, why not).
    Raises:
        InvalidInput: a block size ONNX Runtime does not accept.
    """
    check_nbits_options(8, block_size, 0)
    model = onnx.load(str(src))
    tied = find_tied_embedding(model.graph)
    embedding = find_embedding_gather(model.graph)
    folded = materialize_transposed_weights(model)
    replaced = quantize_matmuls_rowwise_int8(model)
    shared, why = False, None
    if tied is not None:
        why = (
            "share_tied_embedding=False"
            if not share_tied_embedding
            else "quantize_embeddings=False"
            if not quantize_embeddings
            else share_tied_embedding_int8(model, tied)
        )
        shared = why is None
        if not shared:
            logger.info("int8: tied embedding stored twice (%s)", why)
    embedding_block, embedding_why = None, None
    if quantize_embeddings and not shared and embedding is not None:
        hidden = next(t.dims[1] for t in model.graph.initializer if t.name == embedding.table)
        # GatherBlockQuantized reads whole blocks: the largest accepted block size dividing hidden
        fits = [b for b in supported_block_sizes(8) if hidden % b == 0 and b <= block_size]
        if fits:
            embedding_block = fits[-1]
            quantize_embedding_int8(model, embedding, embedding_block)
        else:
            embedding_why = f"hidden {hidden} is not a multiple of any block size ONNX Runtime accepts"
            logger.info("int8: embedding kept float32 (%s)", embedding_why)
    lowered = lower_gather_block_quantized(model) if lower_embedding else 0
    external = _save(model, Path(dst), external_data)
    params = {
        "tool": "prodip.export.graph.quantize_matmuls_rowwise_int8",
        "algorithm": "RTN, symmetric",
        "format": "MatMulInteger (ONNX), uint8 x uint8, zero points 128",
        "bits": 8,
        "weight_granularity": "per output channel",
        "activation_quantization": "dynamic, per row (token) at run time, symmetric 8-bit; batch-invariant",
        "symmetric": True,
        "matmuls_quantized": replaced,
        "op_types": ["MatMul", "Gather"] if quantize_embeddings else ["MatMul"],
        "embedding_quantized": shared or embedding_block is not None,
        "embedding_block_size": None if shared else embedding_block,
        "embedding_shared_with_lm_head": shared,
        "embedding_lookup_lowered": lowered,
        "materialized_transposes": folded,
        "external_data": external,
    }
    if lowered:
        params["embedding_layout"] = WASM_EMBEDDING_LAYOUT
    if shared:
        params["embedding_layout"] = (
            "Gather(Transpose(lm_head codes [hidden, vocab])) -> (code - 128) * lm_head scale of the row "
            "(one table in the file; ONNX Runtime folds the Transpose at load)"
        )
    elif tied is not None:
        params["embedding_not_shared_because"] = why
    if embedding_why:
        params["embedding_not_quantized_because"] = embedding_why
    return params


def _lm_head_node(graph: onnx.GraphProto) -> str | None:
    return next((n.name for n in graph.node if n.op_type == "MatMul" and "logits" in n.output), None)


#: ``to_int4`` layouts: ``qdq`` (the default) writes int4 ``DequantizeLinear`` + ``MatMul``; ``matmulnbits`` writes
#: ``com.microsoft.MatMulNBits`` directly (what ONNX Runtime fuses the qdq file into at load; kept for comparison).
INT4_LAYOUTS = ("qdq", "matmulnbits")
#: The MatMulNBits ``accuracy_level`` ONNX Runtime's QDQ fusion gives a qdq file's MatMuls: its session option
#: ``session.qdq_matmulnbits_accuracy_level``, whose default is 4 (onnxruntime_session_options_config_keys.h).
QDQ_FUSED_ACCURACY_LEVEL = 4
#: The layout of a qdq int4 file, as recorded in the manifest.
QDQ_LAYOUT = (
    "int4 DequantizeLinear (opset 21, blocked along K) + MatMul: ONNX Runtime's QDQ fusion makes each pair "
    "MatMulNBits at session load (accuracy_level from session.qdq_matmulnbits_accuracy_level, default 4); "
    "with session.disable_quant_qdq=1 (onnxruntime-web's WASM build, which has no 4-bit kernel) constant "
    "folding dequantises the weights to float32 once at load"
)


def to_int4(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    block_size: int = 32,
    symmetric: bool = False,
    quantize_embeddings: bool = True,
    quantize_lm_head: bool = True,
    share_tied_embedding: bool = True,
    accuracy_level: int = 4,
    lower_embedding: bool = True,
    layout: str = "qdq",
    external_data: bool = False,
) -> dict[str, Any]:
    """Weight-only 4-bit blockwise quantisation (RTN, ONNX Runtime's ``MatMulNBitsQuantizer``) of the fp32 decoder ``src``.

    Layouts (``layout``):

    * ``qdq`` (default): every MatMul weight is an int4 ``DequantizeLinear`` (ONNX opset 21, blocks
      of ``block_size`` along K; UINT4 codes + UINT4 zero points, or INT4 codes when symmetric)
      feeding the ``MatMul``. ONNX Runtime's CPU graph optimiser (QDQ fusion, on at the default
      optimisation level) turns each pair into ``com.microsoft.MatMulNBits`` with the same codes at
      load, so natively (ONNX Runtime, onnxruntime-genai, ``prodip serve``) it runs MLAS's 4-bit
      kernels as the ``matmulnbits`` file does; onnxruntime-web's WASM build has no 4-bit kernel
      (its MatMulNBits dequantises the weight on every call), and with the session option
      ``session.disable_quant_qdq=1`` it constant-folds the weights to float32 once at load and
      decodes at fp32 speed while the download stays 4-bit (bench/results/wasm_q4_2026-12-02.md).
      The accuracy level of the fused MatMulNBits is the runtime's session option
      ``session.qdq_matmulnbits_accuracy_level`` (ONNX Runtime's default: 4), so ``accuracy_level``
      must be :data:`QDQ_FUSED_ACCURACY_LEVEL`.
    * ``matmulnbits``: ``com.microsoft.MatMulNBits`` in the file (``accuracy_level`` as given).

    Args:
        block_size: weights per block along the input (K) dimension; a power of 2 >= 16.
        symmetric: no zero points (int4) instead of asymmetric (uint4 + zero point per block).
        quantize_embeddings: embedding Gather -> GatherBlockQuantized (blocks along hidden), or, when
            tied and shared, a lookup of the lm_head's 4-bit codes.
        quantize_lm_head: quantise the MatMul producing ``logits``; otherwise it stays fp32.
        share_tied_embedding: with tied embeddings (and both of the above), store the 4-bit table
            once: the embedding lookup reads the lm_head's 4-bit weights, scales and zero points
            (:func:`share_tied_embedding_int4_qdq`, :func:`share_tied_embedding_int4`). False keeps
            two copies (for comparison).
        lower_embedding: as :func:`to_int8`'s (an untied or unshared table's GatherBlockQuantized).
        accuracy_level: MatMulNBits ``accuracy_level`` (0 = unset; 4 = int8 compute, the model builder's
            choice and ~3x faster on CPU; see ORT ContribOperators.md).
        layout: one of :data:`INT4_LAYOUTS`.
        external_data: keep weights in ``<dst>.data`` (automatic above 2 GB).
    Returns:
        Quantisation parameters, with ``layout``, ``embedding_shared_with_lm_head`` (and, for a tied
        model that is not shared, why not).
    Raises:
        InvalidInput: an unknown layout, or a qdq layout with an accuracy level ONNX Runtime's QDQ
            fusion does not apply by default.
    """
    if layout not in INT4_LAYOUTS:
        raise InvalidInput(f"int4 layout must be one of {', '.join(INT4_LAYOUTS)}, got {layout!r}")
    qdq = layout == "qdq"
    if qdq and accuracy_level != QDQ_FUSED_ACCURACY_LEVEL:
        raise InvalidInput(
            f"int4 accuracy_level {accuracy_level}: the qdq layout's MatMulNBits get ONNX Runtime's QDQ-fusion "
            f"accuracy level ({QDQ_FUSED_ACCURACY_LEVEL}); use the matmulnbits layout for another level"
        )
    model = onnx.load(str(src))
    tied = find_tied_embedding(model.graph)
    folded = materialize_transposed_weights(model)
    if onnx_opset(model) < INT4_MIN_OPSET and not _too_big(model):
        # int4/uint4 tensors need opset 21: convert properly rather than let ORT relabel the opset
        # (the converter serialises the model, so above 2 GB ORT's relabelling is what happens)
        model = onnx.version_converter.convert_version(model, INT4_MIN_OPSET)
    ops = ("MatMul", "Gather") if quantize_embeddings else ("MatMul",)
    lm_head = _lm_head_node(model.graph)
    exclude = [] if quantize_lm_head or lm_head is None else [lm_head]
    quant = mnb.MatMulNBitsQuantizer(
        model,
        bits=4,
        block_size=block_size,
        is_symmetric=symmetric,
        accuracy_level=accuracy_level or None,
        nodes_to_exclude=exclude,
        quant_format=QuantFormat.QOperator,
        op_types_to_quantize=ops,
        quant_axes=(("MatMul", 0), ("Gather", 1)),
    )
    quant.process()
    model = quant.model.model
    # the qdq layout is the MatMulNBits file's own codes, written as DequantizeLinear + MatMul (the
    # quantiser's QDQ format rounds differently at ties and does not quantise Gathers)
    converted = matmulnbits_to_qdq(model) if qdq else 0
    shared, why = False, None
    if tied is not None:
        why = (
            "share_tied_embedding=False"
            if not share_tied_embedding
            else "quantize_embeddings=False"
            if not quantize_embeddings
            else "quantize_lm_head=False"
            if not quantize_lm_head
            else share_tied_embedding_int4_qdq(model, tied)
            if qdq
            else share_tied_embedding_int4(model, tied)
        )
        shared = why is None
        if not shared:
            logger.info("int4: tied embedding stored twice (%s)", why)
    lowered = lower_gather_block_quantized(model) if lower_embedding else 0
    external = _save(model, Path(dst), external_data)
    params: dict[str, Any] = {
        "tool": "onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer",
        "algorithm": "RTN (DEFAULT)",
        "format": "QDQ" if qdq else "QOperator",
        "layout": QDQ_LAYOUT if qdq else "com.microsoft.MatMulNBits",
        "matmuls_as_qdq": converted,
        "bits": 4,
        "block_size": block_size,
        "symmetric": symmetric,
        "op_types": list(ops),
        "embedding_quantized": quantize_embeddings,
        "lm_head_quantized": quantize_lm_head,
        "embedding_shared_with_lm_head": shared,
        "embedding_lookup_lowered": lowered,
        "accuracy_level": accuracy_level,
        "materialized_transposes": folded,
        "external_data": external,
        "opset": onnx_opset(model),
    }
    if lowered:
        params["embedding_layout"] = WASM_EMBEDDING_LAYOUT
    if shared:
        params["embedding_layout"] = (
            "Gather of Transpose(Cast(lm_head int4 codes [hidden, vocab] -> 8-bit)) rows and of the transposed "
            "scales and zero points, (code - zero_point) * scale per block in standard ops (the Cast and "
            "Transpose of constants are folded at session load)"
            if qdq
            else "Gather of packed 4-bit rows of Reshape(lm_head MatMulNBits B [vocab, hidden/block, block/2] "
            "-> [vocab, hidden/2]) and of the same scales and zero points, dequantised in standard ops"
        )
    elif tied is not None:
        params["embedding_not_shared_because"] = why
    return params


#: The 4-bit file onnxruntime-web's WASM build loads instead of the int4 variant's own (``onnx/model_q4.onnx``):
#: transformers.js's ``model_file_name`` + ``dtype`` "q4" (file ``<model_file_name>_q4.onnx``).
WASM_INT4_MODEL_FILE_NAME = "model_wasm"
#: The session option the WASM int4 file needs (its weight-side nodes fold to uint8 codes at load only with it).
WASM_INT4_SESSION_CONFIG = {"session.disable_quant_qdq": "1"}


def to_int4_wasm(src: str | os.PathLike, dst: str | os.PathLike) -> dict[str, Any]:
    """The int4 (qdq layout) decoder ``src`` with 8-bit ``MatMulInteger`` weights made at load, for onnxruntime-web's WASM build.

    onnxruntime-web's WASM build has no 4-bit matrix kernel: the ``qdq`` file decodes at fp32 speed there
    (weights dequantised to float32 at load). This graph reads the same int4 codes, scales and zero points
    and requantises each weight to the int8 variant's layout (uint8 per output column, row-wise activation
    scales: :func:`prodip.export.graph.requantize_int4_matmuls_int8`); with the session option
    :data:`WASM_INT4_SESSION_CONFIG` the weight side folds to uint8 at load, so the page downloads 4-bit
    weights and decodes with the int8 file's kernels (a quarter of float32's weight bytes per step).
    Natively the ``qdq`` file stays the one to run (MatMulNBits).

    When ``src``'s weights are in external data (``onnx/model_q4.onnx_data``), ``dst`` points at the same
    bytes (offsets into that file: nothing is copied) and only its new tensors (per-column scales and zero
    points, a few bytes per output channel) are in ``dst``; otherwise ``dst`` holds a copy of every tensor.

    Args:
        src: the int4 variant's file (``to_int4(layout="qdq")``), in its final place.
        dst: the new file, in the same folder (its external-data locations are relative to it).
    Returns:
        ``file`` (dst's name), ``matmuls_requantized``, ``shares_weights_with`` (src's external-data file
        name or None), ``session_config``.
    Raises:
        InvalidInput: ``src`` has no int4 DequantizeLinear + MatMul (not the qdq layout), or ``dst`` is not
            beside ``src``.
    """
    src, dst = Path(src), Path(dst)
    if src.resolve().parent != dst.resolve().parent:
        raise InvalidInput(f"{dst}: the WASM int4 file must be beside {src} (it reads that file's weights)")
    refs = onnx.load(str(src), load_external_data=False)
    locations = {t.name: list(t.external_data) for t in refs.graph.initializer if t.external_data}
    shared = sorted({e.value for refs_ in locations.values() for e in refs_ if e.key == "location"})
    model = onnx.load(str(src))
    replaced = requantize_int4_matmuls_int8(model)
    int4 = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
    if not any(t.data_type in int4 for t in model.graph.initializer) or not replaced:
        raise InvalidInput(f"{src}: no int4 DequantizeLinear + MatMul to requantise (not the qdq int4 layout)")
    for tensor in model.graph.initializer:
        if tensor.name in locations:  # unchanged tensor of src: read it from src's external data
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            tensor.external_data.extend(locations[tensor.name])
    tmp = dst.with_name(f".{dst.name}.tmp")
    onnx.save_model(model, str(tmp))
    os.replace(tmp, dst)
    onnx.checker.check_model(str(dst))
    return {
        "file": dst.name,
        "matmuls_requantized": replaced,
        "shares_weights_with": shared[0] if shared else None,
        "session_config": dict(WASM_INT4_SESSION_CONFIG),
    }
