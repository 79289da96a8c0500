"""GGUF files for llama.cpp: the training model's weights under llama.cpp's ``llama`` architecture.

Written with the ``gguf`` package (gguf-py, the library llama.cpp maintains), following llama.cpp's own
converter for ``LlamaForCausalLM`` (``convert_hf_to_gguf.py``; ``conversion/llama.py`` and
``conversion/base.py`` in llama.cpp v0.5.0 as bundled by node-llama-cpp 3.22.1):

- hyper-parameters as ``llama.*`` keys (context length, embedding/FFN length, blocks, heads, KV heads,
  ``rope.freq_base`` = ``rope_theta``, ``rope.dimension_count`` = ``head_dim``, RMSNorm epsilon);
- tensor names from gguf-py's HF->GGUF map (``model.layers.{i}.self_attn.q_proj.weight`` ->
  ``blk.{i}.attn_q.weight`` ...); a tied ``lm_head`` is left out (llama.cpp then reuses ``token_embd``);
- q/k rows permuted exactly as ``LlamaModel.permute`` does: GGUF's llama architecture applies RoPE to
  adjacent pairs (GGML's "normal" mode), prodip (like HF) rotates halves;
- 1-D tensors (norms) stay float32; 2-D weights are float16 (``gguf-f16``) or Q8_0 (``gguf-q8_0``) via
  ``gguf.quants.quantize``; ``gguf-q4_k_m`` is llama.cpp's own ``llama_model_quantize`` (ftype Q4_K_M)
  run on a float32 GGUF, from the prebuilt llama.cpp library node-llama-cpp ships (gguf-py has no Q4_K
  quantiser). Where a row length is not a multiple of 256 llama.cpp itself falls back (Q4_K -> Q5_0,
  Q6_K -> Q8_0); the manifest records the resulting tensor types.
- Llama 3.1's ``llama3`` RoPE scaling as the ``rope_freqs.weight`` tensor (per-frequency divisors,
  :func:`prodip.train.model.rope_factors`), as the converter writes it; llama.cpp has no llama3 rope type;
- a chat model's template as ``tokenizer.chat_template`` and its ``<|im_end|>`` as ``tokenizer.ggml.eot_token_id``
  (llama.cpp's end-of-generation set is then {<|im_end|>, <|eos|>}; it still logs "special_eos_id is not in
  special_eog_ids" because ``<|eos|>`` is not a text it knows, and adds it to that set itself);
- the tokenizer's keys (``tokenizer.ggml.*``: gpt2 BPE, tokens, merges, types, pre-tokenizer type,
  BOS/EOS/PAD ids, add-BOS) from :mod:`prodip.tokenizer.gguf`; a token list shorter than the embedding
  matrix is padded with unused tokens (llama.cpp refuses a shorter list). Only a tokenizer llama.cpp
  reproduces (:func:`prodip.tokenizer.portable.require_portable`) is written.

    python -m prodip.export export CKPT --out OUT --variants gguf-f16,gguf-q8_0,gguf-q4_k_m
"""

from __future__ import annotations

import ctypes
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from prodip.base.chat import chat_contract
from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.manifest import Card
from prodip.export.card import add_gguf_metadata
from prodip.tokenizer.gguf import add_tokenizer_metadata
from prodip.tokenizer.portable import RECOGNISED, pretokenizer_name, read_tokenizer_json, require_portable
from prodip.train.model import rope_factors

#: llama.cpp block sizes (ggml-common.h QK8_0 and QK_K).
Q8_0_BLOCK, QK_K = 32, 256
#: llama_ftype of Q4_K_M (llama.h ``LLAMA_FTYPE_MOSTLY_Q4_K_M``).
LLAMA_FTYPE_MOSTLY_Q4_K_M = 15
#: node-llama-cpp's prebuilt CPU llama.cpp (its platform package); override with PRODIP_LLAMA_CPP_LIB_DIR.
NODE_DIR = Path(os.environ.get("PRODIP_NODE_DIR", Path(__file__).resolve().parents[1] / "node"))
LIB_SUBDIR = "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"


