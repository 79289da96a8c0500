"""ONNX graph surgery behind the fp16/int8/int4 variants (:mod:`prodip.export.quantize` builds them).

One module per group of rewrites; every name is re-exported here, so callers import from
``prodip.export.graph``:

- :mod:`~prodip.export.graph.fp16`: :func:`fold_fp16_round_trips`, :func:`_rmsnorm_nodes`,
  :func:`_ancestors`: keep RMSNorm and the RoPE angles in fp32 inside the fp16 graph without Cast
  round trips.
- :mod:`~prodip.export.graph.tied`: :func:`materialize_transposed_weights` gives the lm_head its own
  (transposed) initializer so ORT's quantisers see it; :class:`TiedEmbedding`,
  :func:`find_tied_embedding`, :func:`share_tied_embedding_int4`, :func:`share_tied_embedding_int8`:
  with ``tie_word_embeddings``, point the embedding lookup at the lm_head's quantised tensors so the
  file holds the table once.
- :mod:`~prodip.export.graph.int8`: :func:`quantize_matmuls_rowwise_int8`: the int8 variant's
  MatMuls (8-bit weights per output channel, 8-bit activations per token, MatMulInteger:
  batch-invariant); :func:`requantize_int4_matmuls_int8`: the same MatMuls over int4 weights
  requantised to 8 bits by nodes that fold at load (the WASM int4 file).
- :mod:`~prodip.export.graph.mask`: :func:`add_mask_length_check`: the decoder refuses an
  ``attention_mask`` whose length is not ``past + T`` (case C3); :func:`drop_unused_outputs`: blank
  the optional outputs nothing reads.
- :mod:`~prodip.export.graph.genai_decoder`: :func:`shared_buffer_graph`,
  :func:`fold_rotary_into_attention`, :func:`right_padded_attention`: the decoder as
  onnxruntime-genai runs it (shared past/present buffer, rotary inside GroupQueryAttention, padding
  by sequence length).
- :mod:`~prodip.export.graph.embedding`: :func:`find_embedding_gather`,
  :func:`quantize_embedding_int8`: the 8-bit GatherBlockQuantized embedding (ORT's quantiser does
  4-bit Gathers only).
- :mod:`~prodip.export.graph.lowered_gather`: :func:`lower_gather_block_quantized`: GatherBlockQuantized
  in standard operators, for onnxruntime-web's WASM build.
- :mod:`~prodip.export.graph.qdq`: :func:`matmulnbits_to_qdq`: 4-bit MatMulNBits as int4 DequantizeLinear +
  MatMul with the same codes (ONNX Runtime fuses it back; onnxruntime-web can fold it to fp32);
  :func:`~prodip.export.graph.tied.share_tied_embedding_int4_qdq` shares a tied table in that layout.
- :mod:`~prodip.export.graph.helpers`: :func:`onnx_opset`, :func:`~prodip.export.graph.helpers.attr`.

    python -c "from prodip.export.graph import find_tied_embedding; help(find_tied_embedding)"
"""

from __future__ import annotations

from prodip.export.graph.embedding import EmbeddingGather, find_embedding_gather, quantize_embedding_int8
from prodip.export.graph.fp16 import _ancestors, _rmsnorm_nodes, fold_fp16_round_trips
from prodip.export.graph.genai_decoder import fold_rotary_into_attention, right_padded_attention, shared_buffer_graph
from prodip.export.graph.helpers import onnx_opset
from prodip.export.graph.int8 import (
    INT8_ZERO_POINT,
    quantize_matmuls_rowwise_int8,
    quantize_weight_per_column_int8,
    requantize_int4_matmuls_int8,
)
from prodip.export.graph.lowered_gather import LOWERED_GBQ, _pack_nibbles, lower_gather_block_quantized
from prodip.export.graph.mask import MASK_CHECK_NODE, add_mask_length_check, drop_unused_outputs
from prodip.export.graph.qdq import matmulnbits_to_qdq
from prodip.export.graph.tied import (
    TiedEmbedding,
    find_tied_embedding,
    materialize_transposed_weights,
    share_tied_embedding_int4,
    share_tied_embedding_int4_qdq,
    share_tied_embedding_int8,
)

# the underscored names are read by prodip.export.quantize and the tests, as they were before the split
__all__ = [
    "INT8_ZERO_POINT",
    "LOWERED_GBQ",
    "MASK_CHECK_NODE",
    "EmbeddingGather",
    "TiedEmbedding",
    "_ancestors",
    "_pack_nibbles",
    "_rmsnorm_nodes",
    "add_mask_length_check",
    "drop_unused_outputs",
    "find_embedding_gather",
    "find_tied_embedding",
    "fold_fp16_round_trips",
    "fold_rotary_into_attention",
    "lower_gather_block_quantized",
    "materialize_transposed_weights",
    "onnx_opset",
    "quantize_embedding_int8",
    "quantize_matmuls_rowwise_int8",
    "quantize_weight_per_column_int8",
    "requantize_int4_matmuls_int8",
    "right_padded_attention",
    "matmulnbits_to_qdq",
    "share_tied_embedding_int4",
    "share_tied_embedding_int4_qdq",
    "share_tied_embedding_int8",
    "shared_buffer_graph",
]
