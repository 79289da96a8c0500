"""The export variants: one table read by export, conformance, serve and the pipeline summary.

A variant is one artifact of an export dir that a runtime loads: ``safetensors`` (the Hugging
Face base, always written), the ONNX decoders, GGUF files for llama.cpp and ExecuTorch programs
(``.pte``, XNNPACK). Each row says where its file lives (relative
to the export dir), its format and weight dtype, and which serving paths can load it. New
targets (GGUF, ExecuTorch) add rows here, and every stage picks them up.

File names of the ONNX variants are the ones transformers.js loads for its dtypes
(``onnx/model{suffix}.onnx``; ``DEFAULT_DTYPE_SUFFIX_MAPPING`` in transformers.js
``src/utils/dtypes.js``, 4.3): fp32 ``""``, fp16 ``_fp16``, q8 ``_quantized`` (the default on WASM:
dynamically quantised int8 weights, which is what the int8 variant is) and q4 ``_q4`` (4-bit
``MatMulNBits``), so ``from_pretrained(dir, {dtype})`` finds each variant without a rename or a second
copy. transformers.js's ``int8`` dtype (``model_int8.onnx``) names the same kind of file as ``q8``; one
copy is written, under the ``q8`` name.

    python -c "from prodip.base.variants import VARIANTS; print([v.name for v in VARIANTS])"
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

ONNX_DIR = "onnx"
GGUF_DIR = "gguf"
PTE_DIR = "executorch"


@dataclass(frozen=True)
class Variant:
    """One exportable artifact.

    Attributes:
        name: the key in ``manifest.json`` ``variants``, ``--variants`` and the tolerance tables.
        path: file relative to the export dir.
        format: ``"safetensors"``, ``"onnx"``, ``"gguf"`` (llama.cpp) or ``"pte"`` (ExecuTorch).
        dtype: weight dtype as written (``float32``, ``float16``, ``int8``, ``int4``; GGUF: llama.cpp's
            type name, ``q8_0``, ``q4_k_m``; ExecuTorch: ``8da4w`` = int8 dynamic activations, int4 weights).
        servable: ``prodip serve`` can run it (an ONNX decoder with the KV-cache I/O of :mod:`prodip.base.onnx_io`).
        transformersjs_dtype: the ``dtype`` option of transformers.js that loads this file ("" = none).
        default: written when ``--variants`` is not given. The GGUF and ``.pte`` targets need the
            ``runtimes`` extra (``gguf``, ``executorch``) and are asked for by name.
    """

    name: str
    path: str
    format: str
    dtype: str
    servable: bool
    transformersjs_dtype: str = ""
    default: bool = True


#: Every variant ``prodip export`` can write, in build order (fp32 ONNX is the source of the others).
#: The ONNX rows go from the widest weights to the narrowest: :data:`GENAI_ORDER` relies on it.
VARIANTS: tuple[Variant, ...] = (
    Variant("safetensors", "model.safetensors", "safetensors", "float32", servable=False),
    Variant("fp32", f"{ONNX_DIR}/model.onnx", "onnx", "float32", servable=True, transformersjs_dtype="fp32"),
    Variant("fp16", f"{ONNX_DIR}/model_fp16.onnx", "onnx", "float16", servable=True, transformersjs_dtype="fp16"),
    Variant("int8", f"{ONNX_DIR}/model_quantized.onnx", "onnx", "int8", servable=True, transformersjs_dtype="q8"),
    Variant("int4", f"{ONNX_DIR}/model_q4.onnx", "onnx", "int4", servable=True, transformersjs_dtype="q4"),
    Variant("gguf-f16", f"{GGUF_DIR}/model-f16.gguf", "gguf", "float16", servable=False, default=False),
    Variant("gguf-q8_0", f"{GGUF_DIR}/model-q8_0.gguf", "gguf", "q8_0", servable=False, default=False),
    Variant("gguf-q4_k_m", f"{GGUF_DIR}/model-q4_k_m.gguf", "gguf", "q4_k_m", servable=False, default=False),
    Variant("pte-fp32", f"{PTE_DIR}/model.pte", "pte", "float32", servable=False, default=False),
    Variant("pte-8da4w", f"{PTE_DIR}/model_8da4w.pte", "pte", "8da4w", servable=False, default=False),
)

BY_NAME: dict[str, Variant] = {v.name: v for v in VARIANTS}
#: Names of every variant, in build order.
VARIANT_NAMES: tuple[str, ...] = tuple(v.name for v in VARIANTS)
#: Names of the ONNX decoder variants, in build order.
ONNX_VARIANTS: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.format == "onnx")
#: Names written when ``--variants`` is not given (safetensors and ONNX).
DEFAULT_VARIANTS: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.default)
#: Names of the GGUF (llama.cpp) variants.
GGUF_VARIANTS: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.format == "gguf")
#: Names of the ExecuTorch program variants.
PTE_VARIANTS: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.format == "pte")
#: Names ``prodip serve --variant`` accepts.
SERVABLE_VARIANTS: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.servable)
#: The ONNX variant the others are derived from (the first ONNX row: exported from torch).
ONNX_SOURCE: str = ONNX_VARIANTS[0]
#: ONNX variants built from :data:`ONNX_SOURCE` (float16 conversion or quantisation), in build order.
DERIVED_ONNX_VARIANTS: tuple[str, ...] = ONNX_VARIANTS[1:]
#: Which ONNX variant ``genai_config.json`` names when an export has several: narrowest weights
#: first (the smallest and fastest on CPU), i.e. the ONNX rows in reverse.
GENAI_ORDER: tuple[str, ...] = tuple(reversed(ONNX_VARIANTS))
#: dtypes ``model.safetensors`` may be written in.
SAFETENSORS_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


def onnx_files() -> dict[str, str]:
    """ONNX variant name -> file path relative to the export dir."""
    return {v.name: v.path for v in VARIANTS if v.format == "onnx"}


def variant_names(
    *, format: Optional[str] = None, servable: Optional[bool] = None, table: Optional[Iterable[Variant]] = None
) -> tuple[str, ...]:
    """Names of the rows of ``table`` (default: :data:`VARIANTS`, looked up at call time, so a test
    that adds a row to the module's table sees it) with the given ``format`` and ``servable`` flag
    (``None`` = any), in table order. Test parametrisations use this rather than a list of names.

        >>> variant_names(format="onnx", servable=True)
        ('fp32', 'fp16', 'int8', 'int4')
    """
    rows = VARIANTS if table is None else table
    return tuple(
        v.name for v in rows if (format is None or v.format == format) and (servable is None or v.servable == servable)
    )