def permute_qk(w: torch.Tensor, n_head: int, n_head_kv: int | None = None) -> torch.Tensor:
    """Rows of a q or k projection from rotate-half to GGUF llama's pairwise RoPE layout.

    Exactly llama.cpp's ``LlamaModel.permute`` (conversion/llama.py): for k, ``n_head_kv`` heads.

    Args:
        w: (heads * Dh, D) weight.
        n_head: attention heads; n_head_kv: KV heads (used when it differs from ``n_head``).
    Returns:
        (heads * Dh, D), per head the rows ``[0, Dh/2, 1, Dh/2 + 1, ...]`` of the input.
    """
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_representable(config: Any, variant: str, tokenizer_tokens: int | None = None) -> None:
    """Refuse, before anything is written, a model llama.cpp or the variant's type cannot hold.

    Args:
        config: the ``ModelConfig``.
        variant: ``gguf-f16``, ``gguf-q8_0`` or ``gguf-q4_k_m``.
        tokenizer_tokens: tokens in the tokenizer (None = not checked).
    Raises:
        InvalidInput: naming the target and the limit: an odd head_dim (RoPE pairs), a tokenizer larger
            than the embedding, row lengths (hidden_size, intermediate_size, heads * head_dim) not a
            multiple of Q8_0's block of 32, or a hidden_size not a multiple of Q4_K's super-block of 256.
    """
    if config.head_dim % 2:
        raise InvalidInput(f"{variant}: head_dim {config.head_dim} is odd; llama.cpp's RoPE rotates pairs")
    if tokenizer_tokens is not None and tokenizer_tokens > config.vocab_size:
        raise InvalidInput(
            f"{variant}: the tokenizer has {tokenizer_tokens} tokens but the embedding only "
            f"{config.vocab_size} rows; llama.cpp needs a row per token"
        )
    rows = {
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads * head_dim": config.num_attention_heads * config.head_dim,
    }
    if variant == "gguf-q8_0":
        bad = {k: v for k, v in rows.items() if v % Q8_0_BLOCK}
        if bad:
            raise InvalidInput(
                f"gguf-q8_0: Q8_0 quantises rows in blocks of {Q8_0_BLOCK} values, but "
                + ", ".join(f"{k} = {v}" for k, v in bad.items())
                + f" is not a multiple of {Q8_0_BLOCK}; export gguf-f16 instead"
            )
    if variant == "gguf-q4_k_m" and config.hidden_size % QK_K:
        raise InvalidInput(
            f"gguf-q4_k_m: Q4_K quantises rows in super-blocks of {QK_K} values, but hidden_size = "
            f"{config.hidden_size} is not a multiple of {QK_K} (llama.cpp would fall back to other types for "
            "almost every tensor); export gguf-q8_0 instead"
        )


def check_tokenizer(tokenizer_dir: Path) -> str:
    """The llama.cpp pre-tokenizer type of a tokenizer llama.cpp reproduces id for id; refuses any other.

    Raises:
        InvalidInput: the tokenizer is not portable to llama.cpp (``prodip.tokenizer.portable.require_portable``
            names why: not byte-level BPE, or a pre-tokenizer pattern none of llama.cpp's built-in types has).
    """
    require_portable(tokenizer_dir, "llama.cpp")
    return RECOGNISED[pretokenizer_name(read_tokenizer_json(tokenizer_dir))].llama_cpp_pre


def tokenizer_size(tokenizer_dir: Path) -> int:
    """Number of token ids in ``tokenizer.json`` (vocab plus added tokens)."""
    tj = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    ids = set(tj["model"]["vocab"].values()) | {a["id"] for a in tj.get("added_tokens", [])}
    return max(ids) + 1


