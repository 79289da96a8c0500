"""ExecuTorch programs (``.pte``, XNNPACK) of the training model with a static KV cache.

:class:`StaticCacheDecoder` wraps the training model itself, unchanged: per layer a key and a value
buffer (1, Hkv, S, Dh) with S = ``max_position_embeddings`` (or a shorter window, ``[export] pte_max_seq_len``:
ExecuTorch plans working memory for a whole-S prompt) hold the cache; each call passes the whole
buffer as the model's ``past_key_values`` with an attention mask that admits only the slots already
written (positions ``< input_pos``), then writes the new keys and values at ``input_pos + arange(T)``
(``index_copy_``, an in-place buffer mutation ExecuTorch keeps between calls). So RoPE, GQA and the
attention are the training model's, and conformance checks exactly them.

The program follows ExecuTorch's LLM runner contract (``extension/llm/runner``: text_decoder_runner.cpp,
constants.h; ``examples/models/llama/export_llama_lib.py`` ``_load_llama_model_metadata``):
``forward(tokens (1, T) int64, input_pos (1,) int64) -> logits (1, T, V) float32`` with a dynamic
T in [1, S], and constant methods ``get_bos_id``, ``get_eos_ids``, ``get_max_seq_len``,
``get_max_context_len``, ``get_vocab_size``, ``get_n_layers``, ``use_kv_cache``,
``use_sdpa_with_kv_cache``, ``enable_dynamic_shape``. ``pte-8da4w`` quantises every Linear with
torchao's ``Int8DynamicActivationIntxWeightConfig`` (int4 weights per group, int8 dynamic
activations): ExecuTorch's ``--qmode 8da4w`` (examples/models/llama/source_transformation/quantize.py),
which XNNPACK runs as dynamically quantised linears.

    python -m prodip.export export CKPT --out OUT --variants pte-fp32,pte-8da4w
"""

from __future__ import annotations

import copy
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prodip.base.errors import InvalidInput
from prodip.tokenizer.portable import write_target_files

logger = logging.getLogger(__name__)

#: ExecuTorch's LLM runner metadata keys (extension/llm/runner/constants.h).
METADATA_KEYS = (
    "get_bos_id",
    "get_eos_ids",
    "get_max_seq_len",
    "get_max_context_len",
    "get_vocab_size",
    "get_n_layers",
    "use_kv_cache",
    "use_sdpa_with_kv_cache",
    "enable_dynamic_shape",
)


