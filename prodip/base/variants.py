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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, StrictInt, Tag, model_validator

from prodip.base.jsontypes import JSONObject, JSONValue
from prodip.base.records import RecordPart

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


# A variant's entry in the export manifest (``manifest.json`` ``variants[name]``, read and written only inside
# :class:`prodip.base.manifest.ExportManifest`) and the ``quantization`` of each writer.


class OnnxQuantization(RecordPart):
    """An ONNX variant's ``quantization`` (``prodip.export.quantize``: ``to_fp16``, ``to_int8``, ``to_int4``):
    every key those write, in their order (each writes only its own; the fp32 variant has none). Keys a newer
    export adds are kept."""

    #: the function or library that rewrote the graph
    tool: str
    #: fp16: float32 inputs and outputs kept; the op types left in float32; nodes kept float32; casts removed
    keep_io_types: StrictBool | None = None
    op_block_list: list[str] | None = None
    rope_nodes_kept_fp32: StrictInt | None = None
    rmsnorm_nodes_kept_fp32: StrictInt | None = None
    fp16_round_trips_removed: StrictInt | None = None
    #: int8/int4: rounding algorithm, the operator format, bits per weight
    algorithm: str | None = None
    format: str | None = None
    #: int4: the weights' operator layout (``prodip.export.quantize.INT4_LAYOUTS``) and MatMuls written as
    #: int4 DequantizeLinear + MatMul (count)
    layout: str | None = None
    matmuls_as_qdq: StrictInt | None = None
    bits: StrictInt | None = None
    #: int8: one scale per output channel; activations quantised per row at run time
    weight_granularity: str | None = None
    activation_quantization: str | None = None
    #: int4: weights per block along the input dim
    block_size: StrictInt | None = None
    symmetric: StrictBool | None = None
    #: int8: MatMuls rewritten to MatMulInteger
    matmuls_quantized: StrictInt | None = None
    op_types: list[str] | None = None
    embedding_quantized: StrictBool | None = None
    #: int8: weights per scale of an untied embedding table (None: shared with the lm_head)
    embedding_block_size: StrictInt | None = None
    lm_head_quantized: StrictBool | None = None
    embedding_shared_with_lm_head: StrictBool | None = None
    #: GatherBlockQuantized lookups lowered to standard operators (count)
    embedding_lookup_lowered: StrictInt | None = None
    #: int4: MatMulNBits ``accuracy_level``
    accuracy_level: StrictInt | None = None
    materialized_transposes: StrictInt | None = None
    #: whether the weights are in an external file (set to True when export moved them to ``<file>_data``)
    external_data: StrictBool | None = None
    #: int4: the graph's default-domain opset after quantisation
    opset: StrictInt | None = None
    embedding_layout: str | None = None
    embedding_not_shared_because: str | None = None
    embedding_not_quantized_because: str | None = None


class GgufQuantization(RecordPart):
    """A GGUF variant's ``quantization`` (``prodip.export.gguf.export_gguf``), keys in its order."""

    #: GGUF tensor type -> number of tensors of it (``{"Q4_K": 14, "F32": 5}``)
    tensor_types: dict[str, StrictInt]
    #: llama.cpp pre-tokenizer type (``tokenizer.ggml.pre``)
    pre: str | None = None
    #: tokens in the GGUF vocabulary (padded to the embedding's rows)
    tokens: StrictInt | None = None
    quantizer: str | None = None
    gguf_py_version: str | None = None


class RunnerMetadata(RecordPart):
    """The constant methods of a ``.pte`` ExecuTorch's LLM runners read (``prodip.export.executorch.runner_metadata``)."""

    get_bos_id: StrictInt
    get_eos_ids: list[StrictInt]
    get_max_seq_len: StrictInt
    get_max_context_len: StrictInt | None = None
    get_vocab_size: StrictInt | None = None
    get_n_layers: StrictInt | None = None
    use_kv_cache: StrictBool | None = None
    use_sdpa_with_kv_cache: StrictBool | None = None
    enable_dynamic_shape: StrictBool | None = None


class PteQuantization(RecordPart):
    """A ``.pte`` variant's ``quantization`` (``prodip.export.executorch.export_pte``), keys in its order."""

    #: ``8da4w`` (8-bit dynamic activations, 4-bit grouped weights) or None (float32)
    scheme: str | None
    #: 8da4w: int4 weights per group along each Linear's input dim
    group_size: StrictInt | None = None
    quantizer: str | None = None
    backend: str | None = None
    runner_metadata: RunnerMetadata
    executorch_version: str | None = None
    torchao_version: str | None = None


def _quantization_kind(value: Any) -> str:
    """Which writer's ``quantization`` ``value`` is, by the key only that writer writes."""
    if isinstance(value, BaseModel):
        return {PteQuantization: "pte", GgufQuantization: "gguf"}.get(type(value), "onnx")
    keys = value if isinstance(value, dict) else {}
    return "pte" if "runner_metadata" in keys else "gguf" if "tensor_types" in keys else "onnx"


