"""The valid ranges of export options that a library we call decides, asked of that library.

``prodip export`` checks every such option before any work starts (:class:`ExportConfig`'s
``__post_init__``), so a value the library would refuse deep inside
the export (after the fp32 stage) is an :class:`~prodip.base.errors.InvalidInput` up front, with
the library's own words. Sources:

* MatMulNBits / GatherBlockQuantized block sizes: ONNX Runtime's blockwise quantisation kernel
  (``onnxruntime.capi._pybind_state.quantize_matmul_{4,8}bits``, MLAS ``MlasQuantizeBlockwise``),
  probed on a tiny matrix: in onnxruntime 1.32 it accepts 16, 32, 64, 128 and 256.
* MatMulNBits ``accuracy_level``: 0..4 (ORT docs/ContribOperators.md).
* An int4 block size against the model's MatMul input sizes K (:func:`check_int4_block_size`, run by
  ``prodip export`` once the model config is known): MatMulNBits pads K up to whole blocks, and the qdq
  layout's blocked ``DequantizeLinear`` (``prodip.export.graph.matmulnbits_to_qdq``) takes only a K that is a
  multiple of the block size.
* ONNX opset: at least 18 (torch.onnx's dynamo exporter and the LayerNorm/ReduceMean forms it
  writes) and at most ``onnx.defs.onnx_opset_version()`` (the newest opset the installed onnx
  knows; ONNX Runtime 1.32 runs up to that).

    python -c "from prodip.export.limits import supported_block_sizes; print(supported_block_sizes(4))"
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

from prodip.base.errors import InvalidInput

#: Lowest opset the decoder exporter writes (torch.onnx dynamo exporter).
MIN_OPSET = 18
#: Candidate block sizes probed (powers of 2 from 2 to 4096); ORT says which it takes.
_CANDIDATES = tuple(2**i for i in range(1, 13))


def max_opset() -> int:
    """The newest ai.onnx opset the installed onnx package knows."""
    return int(onnx.defs.onnx_opset_version())


@functools.cache
def _block_error(bits: int, block_size: int) -> str | None:
    """ONNX Runtime's own complaint about ``block_size`` for ``bits``-bit blocks, or None if accepted."""
    if block_size < 1:  # numpy would refuse the probe's arrays first ("negative dimensions are not allowed")
        return "a block size must be a positive number of weights"
    rows, cols = block_size, 2  # K = one block, N = 2
    kpack = 8 // bits
    packed = np.zeros((cols, 1, (block_size + kpack - 1) // kpack), np.uint8)
    scales = np.zeros((cols, 1), np.float32)
    zero_points = np.zeros((cols, 1), np.uint8)
    weight = np.ones((rows, cols), np.float32)
    kernel = quantize_matmul_8bits if bits == 8 else quantize_matmul_4bits
    try:
        kernel(packed, weight, scales, zero_points, block_size, cols, rows, False)
    except Exception as err:  # ORT raises RuntimeError (ORT_ENFORCE) or a pybind error
        return str(err).strip().splitlines()[-1]
    return None


def supported_block_sizes(bits: int) -> list[int]:
    """Block sizes ONNX Runtime's ``bits``-bit blockwise quantiser accepts (probed, powers of 2 up to 4096)."""
    return [b for b in _CANDIDATES if _block_error(bits, b) is None]


def check_nbits_options(bits: int, block_size: int, accuracy_level: int, *, name: str = "") -> None:
    """Refuse a MatMulNBits block size or accuracy level ONNX Runtime would refuse.

    Raises:
        InvalidInput: naming ``name`` (e.g. ``ExportConfig.int4_block_size``) and the accepted values.
    """
    label = name or f"int{bits} block_size"
    if isinstance(block_size, bool) or not isinstance(block_size, int) or _block_error(bits, block_size) is not None:
        raise InvalidInput(
            f"{label}: {block_size!r} is not a block size ONNX Runtime's {bits}-bit quantiser accepts; "
            f"choose one of {', '.join(map(str, supported_block_sizes(bits)))}"
        )
    if not 0 <= accuracy_level <= 4:
        raise InvalidInput(f"int{bits} accuracy_level must be in 0..4 (MatMulNBits), got {accuracy_level}")


def matmul_input_sizes(config: Any) -> dict[str, int]:
    """The input sizes K of the decoder's weight MatMuls, by the config field that sets each (HF LlamaConfig names):
    q/k/v, gate/up and lm_head read ``hidden_size``, o_proj ``num_attention_heads * head_dim``, down_proj
    ``intermediate_size``."""
    return {
        "hidden_size": config.hidden_size,
        "num_attention_heads * head_dim": config.num_attention_heads * config.head_dim,
        "intermediate_size": config.intermediate_size,
    }


def check_int4_block_size(config: Any, block_size: int, *, qdq: bool) -> None:
    """Refuse an int4 block size that blocks none of the model's MatMul weights.

    A block larger than every input size K makes each weight column one block, mostly padding (the file grows
    beyond what the block size promises); and the qdq layout (``qdq``: the default, ``int4_accuracy_level`` 4)
    writes a MatMul as blocked ``DequantizeLinear`` only when K is a multiple of the block size, so with none
    the int4 file would hold no qdq weight at all (its WASM file, made from those, would fail after the export).

    Raises:
        InvalidInput: naming ``ExportConfig.int4_block_size``, the model's input sizes and the block sizes that fit.
    """
    sizes = matmul_input_sizes(config)
    if any(k % block_size == 0 for k in sizes.values()):
        return
    larger = block_size > max(sizes.values())
    if not larger and not qdq:  # MatMulNBits pads a partial last block: every K is still blocked
        return
    fits = [b for b in supported_block_sizes(4) if any(k % b == 0 for k in sizes.values())]
    named = ", ".join(f"{name} = {k}" for name, k in sizes.items())
    why = (
        f"larger than every MatMul input size of this model ({named}): each weight column would be one block, "
        "mostly padding"
        if larger
        else f"no MatMul input size of this model ({named}) is a multiple of it, and the int4 file's qdq layout "
        "(DequantizeLinear blocked along K) needs one"
    )
    raise InvalidInput(
        f"ExportConfig.int4_block_size = {block_size} (--int4-block-size): {why}; choose one of "
        f"{', '.join(map(str, fits)) or 'none: no accepted block size divides them'}"
    )


def check_opset(opset: int) -> None:
    """Refuse an opset outside ``MIN_OPSET .. max_opset()``.

    Raises:
        InvalidInput: naming the range.
    """
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= max_opset():
        raise InvalidInput(
            f"ExportConfig.opset must be in {MIN_OPSET}..{max_opset()} (torch.onnx's dynamo exporter, "
            f"the installed onnx {onnx.__version__}), got {opset!r}"
        )