class StaticCacheDecoder(nn.Module):
    """``forward(tokens (1, T) int64, input_pos (1,) int64) -> logits (1, T, V) float32``.

    Args:
        model: ``prodip.train.model.LlamaForCausalLM`` (float32, eval; used as is).
        max_seq_len: S, cache slots per layer (tokens); positions must stay below it.
    """

    def __init__(self, model: nn.Module, max_seq_len: int) -> None:
        super().__init__()
        self.model = model
        c = model.config
        self.max_seq_len, self.num_layers = max_seq_len, c.num_hidden_layers
        shape = (1, c.num_key_value_heads, max_seq_len, c.head_dim)
        for i in range(self.num_layers):
            self.register_buffer(f"k_cache_{i}", torch.zeros(shape))
            self.register_buffer(f"v_cache_{i}", torch.zeros(shape))

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        T, S = tokens.shape[1], self.max_seq_len
        new_pos = input_pos[0] + torch.arange(T, device=tokens.device)  # (T,) absolute positions
        written = (torch.arange(S, device=tokens.device) < input_pos[0]).to(torch.int64)  # (S,) filled slots
        mask = torch.cat([written, torch.ones(T, dtype=torch.int64, device=tokens.device)])[None]  # (1, S+T)
        cache = [(getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")) for i in range(self.num_layers)]
        logits, present = self.model(
            tokens, position_ids=new_pos[None], attention_mask=mask, past_key_values=cache, use_cache=True
        )
        for i, (k, v) in enumerate(present):  # present: (1, Hkv, S+T, Dh); the new T follow the S slots
            getattr(self, f"k_cache_{i}").index_copy_(2, new_pos, k.narrow(2, S, T))
            getattr(self, f"v_cache_{i}").index_copy_(2, new_pos, v.narrow(2, S, T))
        return logits


#: The most working memory (bytes) a ``.pte``'s memory plan may ask for: ExecuTorch allocates the whole plan
#: when it loads the program, on a phone beside the app (Android and iOS let one app hold a few GiB at most), and
#: conformance loads the program on the exporting machine. SmolLM2's 8192-token window at hidden 64 plans 7 GiB
#: (refused: a run of conformance on it reached 23 GB resident), 1024 tokens ~0.1 GiB; Llama 3.2's 131072, 1.8 TB.
PLANNED_MEMORY_LIMIT = 4 * 2**30
#: float32 (1, H, T, S + T) tensors the lowered program holds at once in each attention: SDPA with a boolean mask
#: decomposes (ExecuTorch 1.5, XNNPACK) into scores, a softmax and a ``where`` over fully masked rows whose two
#: inputs and output are live together (the memory plan of a 1-layer model at S = 256 shows the three overlapping).
ATTENTION_SCORE_TENSORS = 3


def planned_memory_floor(config: Any, max_seq_len: int = 0) -> int:
    """Bytes of working memory a ``.pte``'s memory plan holds at least, known from the config alone.

    ExecuTorch sizes the plan for the longest prompt, T = S tokens, so one attention's
    :data:`ATTENTION_SCORE_TENSORS` score tensors take ``3 * H * S * 2S * 4`` bytes. The plan of the lowered
    program is larger (activations, the KV caches, packing: :data:`PLAN_OVER_FLOOR`); so a window this refuses
    is never one the exported program's plan would allow, and :func:`export_pte` still checks the real plan.

    Args:
        config: the model config (``num_attention_heads`` H, ``max_position_embeddings``).
        max_seq_len: S, the program's window (tokens); 0 = ``max_position_embeddings``.
    """
    S = max_seq_len or config.max_position_embeddings
    return ATTENTION_SCORE_TENSORS * config.num_attention_heads * S * 2 * S * 4


#: How far the lowered program's plan may exceed :func:`planned_memory_floor` (ExecuTorch 1.5, XNNPACK): measured on
#: the hidden-64 stand-ins of Llama 3.2 and SmolLM2, fp32 and 8da4w alike, 1.26x at S = 256, 1.19x at 1024 and
#: 1.17x from 6144 up (4.7 GiB at 6688, 1792.3 GiB at 131072), and 1.06x for one layer of Llama 3.2 1B's widths
#: (hidden 2048, 32 heads, vocabulary 128256) at S = 1856: activations and KV caches, linear in S, beside the S^2
#: scores, weigh most in a short window. 1.6 leaves a margin over the worst; a model whose KV caches are larger
#: still (many layers of full multi-head attention) can exceed it, and the check after the lowering
#: (:func:`export_pte`) then advises from the real plan.
PLAN_OVER_FLOOR = 1.6
#: Advised windows are multiples of this many tokens: a round number to type, and rounding down only shrinks the
#: plan, so an advised window still fits (the program itself takes any window).
WINDOW_STEP = 64


def longest_window(config: Any, planned: int = 0, max_seq_len: int = 0) -> int:
    """The longest window (tokens, a multiple of :data:`WINDOW_STEP`) whose plan fits :data:`PLANNED_MEMORY_LIMIT`.

    Before the lowering (``planned`` = 0) only the config is known: the largest N with
    ``planned_memory_floor(N) * PLAN_OVER_FLOOR`` within the limit. After it, the real plan P of the window
    S = ``max_seq_len`` (0 = ``max_position_embeddings``) is known: its part over the floor ``k * S^2`` (the
    attention scores) is taken as linear in S (activations, the KV caches), ``e = (P - k * S^2) / S`` bytes per
    token, and N solves ``k * N^2 + e * N = limit``. Scaling P as S^2 alone (``S * sqrt(limit / P)``) would
    shrink the linear part too much and advise a window whose plan is over the limit; a part that grows faster
    than S makes this estimate larger than the real plan, so N errs short.

    Args:
        config: the model config (``num_attention_heads``, ``max_position_embeddings``).
        planned: bytes the lowered program of window S plans (``non_const_buffer_sizes``); 0 = not lowered yet.
        max_seq_len: S, the window ``planned`` was measured for; 0 = ``max_position_embeddings``.
    Returns:
        N >= 0, under S when ``planned`` is over the limit (the window just refused is never advised); below
        :data:`WINDOW_STEP` not rounded, 0 when not even one token fits.
    """
    k = planned_memory_floor(config, 1)  # the floor is k * S^2 bytes
    limit = PLANNED_MEMORY_LIMIT
    if not planned:
        n = math.isqrt(int(limit / (k * PLAN_OVER_FLOOR)))
    else:
        S = max_seq_len or config.max_position_embeddings
        e = max(planned - k * S * S, 0) / S
        n = int((math.sqrt(e * e + 4 * k * limit) - e) / (2 * k))  # the positive root of k N^2 + e N = limit
        if planned > limit:
            n = min(n, S - 1)  # float rounding must not hand back the window just refused
    return n - n % WINDOW_STEP if n >= WINDOW_STEP else n


def _plan_too_large(variant: str, planned: int, config: Any, max_seq_len: int, *, floor: bool) -> InvalidInput:
    """The one-line refusal of a plan over :data:`PLANNED_MEMORY_LIMIT` (``floor``: the config's estimate, else the
    lowered program's plan), advising :func:`longest_window`."""
    S = max_seq_len or config.max_position_embeddings
    longest = longest_window(config, 0 if floor else planned, S)
    why = (
        f"allowing {PLAN_OVER_FLOOR}x these scores for the whole plan"
        if floor
        else "the scores grow as S^2, the rest of this plan as S"
    )
    return InvalidInput(
        f"{variant}: the program would plan {'at least ' if floor else ''}{planned / 2**30:.1f} GiB of working "
        f"memory for a window of {S} tokens ({'pte_max_seq_len' if max_seq_len else 'max_position_embeddings'} = "
        f"{S}; ExecuTorch sizes its buffers for a whole-window prompt, attention scores S x 2S per head), over the "
        f"{PLANNED_MEMORY_LIMIT / 2**30:.0f} GiB a device runtime can allocate; export the .pte with a shorter "
        f"window: --pte-max-seq-len N ([export] pte_max_seq_len), N at most {longest} for "
        f"{config.num_attention_heads} attention heads ({why})"
    )


def runner_metadata(config: Any, *, bos_id: int, eos_ids: list[int], max_seq_len: int = 0) -> dict[str, Any]:
    """The constant methods ExecuTorch's LLM runners read (names: :data:`METADATA_KEYS`); ``max_seq_len``: the
    program's window (tokens), 0 = ``max_position_embeddings``."""
    S = max_seq_len or config.max_position_embeddings
    return {
        "get_bos_id": bos_id,
        "get_eos_ids": list(eos_ids),
        "get_max_seq_len": S,
        "get_max_context_len": S,
        "get_vocab_size": config.vocab_size,
        "get_n_layers": config.num_hidden_layers,
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": False,
        "enable_dynamic_shape": True,
    }


def check_representable(config: Any, variant: str, group_size: int, max_seq_len: int = 0) -> None:
    """Refuse, before anything is written, a model the variant cannot hold.

    Raises:
        InvalidInput: a ``max_seq_len`` (``pte_max_seq_len``) beyond ``max_position_embeddings``; a window
            whose memory plan is over :data:`PLANNED_MEMORY_LIMIT` by :func:`planned_memory_floor` already;
            pte-8da4w with a Linear input size (hidden_size, intermediate_size,
            heads * head_dim) that ``group_size`` does not divide (the Linear would stay float32).
    """
    if max_seq_len > config.max_position_embeddings:
        raise InvalidInput(
            f"{variant}: pte_max_seq_len = {max_seq_len} exceeds the model's max_position_embeddings = "
            f"{config.max_position_embeddings}; the window can only be shorter"
        )
    floor = planned_memory_floor(config, max_seq_len)
    if floor > PLANNED_MEMORY_LIMIT:
        raise _plan_too_large(variant, floor, config, max_seq_len, floor=True)
    if variant != "pte-8da4w":
        return
    rows = {
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads * head_dim": config.num_attention_heads * config.head_dim,
    }
    bad = {k: v for k, v in rows.items() if v % group_size}
    if bad:
        raise InvalidInput(
            f"pte-8da4w: int4 weight groups of {group_size} must divide every Linear's input size, but "
            + ", ".join(f"{k} = {v}" for k, v in bad.items())
            + " is not a multiple; pass --pte-group-size with a power of 2 that divides them"
        )


#: loggers that warn, harmlessly, while ExecuTorch (and the torchao it imports) load on a CPU-only install: torchao
#: tries its CUDA kernels and logs "Failed to load .../_C_mxfp8...so" / "_C_cutlass_90a.abi3.so" for each, and torch's
#: pytree logs a deprecation of torchao's Enum registration. Raised to ERROR before those imports.
QUIET_ON_IMPORT = ("torchao", "torch.utils._pytree")


def quiet_optional_imports() -> None:
    """Silence :data:`QUIET_ON_IMPORT` below ERROR (call before importing executorch or torchao)."""
    for name in QUIET_ON_IMPORT:
        logging.getLogger(name).setLevel(logging.ERROR)


def _quantize_8da4w(model: nn.Module, group_size: int) -> None:
    quiet_optional_imports()
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_  # noqa: PLC0415 (optional)
    from torchao.quantization.granularity import PerGroup  # noqa: PLC0415 (optional: executorch's torchao)

    config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group_size))
    quantize_(model, config, filter_fn=lambda m, fqn: isinstance(m, nn.Linear))