#: a variant's ``quantization``: which one is told by the keys only its writer writes (an error names the kind
#: in its path: ``variants.int4.quantization.onnx.bits``); :class:`VariantEntry` checks it fits ``format``
Quantization = Annotated[
    Annotated[OnnxQuantization, Tag("onnx")]
    | Annotated[GgufQuantization, Tag("gguf")]
    | Annotated[PteQuantization, Tag("pte")],
    Discriminator(_quantization_kind),
]
_QUANTIZATION_OF = {"onnx": OnnxQuantization, "gguf": GgufQuantization, "pte": PteQuantization}


class VariantEntry(RecordPart):
    """One variant of the export (``manifest.json`` ``variants[name]``): every key ``prodip export`` writes,
    declared in the order it writes them (a variant has only those of its format; the ones it lacks stay
    unset and are not written back). Keys a newer export adds are kept.
    """

    model_config = ConfigDict(validate_assignment=True)

    #: the variant's file, relative to the export dir (``onnx/model_q4.onnx``)
    path: str
    #: ``safetensors``, ``onnx``, ``gguf`` or ``pte`` (``prodip.base.variants``)
    format: str
    #: weight dtype as the export names it (``float32``, ``int4``, ``bfloat16``, ``q8_0``, ...)
    dtype: str | None = None
    #: how the weights were converted or quantised (:data:`Quantization`; None: not)
    quantization: Quantization | None = None
    #: files holding the graph's weights (ONNX ``<file>_data``), relative to the export dir
    external_data: list[str] = Field(default_factory=list)
    #: ONNX: dtype of the graph's float inputs and outputs, and of the KV cache
    io_dtype: str | None = None
    kv_cache_dtype: str | None = None
    #: ONNX: the default-domain opset, and every domain's (``{"ai.onnx": 17, "com.microsoft": 1}``)
    opset: StrictInt | None = None
    opset_imports: dict[str, StrictInt] | None = None
    #: ONNX: ``contrib`` (ONNX Runtime's fused operators) or ``standard`` (ONNX operators only)
    graph: str | None = None
    #: ONNX contrib: the shared-buffer graph for onnxruntime-genai
    genai_path: str | None = None
    #: ONNX: the dtype transformers.js loads the variant by (``fp32``, ``q8``, ...)
    transformersjs_dtype: str | None = None
    #: ONNX: what ``og.Config.overlay`` needs to load the variant (``prodip.export.genai.genai_overlay``)
    genai_overlay: JSONObject | None = None
    #: ONNX: whether ``genai_config.json`` names this variant
    genai_default: StrictBool | None = None
    #: ``.pte``: the file its runner reads its tokenizer from (others read ``tokenizer.json``)
    tokenizer: str | None = None
    #: ONNX int4 (qdq layout): the graph the export's page loads on onnxruntime-web's WASM device instead (the
    #: same int4 weights, folded to 8-bit at load: ``prodip.export.quantize.to_int4_wasm``), and its writer's
    #: parameters (``shares_weights_with``, ``session_config``, ...)
    wasm_path: str | None = None
    wasm: JSONObject | None = None

    @model_validator(mode="after")
    def _quantization_fits_format(self) -> VariantEntry:
        want = _QUANTIZATION_OF.get(self.format)
        if self.quantization is not None and want is not None and not isinstance(self.quantization, want):
            kind = _quantization_kind(self.quantization)
            raise ValueError(f"quantization is a {kind} variant's, but the variant's format is {self.format!r}")
        return self

    def files(self) -> list[str]:
        """The variant's file and its external data, relative to the export dir."""
        return [self.path, *self.external_data]


#: transformers.js loads dtype ``q4`` of ``model_file_name`` from ``onnx/<model_file_name>_q4.onnx``.
_TJS_FOLDER, _TJS_Q4_SUFFIX = PurePosixPath("onnx"), "_q4.onnx"


def wasm_page_entry(variant_path: str, wasm_path: str, params: Mapping[str, JSONValue]) -> JSONObject:
    """``config.json`` ``transformers.js_config.prodip_wasm_q4``: how the export's page loads a variant's web graph.

    The one definition: the export writes it and conformance checks ``config.json`` against it.

    Args:
        variant_path: the variant's file (``onnx/model_q4.onnx``); wasm_path: its web graph
            (``onnx/model_wasm_q4.onnx``); params: the manifest's ``wasm`` table (``shares_weights_with``,
            ``session_config``).
    Returns:
        ``model_file_name`` (the ``<name>`` of ``onnx/<name>_q4.onnx``, or a text saying that no name loads a graph
        elsewhere), ``external_data`` (the variant file's weights the graph reads, as onnxruntime-web's
        ``externalData`` ``{path, data}``) and ``session_config``.
    """
    pure = PurePosixPath(wasm_path)
    if pure.parent == _TJS_FOLDER and pure.name.endswith(_TJS_Q4_SUFFIX):
        name = pure.name.removesuffix(_TJS_Q4_SUFFIX)
    else:
        name = f"(none: transformers.js loads {_TJS_FOLDER}/<model_file_name>{_TJS_Q4_SUFFIX}, not {wasm_path})"
    shared = params.get("shares_weights_with")
    data: list[JSONValue] = []
    if isinstance(shared, str) and shared:
        data.append({"path": shared, "data": str(PurePosixPath(variant_path).with_name(shared))})
    return {"model_file_name": name, "external_data": data, "session_config": params.get("session_config")}
