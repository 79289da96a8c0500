"""Model configuration with Hugging Face ``LlamaConfig`` field names.

The checkpoint's ``config.json`` is ``dataclasses.asdict(ModelConfig)``; the export's
``config.json`` is the same dict plus the fixed HF keys (``architectures``, ``model_type``,
``torch_dtype``), so there is no renaming layer anywhere (see CONTRACTS.md "Run dir and checkpoints").

    python -c "from prodip.train.config import ModelConfig; print(ModelConfig(vocab_size=8192).num_parameters())"
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from prodip.base.config import from_dict, opt
from prodip.base.errors import InvalidInput, MissingInput

#: The HF class each ``model_type`` loads as (``architectures`` in config.json).
HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def hf_fixed_keys(model_type: str) -> dict[str, Any]:
    """The keys every export's config.json carries besides the ModelConfig fields: ``architectures``
    and ``model_type`` (HF's names) for ``model_type``."""
    return {"architectures": [HF_ARCHITECTURES[model_type]], "model_type": model_type}


#: The keys of Llama 3.1's RoPE scaling (HF ``rope_scaling`` with ``rope_type = "llama3"``) and their types.
LLAMA3_ROPE_KEYS = {
    "factor": float,
    "low_freq_factor": float,
    "high_freq_factor": float,
    "original_max_position_embeddings": int,
}


def check_rope_scaling(rope_scaling: Optional[dict[str, Any]], *, source: str) -> None:
    """Refuse a RoPE scaling the model does not compute: only none or ``rope_type = "llama3"``.

    Raises:
        InvalidInput: another ``rope_type`` (``type`` in older configs), or a llama3 key missing or
            not a positive number, naming ``source`` and the key.
    """
    if not rope_scaling:
        return
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if kind != "llama3":
        raise InvalidInput(
            f"{source}: rope_type {kind!r} is not supported (prodip computes RoPE with no scaling or with "
            "Llama 3.1's 'llama3' scaling)"
        )
    for key, tp in LLAMA3_ROPE_KEYS.items():
        value = rope_scaling.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise InvalidInput(f"{source}: {key} = {value!r}; llama3 RoPE scaling needs a positive {tp.__name__}")
    if rope_scaling["high_freq_factor"] <= rope_scaling["low_freq_factor"]:
        raise InvalidInput(
            f"{source}: high_freq_factor {rope_scaling['high_freq_factor']} must exceed low_freq_factor "
            f"{rope_scaling['low_freq_factor']}"
        )
    extra = sorted(set(rope_scaling) - {*LLAMA3_ROPE_KEYS, "rope_type", "type", "rope_theta"})
    if extra:
        raise InvalidInput(f"{source}: {', '.join(extra)} not understood in llama3 RoPE scaling")


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only Llama model. Field names and meanings are those of HF ``LlamaConfig``.

    ``model_type = "qwen2"`` is HF's ``Qwen2Config`` model: the Llama decoder with a bias on the
    q, k and v projections (none on o_proj or the MLP), as transformers' ``Qwen2Attention`` builds it
    (Qwen2 has no config key for it); its sliding-window attention is not modelled (refused on import).
    """

    vocab_size: Optional[int] = opt(
        None,
        "vocabulary size (tokens); default: the tokenizer's (tokenizer.json in the tokenizer dir). "
        "Set it only to pin it: a tokenizer of another size is then an error",
    )
    hidden_size: int = opt(512, "model width D (features)")
    intermediate_size: int = opt(1408, "SwiGLU MLP width (features)")
    num_hidden_layers: int = opt(8, "number of decoder layers")
    num_attention_heads: int = opt(8, "query heads H")
    num_key_value_heads: int = opt(8, "key/value heads Hkv for grouped-query attention (divides H)")
    head_dim: Optional[int] = opt(None, "per-head width Dh (features); default hidden_size / num_attention_heads")
    max_position_embeddings: int = opt(1024, "longest sequence the model is trained and served at (tokens)")
    rms_norm_eps: float = opt(1e-5, "epsilon inside RMSNorm")
    rope_theta: float = opt(10000.0, "RoPE base frequency (Su et al. 2021, arXiv:2104.09864)")
    rope_scaling: Optional[dict[str, Any]] = opt(
        None,
        "RoPE frequency scaling as HF LlamaConfig's: none, or Llama 3.1's {rope_type = 'llama3', factor, "
        "low_freq_factor, high_freq_factor, original_max_position_embeddings}",
    )
    tie_word_embeddings: bool = opt(False, "share the input embedding and lm_head weight")
    initializer_range: float = opt(0.02, "std of the normal init of Linear/Embedding weights (HF Llama)")
    hidden_act: str = opt("silu", "MLP activation (SwiGLU uses SiLU)", choices=("silu",))
    attention_bias: bool = opt(False, "bias in q/k/v/o projections (Llama: none)", choices=(False,))
    mlp_bias: bool = opt(False, "bias in MLP projections (Llama: none)", choices=(False,))
    bos_token_id: int = opt(1, "id of <|bos|> in the tokenizer")
    eos_token_id: int = opt(2, "id of <|eos|> in the tokenizer")
    pad_token_id: int = opt(0, "id of <|pad|> in the tokenizer")
    model_type: str = opt(
        "llama",
        "HF model type: 'llama', or 'qwen2' (the same decoder with q/k/v projection biases)",
        choices=tuple(HF_ARCHITECTURES),
    )

    def __post_init__(self) -> None:
        if self.vocab_size is not None and self.vocab_size <= 0:
            raise InvalidInput(f"ModelConfig.vocab_size must be > 0, got {self.vocab_size}")
        positive = (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise InvalidInput(f"ModelConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise InvalidInput(
                f"ModelConfig.num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise InvalidInput(
                    f"ModelConfig.hidden_size ({self.hidden_size}) must be divisible by "
                    f"num_attention_heads ({self.num_attention_heads}), or set head_dim"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.head_dim % 2:
            raise InvalidInput(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        check_rope_scaling(self.rope_scaling, source="ModelConfig.rope_scaling")
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if self.vocab_size is not None and not 0 <= getattr(self, name) < self.vocab_size:
                raise InvalidInput(
                    f"ModelConfig.{name}={getattr(self, name)} is outside the vocabulary [0, {self.vocab_size})"
                )

    @property
    def qkv_bias(self) -> bool:
        """Whether q_proj, k_proj and v_proj carry a bias (Qwen2's attention)."""
        return self.model_type == "qwen2"

    # ---- the vocabulary comes from the tokenizer ---------------------------------------------
    def with_vocab_size(self, tokenizer_vocab_size: int, *, source: str) -> ModelConfig:
        """This config with the tokenizer's vocabulary size: the one place the two are reconciled.

        Args:
            tokenizer_vocab_size: tokens in the tokenizer (``tokenizer.json``, added tokens included).
            source: the tokenizer file or shards ``meta.json`` the size was read from (for the error).
        Returns:
            ``self`` when ``vocab_size`` already equals it, else a copy with ``vocab_size`` set.
        Raises:
            InvalidInput: ``vocab_size`` was pinned in the config to another size.
        """
        if self.vocab_size is None:
            return dataclasses.replace(self, vocab_size=int(tokenizer_vocab_size))
        if self.vocab_size != tokenizer_vocab_size:
            raise InvalidInput(
                f"[model] vocab_size = {self.vocab_size} differs from the tokenizer's {tokenizer_vocab_size} "
                f"({source}); remove vocab_size from [model] to take the tokenizer's"
            )
        return self

    def _vocab(self) -> int:
        if self.vocab_size is None:
            raise InvalidInput(
                "ModelConfig.vocab_size is not known yet: it comes from the tokenizer (ModelConfig.with_vocab_size)"
            )
        return self.vocab_size

    # ---- derived figures -------------------------------------------------------------------
    def num_parameters(self, *, include_embedding: bool = True) -> int:
        """Trainable parameter count (tied weights counted once).

        Raises:
            InvalidInput: the vocabulary size is not resolved yet (see :meth:`with_vocab_size`).
        """
        self._vocab()
        D, L, V, Dh = self.hidden_size, self.num_hidden_layers, self.vocab_size, self.head_dim
        attn = D * Dh * (self.num_attention_heads * 2 + self.num_key_value_heads * 2)
        if self.qkv_bias:
            attn += Dh * (self.num_attention_heads + 2 * self.num_key_value_heads)
        mlp = 3 * D * self.intermediate_size
        per_layer = attn + mlp + 2 * D
        emb = V * D
        head = 0 if self.tie_word_embeddings else V * D
        total = L * per_layer + D + head + (emb if include_embedding else 0)
        return total

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward) for a sequence of ``seq_len`` tokens.

        ``6 * N + 12 * L * H * Dh * T`` with N the non-embedding parameters plus the lm_head, from
        Chowdhery et al. 2022 (PaLM, arXiv:2204.02311, appendix B) as used by nanoGPT's MFU.
        Causal masking is not discounted (the usual convention).
        """
        n = self.num_parameters(include_embedding=False)
        if self.tie_word_embeddings:  # the tied matrix still does the lm_head matmul
            n += self._vocab() * self.hidden_size
        attn = 12 * self.num_hidden_layers * self.num_attention_heads * self.head_dim * seq_len
        return 6.0 * n + attn

    # ---- (de)serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> ModelConfig:
        """Build from a dict holding exactly the ModelConfig fields (HF-only keys are ignored
        when ``source`` is an export ``config.json``: pass ``hf=True`` via :meth:`from_hf_dict`)."""
        return from_dict(cls, data, source=source)

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any], *, source: str = "config.json") -> ModelConfig:
        """Build from an HF ``config.json`` dict: keys that are not ModelConfig fields are dropped."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls.from_dict({k: v for k, v in data.items() if k in names}, source=source)

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        """Read a checkpoint ``config.json`` (exact fields; an unknown key is an error)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise MissingInput(f"{path}: model config not found (written by `prodip train`)") from None
        except json.JSONDecodeError as err:
            raise InvalidInput(f"{path}: not valid JSON: {err}") from None
        return cls.from_dict(data, source=str(path))
