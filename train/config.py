"""The train package's configs: the model (``[model]``, Hugging Face ``LlamaConfig`` field names), training
(``[train]``), evaluation (``[eval]``) and chat fine-tuning (``[sft]``).

The checkpoint's ``config.json`` is ``dataclasses.asdict(ModelConfig)``; the export's
``config.json`` is the same dict plus the fixed HF keys (``architectures``, ``model_type``,
``torch_dtype``), so there is no renaming layer anywhere (see CONTRACTS.md "Run dir and checkpoints").

    python -c "from prodip.train.config import ModelConfig; print(ModelConfig(vocab_size=8192).num_parameters())"
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, cast

from prodip.base.config import check_threads, from_dict, opt
from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.jsontypes import JSONObject
from prodip.base.sources import SourceOptions

log = logging.getLogger("prodip.train")

#: The HF class each ``model_type`` loads as (``architectures`` in config.json).
HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def hf_fixed_keys(model_type: str) -> JSONObject:
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


def check_rope_scaling(rope_scaling: Optional[Mapping[str, object]], *, source: str) -> None:
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
    checked: dict[str, float] = {}
    for key, tp in LLAMA3_ROPE_KEYS.items():
        value = rope_scaling.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise InvalidInput(f"{source}: {key} = {value!r}; llama3 RoPE scaling needs a positive {tp.__name__}")
        checked[key] = value
    if checked["high_freq_factor"] <= checked["low_freq_factor"]:
        raise InvalidInput(
            f"{source}: high_freq_factor {checked['high_freq_factor']} must exceed low_freq_factor "
            f"{checked['low_freq_factor']}"
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
        if self._head_dim() % 2:
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

    def _head_dim(self) -> int:
        """``head_dim``: the field as set (by ``__post_init__`` when not given), typed as the int it is by then."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

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
        D, L, V, Dh = self.hidden_size, self.num_hidden_layers, self._vocab(), self._head_dim()
        attn = D * Dh * (self.num_attention_heads * 2 + self.num_key_value_heads * 2)
        if self.qkv_bias:
            attn += cast(int, Dh) * (self.num_attention_heads + 2 * self.num_key_value_heads)
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
        attn = 12 * self.num_hidden_layers * self.num_attention_heads * self._head_dim() * seq_len
        return 6.0 * n + attn

    # ---- (de)serialisation -----------------------------------------------------------------
    def to_dict(self) -> JSONObject:
        """The config as ``config.json`` holds it (``dataclasses.asdict``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object], *, source: str = "config") -> ModelConfig:
        """Build from a dict holding exactly the ModelConfig fields (HF-only keys are ignored
        when ``source`` is an export ``config.json``: pass ``hf=True`` via :meth:`from_hf_dict`)."""
        return from_dict(cls, data, source=source)

    @classmethod
    def from_hf_dict(cls, data: Mapping[str, object], *, source: str = "config.json") -> ModelConfig:
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


#: ``[train] lr_schedule`` / ``[sft] lr_schedule`` choices (``prodip.train.schedule``).
SCHEDULES = ("cosine", "wsd")
#: ``[train] data_order`` choices (``prodip.train.data``).
ORDERS = ("shuffle", "sequential")
#: ``[train] compile_mode`` choices (torch.compile's ``mode``).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: ``[train] attention_backend`` choices: the keys of ``prodip.train.attention.BACKENDS``.
ATTENTION_BACKENDS = ("auto", "flash", "cudnn", "efficient", "math")


@dataclass(frozen=True)
class TrainConfig:
    """One training run. A "step" is one optimizer step; sizes are per rank unless stated."""

    shards_dir: str = opt("runs/demo/shards", "shards dir from `prodip data prepare`")
    tokenizer_dir: str = opt("runs/demo/tokenizer", "tokenizer dir the shards were encoded with")
    out_dir: str = opt("runs/demo/train", "run dir: config.toml, metrics.jsonl, loss.png, checkpoints/")
    steps: int = opt(200, "total optimizer steps of the run (the lr schedule spans these)")
    max_steps_this_run: int = opt(
        0,
        "stop after this many steps in this invocation, 0 = run to `steps` "
        "(time-sliced jobs; resume later with --resume)",
    )
    batch_size: int = opt(8, "sequences per micro-batch per rank")
    seq_len: int = opt(256, "tokens per sequence (<= max_position_embeddings)")
    grad_accum_steps: int = opt(
        1, "micro-batches per optimizer step (the loss is the mean over all their trained targets)"
    )
    lr: float = opt(3e-4, "peak learning rate (after warmup)")
    min_lr: float = opt(3e-5, "learning rate at the end of the decay")
    warmup_steps: int = opt(20, "linear warmup (optimizer steps)")
    lr_schedule: str = opt(
        "cosine",
        "cosine (decay over all `steps`) | wsd (warmup-stable-decay: flat, then linear decay over the last "
        "decay_fraction of `steps`; a run can be extended with no lr jump until its decay starts)",
        choices=SCHEDULES,
    )
    decay_fraction: float = opt(0.2, "wsd: share of `steps` spent decaying to min_lr (0-1]")
    weight_decay: float = opt(0.1, "AdamW decoupled weight decay on 2-D weights only")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.95, "AdamW beta2")
    adam_eps: float = opt(1e-8, "AdamW epsilon")
    grad_clip: float = opt(1.0, "clip the global gradient L2 norm to this, 0 = no clipping")
    mixture: dict[str, float] = opt(
        help="language -> sampling weight, e.g. {bn = 0.7, en = 0.3}; empty = by token count", factory=dict
    )
    seed: int = opt(1234, "seed for init and data order")
    data_order: str = opt(
        "shuffle",
        "shuffle (each language's windows in a new seeded random order every epoch) | sequential (file order)",
        choices=ORDERS,
    )
    init_from: str = opt(
        "",
        "start from these weights with a fresh optimizer and schedule: a prodip run/checkpoint dir or a "
        "Hugging Face Llama folder (safetensors); the model config is the source's",
    )
    new_embeddings_first_steps: int = opt(
        0,
        "with --init-from a folder made by `prodip tokenizer extend`: train only the embedding (and lm_head) rows "
        "it added for this many optimizer steps, the rest frozen, then everything (train/freeze.py); 0 = off",
    )
    checkpoint_every_steps: int = opt(100, "save a checkpoint every N steps (and at the end), 0 = end only")
    checkpoint_every_s: float = opt(
        0.0, "also save when this many seconds of wall time have passed since the last save (rank 0's clock), 0 = off"
    )
    async_checkpoint: bool = opt(
        True, "write checkpoints in a background thread: training is held only while the state is copied to host memory"
    )
    keep_last: int = opt(3, "checkpoints kept (newest)")
    eval_every_steps: int = opt(0, "held-out loss every N steps, 0 = never during training")
    eval_tokens: int = opt(16384, "validation tokens per language for that held-out loss (tokens)")
    log_every_steps: int = opt(1, "write a metrics.jsonl line every N steps")
    device: str = opt("auto", "auto | cpu | cuda", choices=("auto", "cpu", "cuda"))
    dtype: str = opt(
        "auto",
        "auto (bf16 autocast on CUDA, fp32 on CPU) | float32 | bfloat16",
        choices=("auto", "float32", "bfloat16"),
    )
    compile: bool = opt(False, "torch.compile the model (CUDA; slow first step)")
    compile_mode: str = opt(
        "default",
        "torch.compile mode: default | reduce-overhead (CUDA graphs) | max-autotune | max-autotune-no-cudagraphs",
        choices=COMPILE_MODES,
    )
    compile_scope: str = opt(
        "model",
        "what torch.compile compiles: model (one graph, the loss head included) | layers (each decoder layer on "
        "its own: one graph reused by every layer, a shorter compile)",
        choices=("model", "layers"),
    )
    fused_projections: bool = opt(
        False,
        "compute q/k/v and gate/up as one matrix product each (weights concatenated in the forward; "
        "checkpoints and exports keep Hugging Face's separate tensors)",
    )
    attention_backend: str = opt(
        "auto",
        "SDPA kernel: auto (PyTorch's choice) | flash | cudnn | efficient | math (torch.nn.attention.sdpa_kernel); "
        "the kernel that ran is logged and written to metrics.jsonl; one that cannot run here is refused",
        choices=ATTENTION_BACKENDS,
    )
    deterministic: bool = opt(
        False,
        "CUDA: deterministic algorithms, CUBLAS_WORKSPACE_CONFIG, a deterministic attention backward, so a "
        "resume is bitwise (slower kernels); CPU runs are deterministic either way",
    )
    activation_checkpointing: bool = opt(False, "recompute layer activations in backward (saves memory)")
    loss_chunk_tokens: int = opt(
        2048,
        "tokens per chunk of the fused lm_head + cross-entropy: one chunk of (tokens x vocab) fp32 logits at a time",
    )
    parallel: str = opt(
        "auto",
        "several ranks: ddp (replicated weights) | fsdp (FSDP2 fully_shard: weights, gradients and AdamW state "
        "sharded; for models that do not fit one GPU with DDP) | auto (ddp with several ranks, none with one). "
        "ddp or fsdp given explicitly under torchrun apply at one rank too (one GPU exercises NCCL, DDP, FSDP2)",
        choices=("auto", "ddp", "fsdp"),
    )
    guards: bool = opt(True, "run the gradient-flow arbiter before step 1 and the update-flow probe")
    resume: bool = opt(False, "continue from OUT_DIR/checkpoints/latest (weights, Adam, RNG, data)")
    force: bool = opt(False, "train even if the tokenizer failed its fertility gate")
    progress: bool = opt(True, "show a tqdm progress bar with ETA")

    def __post_init__(self) -> None:
        for name in (
            "steps",
            "batch_size",
            "seq_len",
            "grad_accum_steps",
            "keep_last",
            "log_every_steps",
            "loss_chunk_tokens",
        ):
            if getattr(self, name) < 1:
                raise InvalidInput(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise InvalidInput(f"TrainConfig.lr must be > 0, got {self.lr}")
        if self.min_lr < 0 or self.warmup_steps < 0:
            raise InvalidInput(
                f"TrainConfig.min_lr and warmup_steps must be >= 0, got {self.min_lr}, {self.warmup_steps}"
            )
        if not 0.0 < self.decay_fraction <= 1.0:
            raise InvalidInput(f"TrainConfig.decay_fraction must be in (0, 1], got {self.decay_fraction}")
        if self.min_lr > self.lr:
            raise InvalidInput(f"TrainConfig.min_lr ({self.min_lr}) must be <= lr ({self.lr})")
        if self.new_embeddings_first_steps < 0:
            raise InvalidInput(
                f"TrainConfig.new_embeddings_first_steps must be >= 0, got {self.new_embeddings_first_steps}"
            )
        if self.new_embeddings_first_steps and not self.init_from:
            raise InvalidInput(
                "TrainConfig.new_embeddings_first_steps needs --init-from a folder made by `prodip tokenizer extend`"
            )
        if self.checkpoint_every_s < 0:
            raise InvalidInput(f"TrainConfig.checkpoint_every_s must be >= 0, got {self.checkpoint_every_s}")
        if self.warmup_steps >= self.steps:
            log.warning(
                "TrainConfig.warmup_steps (%d) >= steps (%d): the learning rate never reaches lr",
                self.warmup_steps,
                self.steps,
            )


@dataclass(frozen=True)
class EvalConfig:
    """Run config of ``prodip eval`` (TOML table ``[eval]``)."""

    checkpoint: str = opt("", "checkpoint to score: a step dir, a checkpoints dir or a run dir (follows `latest`)")
    shards_dir: str = opt("", "shards dir from `prodip data prepare`; its val split is scored (empty: MC only)")
    out: Optional[str] = opt(None, "output JSON path (default: RUN_DIR/eval.json next to the checkpoints dir)")
    eval_tokens: int = opt(65536, "validation token budget per language (tokens scored)")
    seq_len: int = opt(
        0, "tokens scored per window (context length); 0 = the checkpoint's max_position_embeddings, the most allowed"
    )
    batch_size: int = opt(8, "windows per forward pass (sequences)")
    seed: int = opt(0, "seed of the random-initialised twin (reset_parameters(seed=...))")
    mc_file: Optional[str] = opt(None, "multiple-choice JSONL {context, choices, answer} to score (optional)")
    languages: list[str] = opt(
        help="languages to score (default: every language in the shards' meta.json that has validation tokens)",
        factory=list,
    )
    device: str = opt("cpu", "torch device: cpu, cuda, cuda:N or auto (cuda when available)")
    baseline: str = opt(
        "",
        "a second model scored beside the checkpoint, as `baseline`: a prodip checkpoint or a Hugging Face folder; "
        "with the checkpoint's tokenizer on the same tokens, with another (the base before its vocabulary was "
        "extended) on the same text, compared in bits/char",
    )
    tasks: list[str] = opt(
        help="lm-evaluation-harness tasks to score (multiple choice, perplexity; generation tasks through the chat "
        "template, on a chat checkpoint only), e.g. prodip_tatoeba_en2bn,prodip_tatoeba_bn2en,prodip_hellaswag_en, "
        "prodip_tatoeba_chat_en2bn (bundled, offline: train/tasks/) or a harness task such as belebele_ben_Beng "
        "(downloads its data; docs/eval.md)",
        factory=list,
    )
    task_paths: list[str] = opt(help="more folders of lm-eval task YAML (--include_path)", factory=list)
    num_fewshot: Optional[int] = opt(None, "examples in each task prompt (default: the task's own, 0 for the bundled)")
    task_limit: int = opt(0, "score only the first N items of each task (items; 0 = all)")
    task_threads: int = opt(
        1, "torch CPU threads while scoring tasks (0 = torch's default; 1: many small forwards, see lmeval.run_tasks)"
    )

    def __post_init__(self) -> None:
        # Required-ness of checkpoint/shards_dir is checked in evaluate(): prodip.base.config.resolve
        # builds the file-only config before flags are merged in.
        for name in ("eval_tokens", "batch_size"):
            if getattr(self, name) <= 0:
                raise InvalidInput(f"EvalConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.seq_len < 0:
            raise InvalidInput(f"EvalConfig.seq_len must be >= 0 (0 = the model's context window), got {self.seq_len}")
        check_threads("EvalConfig.task_threads", self.task_threads)
        if self.task_limit < 0 or (self.num_fewshot is not None and self.num_fewshot < 0):
            raise InvalidInput(
                f"EvalConfig.task_limit and num_fewshot must be >= 0, got {self.task_limit} and {self.num_fewshot}"
            )


@dataclass(frozen=True)
class SFTConfig(SourceOptions):
    """One chat fine-tuning run (TOML table ``[sft]``). A step is one optimizer step."""

    inputs: dict[str, list[str]] = opt(
        factory=dict,
        help="language -> conversation files/folders (.jsonl, .parquet, .csv, `datasets` folders; one "
        "conversation per record, field `messages`: OpenAI's [{role, content}, ...]); the language is the "
        "one the replies are in (for the per-language held-out loss), e.g. bn=data/chat/bn.jsonl",
    )
    messages_field: str = opt("messages", "the JSONL field / column holding a conversation's messages")
    init_from: str = opt(
        "runs/demo/train",
        "weights to fine-tune: a prodip run/checkpoint dir or a Hugging Face Llama folder (safetensors) "
        "with a tokenizer in prodip's special-token convention",
    )
    tokenizer_dir: str = opt(
        "", "tokenizer of --init-from (default: the checkpoint's tokenizer/ copy, or the HF folder's files)"
    )
    out_dir: str = opt("runs/demo/sft", "run dir: tokenizer/, config.toml, metrics.jsonl, sft_eval.json, checkpoints/")
    val_fraction: float = opt(
        0.1, "share of conversations held out (chosen by a hash of each) for the loss before/after"
    )
    replay_share: float = opt(
        0.0,
        "share of each step's rows that are pretraining windows (trained on every token) from "
        "--replay-shards-dir's train split, to forget less; 0 = chat rows only",
    )
    replay_shards_dir: str = opt(
        "", "token shards replayed (default: the shards --init-from's prodip run trained on, from its checkpoint)"
    )
    steps: int = opt(100, "optimizer steps")
    max_steps_this_run: int = opt(0, "stop after this many steps in this invocation, 0 = run to `steps`")
    batch_size: int = opt(8, "packed rows per micro-batch per rank")
    seq_len: int = opt(256, "positions per packed row (a longer conversation is cut to seq_len + 1 tokens)")
    grad_accum_steps: int = opt(1, "micro-batches per optimizer step")
    lr: float = opt(1e-4, "peak learning rate (after warmup)")
    min_lr: float = opt(1e-5, "learning rate at the end of the decay")
    warmup_steps: int = opt(10, "linear warmup (optimizer steps)")
    lr_schedule: str = opt("cosine", "cosine | wsd (see prodip train)", choices=SCHEDULES)
    weight_decay: float = opt(0.0, "AdamW decoupled weight decay on 2-D weights")
    grad_clip: float = opt(1.0, "clip the global gradient L2 norm to this, 0 = no clipping")
    seed: int = opt(1234, "seed for the conversation order")
    checkpoint_every_steps: int = opt(0, "save every N steps (and at the end), 0 = end only")
    checkpoint_every_s: float = opt(
        0.0, "also save when this many seconds of wall time have passed since the last save (rank 0's clock), 0 = off"
    )
    keep_last: int = opt(2, "checkpoints kept (newest)")
    eval_every_steps: int = opt(0, "held-out assistant-token loss every N steps in metrics.jsonl, 0 = never")
    device: str = opt("auto", "auto | cpu | cuda", choices=("auto", "cpu", "cuda"))
    dtype: str = opt("auto", "auto | float32 | bfloat16", choices=("auto", "float32", "bfloat16"))
    guards: bool = opt(True, "run the gradient-flow arbiter and update-flow probe (the loss-mask guard always runs)")
    resume: bool = opt(False, "continue from OUT_DIR/checkpoints/latest")
    progress: bool = opt(True, "show a progress bar")

    def __post_init__(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            raise InvalidInput(f"SFTConfig.val_fraction must be in [0, 1), got {self.val_fraction}")
        if not 0.0 <= self.replay_share < 1.0:
            raise InvalidInput(
                f"SFTConfig.replay_share ([sft] replay_share) must be in [0, 1), got {self.replay_share}"
            )

    def train_config(self) -> TrainConfig:
        """The trainer's settings for this run (the chat tokenizer is ``OUT_DIR/tokenizer``)."""
        keep = {f.name for f in dataclasses.fields(TrainConfig)} & {f.name for f in dataclasses.fields(self)}
        values = {k: getattr(self, k) for k in keep if k not in ("tokenizer_dir",)}
        return TrainConfig(
            **values,
            shards_dir="",
            tokenizer_dir=str(Path(self.out_dir) / "tokenizer"),
            mixture={},
        )
