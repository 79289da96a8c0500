"""Input and output names of the exported ONNX decoder: the contract export writes and serve,
conformance and every other runtime read.

The names are those optimum and ONNX Runtime GenAI use for decoder-only models:

- inputs: ``input_ids`` (B, T) int64, ``attention_mask`` (B, past+T) int64 (1 = real token,
  0 = padding; left padding), ``position_ids`` (B, T) int64 (``cumsum(mask) - 1`` clipped at 0),
  ``past_key_values.{i}.key|value`` (B, Hkv, past, Dh) float32 for each layer i;
- outputs: ``logits`` (B, T, V) float32, ``present.{i}.key|value`` (B, Hkv, past+T, Dh) float32.

Batch, sequence and past axes are dynamic.

    python -c "from prodip.base.onnx_io import io_names; print(io_names(2))"
"""

from __future__ import annotations

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"


def past_names(num_layers: int) -> list[str]:
    """``past_key_values.{i}.key``, ``past_key_values.{i}.value`` for i in 0..num_layers-1, in that order."""
    return [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]


def present_names(num_layers: int) -> list[str]:
    """``present.{i}.key``, ``present.{i}.value`` for i in 0..num_layers-1, in that order."""
    return [f"present.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]


def io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """(inputs, outputs) of the decoder graph, in graph order."""
    return [INPUT_IDS, ATTENTION_MASK, POSITION_IDS, *past_names(num_layers)], [LOGITS, *present_names(num_layers)]
