"""The export variants: one table read by export, conformance, serve and the pipeline summary.

A variant is one artifact of an export dir that a runtime loads: ``safetensors`` (the Hugging
Face base, always written) and the ONNX decoders. Each row says where its file lives (relative
to the export dir), its format and weight dtype, and which serving paths can load it. New
targets (GGUF, ExecuTorch) add rows here, and every stage picks them up.

File names of the ONNX variants follow transformers.js's dtype suffixes (``onnx/model{suffix}.onnx``
with ``""`` for fp32, ``_fp16``, ``_int8``, ``_int4``; see ``DEFAULT_DTYPE_SUFFIX_MAPPING`` in
transformers.js ``src/utils/dtypes.js``).

    python -c "from prodip.base.variants import VARIANTS; print([v.name for v in VARIANTS])"
"""

from __future__ import annotations

from dataclasses import dataclass

ONNX_DIR = "onnx"


@dataclass(frozen=True)
class Variant:
    """One exportable artifact.

    Attributes:
        name: the key in ``manifest.json`` ``variants``, ``--variants`` and the tolerance tables.
        path: file relative to the export dir.
        format: ``"safetensors"`` or ``"onnx"``.
        dtype: weight dtype as written (``float32``, ``float16``, ``int8``, ``int4``).
        servable: ``prodip serve`` can run it (an ONNX decoder with the KV-cache I/O of :mod:`prodip.base.onnx_io`).
    """

    name: str
    path: str
    format: str
    dtype: str
    servable: bool


#: Every variant ``prodip export`` can write, in build order (fp32 ONNX is the source of the others).
VARIANTS: tuple[Variant, ...] = (
    Variant("safetensors", "model.safetensors", "safetensors", "float32", servable=False),
    Variant("fp32", f"{ONNX_DIR}/model.onnx", "onnx", "float32", servable=True),
    Variant("fp16", f"{ONNX_DIR}/model_fp16.onnx", "onnx", "float16", servable=True),
    Variant("int8", f"{ONNX_DIR}/model_int8.onnx", "onnx", "int8", servable=True),
    Variant("int4", f"{ONNX_DIR}/model_int4.onnx", "onnx", "int4", servable=True),
)

BY_NAME: dict[str, Variant] = {v.name: v for v in VARIANTS}
#: Names of every variant, in build order.
VARIANT_NAMES: tuple[str, ...] = tuple(v.name for v in VARIANTS)
#: Names of the ONNX decoder variants, in build order.
ONNX_VARIANTS: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.format == "onnx")
#: Names ``prodip serve --variant`` accepts.
SERVABLE_VARIANTS: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.servable)
#: dtypes ``model.safetensors`` may be written in.
SAFETENSORS_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


def onnx_files() -> dict[str, str]:
    """ONNX variant name -> file path relative to the export dir."""
    return {v.name: v.path for v in VARIANTS if v.format == "onnx"}