def export_pte(
    model: nn.Module,
    path: Path,
    variant: str,
    *,
    bos_id: int,
    eos_ids: list[int],
    group_size: int = 32,
    max_seq_len: int = 0,
    metadata_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Lower the training model to an ExecuTorch program for XNNPACK and write it to ``path``.

    Args:
        model: the training model (copied to float32 and put in eval mode; not modified).
        path: destination ``.pte``.
        variant: ``pte-fp32`` or ``pte-8da4w``.
        bos_id, eos_ids: the runner's BOS and end-of-generation ids.
        group_size: int4 weights per group (pte-8da4w).
        max_seq_len: S, the KV-cache window (tokens); 0 = ``max_position_embeddings``.
        metadata_overrides: replace runner metadata values (planted faults only).
    Returns:
        The manifest ``quantization`` entry: scheme, group size, metadata, tool versions.
    Raises:
        InvalidInput: see :func:`check_representable`.
    """
    quiet_optional_imports()
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (  # noqa: PLC0415 (optional)
        XnnpackPartitioner,
    )
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower  # noqa: PLC0415 (optional)

    check_representable(model.config, variant, group_size, max_seq_len)
    t0 = time.perf_counter()
    model = copy.deepcopy(model).float().eval()
    if variant == "pte-8da4w":
        _quantize_8da4w(model, group_size)
    S = int(max_seq_len or model.config.max_position_embeddings)
    decoder = StaticCacheDecoder(model, S).eval()
    example = (torch.tensor([[1, 2, 3]], dtype=torch.int64), torch.tensor([0], dtype=torch.int64))
    # Dim.DYNAMIC, not a named Dim: torch.export cannot prove a harmless Min(...) guard from the
    # repeat_interleave of GQA over S + T keys and would reject a strict named range.
    seq = torch.export.Dim.DYNAMIC(min=1, max=S)
    with torch.no_grad():
        program = torch.export.export(decoder, example, dynamic_shapes=({1: seq}, None), strict=False)
    meta = {
        **runner_metadata(model.config, bos_id=bos_id, eos_ids=eos_ids, max_seq_len=S),
        **(metadata_overrides or {}),
    }
    edge = to_edge_transform_and_lower(
        program,
        partitioner=[XnnpackPartitioner()],
        constant_methods=meta,
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
    )
    et = edge.to_executorch()
    planned = max(sum(plan.non_const_buffer_sizes) for plan in et.executorch_program.execution_plan)
    if planned > PLANNED_MEMORY_LIMIT:
        # the memory plan is sized for the longest prompt, a whole window: attention over S x 2S scores; the
        # config's floor (check_representable) let this window through, the activations around it did not
        raise _plan_too_large(variant, planned, model.config, max_seq_len, floor=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        et.write_to_file(f)
    logger.info("%s: %s in %.1f s", variant, path, time.perf_counter() - t0)
    quant = {"scheme": "8da4w", "group_size": group_size, "quantizer": "torchao Int8DynamicActivationIntxWeightConfig"}
    return {
        **(quant if variant == "pte-8da4w" else {"scheme": None}),
        "backend": "xnnpack",
        "runner_metadata": meta,
        "executorch_version": _version("executorch"),
        "torchao_version": _version("torchao"),
    }


def write_tokenizer(tokenizer_dir: Path, out_dir: Path) -> Path:
    """The tokenizer files ExecuTorch's ``HFTokenizer`` reads, beside the program; returns ``tokenizer.json``.

    ``prodip.tokenizer.portable.write_target_files`` writes them: ``tokenizer.json`` without its NFC
    normaliser (HFTokenizer's NFC step breaks precomposed characters; the app NFC-normalises).

    Raises:
        InvalidInput: ExecuTorch's tokenizer cannot reproduce this tokenizer (named why).
    """
    write_target_files(tokenizer_dir, out_dir, "executorch")
    return out_dir / "tokenizer.json"


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 (only for the manifest)

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


__all__ = [
    "StaticCacheDecoder",
    "export_pte",
    "runner_metadata",
    "check_representable",
    "longest_window",
    "planned_memory_floor",
    "METADATA_KEYS",
]