def write_gguf(
    model: Any,
    tokenizer_dir: Path,
    path: str | os.PathLike,
    qtype_name: str,
    *,
    permute: bool = True,
    card: Card | None = None,
) -> dict[str, Any]:
    """Write one GGUF file of ``model`` with plain gguf-py types (F32, F16 or Q8_0 for 2-D weights).

    Args:
        model: ``prodip.train.model.LlamaForCausalLM`` (any dtype; weights are read as float32).
        tokenizer_dir: folder with ``tokenizer.json``.
        path: destination ``.gguf`` (written directly; the caller's export folder is temporary).
        qtype_name: ``"F32"``, ``"F16"`` or ``"Q8_0"`` (gguf.GGMLQuantizationType names).
        permute: apply :func:`permute_qk` (False only to plant a fault).
        card: the export's card facts (``prodip.export.card.build_card``): licence, languages, datasets, tags.
    Returns:
        ``{"tensor_types": {type: count}, "pre": llama.cpp pre-tokenizer type, "tokens": token list length}``.
    Raises:
        InvalidInput: the tokenizer cannot be written (see :func:`_add_tokenizer`).
    """
    import gguf  # noqa: PLC0415 (optional: pip extra runtimes)

    cfg = model.config
    qtype = gguf.GGMLQuantizationType[qtype_name]
    ftype = {
        "F32": gguf.LlamaFileType.ALL_F32,
        "F16": gguf.LlamaFileType.MOSTLY_F16,
        "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    w.add_name("prodip")
    if card is not None:
        add_gguf_metadata(w, card, model)
    w.add_vocab_size(cfg.vocab_size)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_theta))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_rope_dimension_count(cfg.head_dim)
    if cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    w.add_file_type(ftype[qtype_name])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tok = add_tokenizer_metadata(w, Path(tokenizer_dir), vocab_size=cfg.vocab_size)
    chat = chat_contract(tokenizer_dir)
    if chat is not None:
        # llama.cpp renders this template (llama_chat_apply_template / --jinja) and ends generation at
        # eot; it also knows <|im_end|> as end-of-generation by its text
        w.add_chat_template(chat["chat_template"])
        w.add_eot_token_id(chat["end_of_turn_id"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    types: Counter = Counter()
    for name, t in model.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue  # llama.cpp uses token_embd.weight when output.weight is absent
        t = t.detach().float().cpu()
        if permute and name.endswith("self_attn.q_proj.weight"):
            t = permute_qk(t, cfg.num_attention_heads, cfg.num_attention_heads)
        elif permute and name.endswith("self_attn.k_proj.weight"):
            t = permute_qk(t, cfg.num_attention_heads, cfg.num_key_value_heads)
        new = names.get_name(name, try_suffixes=(".weight",))
        assert new is not None, name
        data = t.numpy()
        q = gguf.GGMLQuantizationType.F32 if data.ndim <= 1 or new.endswith("_norm.weight") else qtype
        w.add_tensor(new, gguf.quants.quantize(data, q), raw_dtype=q)
        types[q.name] += 1
    if cfg.rope_scaling:
        # llama.cpp has no llama3 rope type: it divides each RoPE frequency by this tensor, as
        # convert_hf_to_gguf.py writes it for Llama 3.1+ (LlamaModel.generate_extra_tensors)
        factors = rope_factors(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling).numpy()
        w.add_tensor(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", factors)
        types["F32"] += 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"tensor_types": dict(types), "pre": tok.get("pre"), "tokens": len(tok.get("tokens", []))}


def llama_cpp_lib_dir() -> Path:
    """The folder of node-llama-cpp's prebuilt CPU llama.cpp libraries (``libllama*.so``).

    Raises:
        MissingInput: not installed (names the npm command).
    """
    d = Path(os.environ.get("PRODIP_LLAMA_CPP_LIB_DIR") or NODE_DIR / LIB_SUBDIR)
    if not any(d.glob("libllama*.so")):
        raise MissingInput(
            f"{d}: no llama.cpp library; gguf-q4_k_m is quantised by llama.cpp's own llama_model_quantize. "
            "Install it with: npm install --ignore-scripts --prefix node (node-llama-cpp's prebuilt CPU build)"
        )
    return d


class _QuantizeParams(ctypes.Structure):
    """``struct llama_model_quantize_params`` of llama.h (llama.cpp v0.5.0); the layout must match the library."""

    _fields_ = [
        ("nthread", ctypes.c_int32),
        ("ftype", ctypes.c_int32),
        ("output_tensor_type", ctypes.c_int32),
        ("token_embedding_type", ctypes.c_int32),
        ("allow_requantize", ctypes.c_bool),
        ("quantize_output_tensor", ctypes.c_bool),
        ("only_copy", ctypes.c_bool),
        ("pure", ctypes.c_bool),
        ("keep_split", ctypes.c_bool),
        ("dry_run", ctypes.c_bool),
        ("imatrix", ctypes.c_void_p),
        ("kv_overrides", ctypes.c_void_p),
        ("tt_overrides", ctypes.c_void_p),
        ("prune_layers", ctypes.c_void_p),
        ("max_buf_size", ctypes.c_size_t),
    ]


#: ``ggml_log_callback`` (ggml.h: level, text, user data) that drops llama.cpp's log lines.
_SILENT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(lambda level, text, data: None)


def llama_quantize(src: Path, dst: Path, ftype: int = LLAMA_FTYPE_MOSTLY_Q4_K_M, threads: int = 1) -> None:
    """Run llama.cpp's ``llama_model_quantize`` (what ``llama-quantize`` calls) on a GGUF file.

    Raises:
        MissingInput: no llama.cpp library (see :func:`llama_cpp_lib_dir`).
        RuntimeError: llama.cpp returned an error code.
    """
    d = llama_cpp_lib_dir()
    for pattern in ("libggml-base*.so", "libggml.*so"):
        for lib in sorted(d.glob(pattern)):
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(sorted(d.glob("libllama*.so"))[0]))
    lib.llama_model_quantize_default_params.restype = _QuantizeParams
    lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(_QuantizeParams)]
    lib.llama_model_quantize.restype = ctypes.c_uint32
    lib.llama_log_set(_SILENT, None)  # llama.cpp prints a line per tensor to stderr otherwise
    lib.llama_backend_init()
    params = lib.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, threads
    rc = lib.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}, ftype {ftype}) failed with code {rc}")


