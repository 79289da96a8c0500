"""ExportConfig: the settings of ``prodip export`` (flags, the ``[export]`` TOML table).

python -c "from prodip.export.config import ExportConfig; print(ExportConfig(checkpoint='runs/demo/train'))"
"""

from __future__ import annotations

from dataclasses import dataclass

from prodip.base.config import opt
from prodip.base.errors import InvalidInput
from prodip.base.variants import DEFAULT_VARIANTS, SAFETENSORS_DTYPES, VARIANT_NAMES
from prodip.export.limits import check_nbits_options, check_opset

# The variant table is a stage-to-stage contract: it lives in prodip.base.variants.
VARIANTS = VARIANT_NAMES


@dataclass
class ExportConfig:
    """Settings of one export: checkpoint in, export dir out (layout: CONTRACTS.md "Export dir")."""

    checkpoint: str = opt(
        "",
        "checkpoint step dir, checkpoints dir or run dir (follows `latest`), or a Hugging Face Llama folder "
        "(config.json, model.safetensors, tokenizer.json) exported unchanged with its own tokenizer",
    )
    out: str = opt("", "export dir to create (refused if it exists and is not empty, unless --force)")
    variants: list[str] = opt(
        help="variants to write, any of "
        + ", ".join(VARIANTS)
        + " (default: "
        + ", ".join(DEFAULT_VARIANTS)
        + "; model.safetensors, the HF base, is always written; gguf-* and pte-* need pip extra `runtimes`)",
        factory=lambda: list(DEFAULT_VARIANTS),
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
        "write the fp32 ONNX decoder with its weights in <file>.data from the start (done anyway over "
        "protobuf's 2 GB limit; a contrib graph's variants end with their weights in <file>_data either way)",
    )
    int8_block_size: int = opt(
        64,
        "int8: weights per scale in the untied embedding table (16, 32, 64, 128 or 256; the largest of those "
        "dividing hidden_size and at most this is used, recorded as embedding_block_size; MatMuls: one per channel)",
    )
    int8_quantize_embeddings: bool = opt(True, "int8: also quantise the token embedding (Gather) to int8")
    int4_block_size: int = opt(
        32,
        "int4: weights per quantisation block along the input dim (16, 32, 64, 128 or 256; it must divide "
        "hidden_size, num_attention_heads * head_dim or intermediate_size, the MatMul input sizes)",
    )
    int4_symmetric: bool = opt(
        True,
        "int4: symmetric blocks, no zero points (the model builder's choice: ~10% faster decode on CPU, "
        "2% smaller; false = asymmetric, slightly more accurate)",
    )
    int4_quantize_embeddings: bool = opt(True, "int4: quantise the token embedding too (GatherBlockQuantized)")
    int4_quantize_lm_head: bool = opt(True, "int4: quantise the lm_head MatMul too (else it stays fp32)")
    int4_accuracy_level: int = opt(
        4,
        "int4: MatMulNBits accuracy_level (0 = unset, 1 fp32 .. 4 int8 compute: the model builder's "
        "choice, ~3x faster decode on CPU than unset)",
    )
    pte_group_size: int = opt(
        32, "pte-8da4w: weights per int4 group along each Linear's input dim (must divide hidden and intermediate size)"
    )
    pte_max_seq_len: int = opt(
        0,
        "pte-*: the program's KV-cache window (tokens; get_max_seq_len), shorter than the model's "
        "max_position_embeddings for a long-context model whose whole-window plan is too large; 0 = the whole window",
    )
    force: bool = opt(False, "replace an existing, non-empty export dir")
    base_model_id: str = opt(
        "",
        "the Hub id of the model this one starts from (e.g. HuggingFaceTB/SmolLM2-135M-Instruct), the card's "
        "base_model; default: derived (an imported or --init-from folder's config.json _name_or_path when it is "
        "a Hub id, a checkpoint's own base followed back), else none: a local path never becomes base_model",
    )

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise InvalidInput(
                f"ExportConfig.variants: unknown variant(s) {', '.join(map(repr, unknown))}; "
                f"choose from {', '.join(VARIANTS)}"
            )
        if not self.variants:
            raise InvalidInput("ExportConfig.variants: empty; choose from " + ", ".join(VARIANTS))
        # ranges set by the libraries the export calls, asked of them (prodip.export.limits)
        check_opset(self.opset)
        check_nbits_options(4, self.int4_block_size, self.int4_accuracy_level, name="ExportConfig.int4_block_size")
        check_nbits_options(8, self.int8_block_size, 4, name="ExportConfig.int8_block_size")
        if isinstance(self.pte_max_seq_len, bool) or self.pte_max_seq_len < 0:
            raise InvalidInput(
                f"ExportConfig.pte_max_seq_len must be >= 0 (0 = the whole window), got {self.pte_max_seq_len}"
            )
        gs = self.pte_group_size
        if gs < 16 or gs & (gs - 1):
            raise InvalidInput(f"ExportConfig.pte_group_size must be a power of 2 >= 16, got {gs}")
