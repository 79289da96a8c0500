"""ExportConfig: the settings of ``prodip export`` (flags, the ``[export]`` TOML table).

python -c "from export.config import ExportConfig; print(ExportConfig(checkpoint='runs/demo/train'))"
"""

from __future__ import annotations

from dataclasses import dataclass

from prodip.base.config import opt
from prodip.base.errors import InvalidInput
from prodip.base.variants import SAFETENSORS_DTYPES, VARIANT_NAMES

# The variant table is a stage-to-stage contract: it lives in prodip.base.variants.
VARIANTS = VARIANT_NAMES


@dataclass
class ExportConfig:
    """Settings of one export: checkpoint in, export dir out (layout: CONTRACTS.md "Export dir")."""

    checkpoint: str = opt("", "checkpoint step dir, checkpoints dir or run dir (follows `latest`)")
    out: str = opt("", "export dir to create (refused if it exists and is not empty, unless --force)")
    variants: list[str] = opt(
        help="variants to write, any of " + ", ".join(VARIANTS) + " (default: all; "
        "model.safetensors, the HF base, is always written)",
        factory=lambda: list(VARIANTS),
    )
    safetensors_dtype: str = opt("float32", "dtype of model.safetensors", choices=SAFETENSORS_DTYPES)
    opset: int = opt(18, "ONNX opset of the decoder graphs (torch.onnx dynamo exporter)")
    onnx_graph: str = opt(
        "auto",
        "decoder graph: contrib = ONNX Runtime's fused operators (GroupQueryAttention, RotaryEmbedding, "
        "SkipSimplifiedLayerNormalization; ONNX Runtime, onnxruntime-genai, transformers.js; head_dim a "
        "multiple of 8), standard = standard ONNX operators only (other ONNX runtimes; slower), auto = "
        "contrib where the model's shapes allow it, else standard",
        choices=("auto", "contrib", "standard"),
    )
    onnx_external_data: bool = opt(
        False,
        "keep every ONNX file's weights in <file>.data beside it "
        "(always done when a model exceeds protobuf's 2 GB limit)",
    )
    int8_per_channel: bool = opt(True, "int8: one scale per output channel instead of per tensor")
    int8_quantize_embeddings: bool = opt(True, "int8: also quantise the token embedding (Gather) to int8")
    int4_block_size: int = opt(32, "int4: weights per quantisation block along the input dim (power of 2, >= 16)")
    int4_symmetric: bool = opt(False, "int4: symmetric blocks (no zero points, smaller, less accurate)")
    int4_quantize_embeddings: bool = opt(True, "int4: quantise the token embedding too (GatherBlockQuantized)")
    int4_quantize_lm_head: bool = opt(True, "int4: quantise the lm_head MatMul too (else it stays fp32)")
    int4_accuracy_level: int = opt(
        4,
        "int4: MatMulNBits accuracy_level (0 = unset, 1 fp32 .. 4 int8 compute: the model builder's "
        "choice, ~3x faster decode on CPU than unset)",
    )
    force: bool = opt(False, "replace an existing, non-empty export dir")

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise InvalidInput(
                f"ExportConfig.variants: unknown variant(s) {', '.join(map(repr, unknown))}; "
                f"choose from {', '.join(VARIANTS)}"
            )
        if not self.variants:
            raise InvalidInput("ExportConfig.variants: empty; choose from " + ", ".join(VARIANTS))
        bs = self.int4_block_size
        if bs < 16 or bs & (bs - 1):
            raise InvalidInput(f"ExportConfig.int4_block_size must be a power of 2 >= 16, got {bs}")
        if not 0 <= self.int4_accuracy_level <= 4:
            raise InvalidInput(f"ExportConfig.int4_accuracy_level must be in 0..4, got {self.int4_accuracy_level}")
