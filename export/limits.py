"""The valid ranges of export options that a library we call decides, asked of that library.

``prodip export`` checks every such option before any work starts (:class:`ExportConfig`'s
``__post_init__``), so a value the library would refuse deep inside
the export (after the fp32 stage) is an :class:`~prodip.base.errors.InvalidInput` up front, with
the library's own words. Sources:

* MatMulNBits / GatherBlockQuantized block sizes: ONNX Runtime's blockwise quantisation kernel
  (``onnxruntime.capi._pybind_state.quantize_matmul_{4,8}bits``, MLAS ``MlasQuantizeBlockwise``),
  probed on a tiny matrix: in onnxruntime 1.32 it accepts 16, 32, 64, 128 and 256.
* MatMulNBits ``accuracy_level``: 0..4 (ORT docs/ContribOperators.md).
* ONNX opset: at least 18 (torch.onnx's dynamo exporter and the LayerNorm/ReduceMean forms it
  writes) and at most ``onnx.defs.onnx_opset_version()`` (the newest opset the installed onnx
  knows; ONNX Runtime 1.32 runs up to that).

    python -c "from prodip.export.limits import supported_block_sizes; print(supported_block_sizes(4))"
"""

from __future__ import annotations

import functools

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