def tensor_types(path: Path) -> dict[str, int]:
    """GGML type name -> number of tensors of that type in a GGUF file (read with gguf-py)."""
    import gguf  # noqa: PLC0415 (optional: pip extra runtimes)

    return dict(Counter(t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors))


def export_gguf(model: Any, tokenizer_dir: Path, path: Path, variant: str, card: Card | None = None) -> dict[str, Any]:
    """Write the GGUF ``variant`` of ``model`` to ``path``; returns its manifest ``quantization`` entry.

    Raises:
        InvalidInput: the model or tokenizer cannot be represented (see :func:`check_representable`).
        MissingInput: gguf-q4_k_m without llama.cpp's library.
    """
    check_representable(model.config, variant, tokenizer_size(Path(tokenizer_dir)))
    path.parent.mkdir(parents=True, exist_ok=True)
    if variant == "gguf-q4_k_m":
        llama_cpp_lib_dir()  # refuse before the float32 file is written
        f32 = path.with_name(path.name + ".f32.tmp")
        try:
            info = write_gguf(model, tokenizer_dir, f32, "F32", card=card)  # llama.cpp's quantize keeps the keys
            llama_quantize(f32, path)
        finally:
            f32.unlink(missing_ok=True)
        info["tensor_types"] = tensor_types(path)
        info["quantizer"] = "llama.cpp llama_model_quantize (LLAMA_FTYPE_MOSTLY_Q4_K_M)"
    else:
        qtype = {"gguf-f16": "F16", "gguf-q8_0": "Q8_0"}[variant]
        info = write_gguf(model, tokenizer_dir, path, qtype, card=card)
        info["quantizer"] = f"gguf-py gguf.quants.quantize ({qtype})"
    info["gguf_py_version"] = _version("gguf")
    return info


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 (only for the manifest)

    try:
        return version(dist)
    except PackageNotFoundError:
        return None
