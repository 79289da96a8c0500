"""Hugging Face Llama layout: ``config.json``, ``generation_config.json``, ``model.safetensors``
and the tokenizer files, so ``transformers.AutoModelForCausalLM.from_pretrained(dir)`` loads it.

The state-dict keys of ``prodip.train.model.LlamaForCausalLM`` already are the HF keys (no renaming, no
RoPE permutation: the model uses rotate-half RoPE like HF). A tied ``lm_head.weight`` is stored
once, as ``model.embed_tokens.weight``, with ``tie_word_embeddings: true`` in the config: HF
re-ties it on load, and safetensors never sees two tensors sharing memory.

    python -c "from prodip.export.hf import hf_config; from prodip.train.config import ModelConfig; \
print(hf_config(ModelConfig(vocab_size=8192), 'float32'))"
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import load_file, save_file

from prodip.base.chat import CHAT_TEMPLATE_FILE, chat_contract
from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.files import writing
from prodip.base.specials import read_specials
from prodip.tokenizer.portable import tokenizer_config_as_written
from prodip.train.config import ModelConfig, hf_fixed_keys

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
WEIGHTS_FILE = "model.safetensors"
TIED_ALIAS = "lm_head.weight"
#: Tokenizer files copied into the export (HF's names); others in the tokenizer dir are ignored.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def hf_config(config: Any, dtype: str) -> dict[str, Any]:
    """The export's ``config.json``: ModelConfig fields + the fixed HF keys, no renaming.

    Args:
        config: a ``prodip.train.config.ModelConfig``.
        dtype: dtype name of ``model.safetensors`` (``float32``, ``bfloat16``, ``float16``).
    Returns:
        A JSON-able dict with ``architectures`` (``LlamaForCausalLM``, or ``Qwen2ForCausalLM`` for
        ``model_type = "qwen2"``), ``model_type``, ``torch_dtype`` and ``dtype``
        (transformers 4.x reads the former, 5.x the latter), token ids and ``use_cache``.
    """
    out = {**config.to_dict(), **hf_fixed_keys(config.model_type)}
    out.update(torch_dtype=dtype, dtype=dtype, use_cache=True)
    return out


def generation_config(
    config: Any, end_of_turn_id: Optional[int] = None, stop_ids: Sequence[int] = ()
) -> dict[str, Any]:
    """``generation_config.json``: token ids and greedy decoding. No ``max_length``: with it, every
    ``generate(max_new_tokens=...)`` in transformers warns that both are set; a caller gives the length
    (onnxruntime-genai's ``genai_config.json`` takes the trained context as its own ``max_length``).

    Args:
        config: the ``ModelConfig``.
        end_of_turn_id: a chat model's end-of-turn id (``prodip.base.chat.chat_contract``): then
            ``eos_token_id`` is the list ``[eos, end_of_turn]`` (transformers, transformers.js and
            onnxruntime-genai stop at any id of the list); None (a base model): the single eos id.
        stop_ids: further ids that end generation (an imported model's ``generation_config.json``
            list, e.g. Llama 3's ``<|end_of_text|>``, ``<|eom_id|>``), appended without repeats.
    """
    ids = list(
        dict.fromkeys([config.eos_token_id, *([end_of_turn_id] if end_of_turn_id is not None else []), *stop_ids])
    )
    eos = ids[0] if len(ids) == 1 else ids
    return {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": config.pad_token_id,
        "do_sample": False,
    }


def export_state_dict(model: torch.nn.Module, dtype: str) -> dict[str, torch.Tensor]:
    """Tensors to store: HF keys, contiguous CPU tensors in ``dtype``, a tied lm_head dropped.

    Args:
        model: ``prodip.train.model.LlamaForCausalLM``.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
    Returns:
        key -> tensor; ``lm_head.weight`` is absent when ``config.tie_word_embeddings``.
    Raises:
        ValueError: an unknown dtype.
    """
    if dtype not in DTYPES:
        raise InvalidInput(f"safetensors dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    tied = model.config.tie_word_embeddings
    out = {}
    for key, tensor in model.state_dict().items():
        if tied and key == TIED_ALIAS:
            continue
        # .clone() so no two tensors share storage (safetensors refuses shared memory)
        out[key] = tensor.detach().to("cpu", DTYPES[dtype]).contiguous().clone()
    return out


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_hf(
    model: torch.nn.Module,
    out_dir: str | os.PathLike,
    *,
    dtype: str = "float32",
    tokenizer_dir: str | os.PathLike | None = None,
) -> list[Path]:
    """Write the HF-layout files of ``model`` into ``out_dir`` (an existing, private temp dir).

    Args:
        model: ``prodip.train.model.LlamaForCausalLM`` (any parameter dtype).
        out_dir: destination folder (the caller renames it into place when complete).
        dtype: ``model.safetensors`` dtype: ``float32``, ``bfloat16`` or ``float16``.
        tokenizer_dir: folder holding ``tokenizer.json`` (+ ``tokenizer_config.json``,
            ``special_tokens_map.json``); ``None`` writes no tokenizer files.
    A Llama 2-style tokenizer's ``tokenizer_class`` becomes ``PreTrainedTokenizerFast``
    (:func:`prodip.tokenizer.portable.tokenizer_config_as_written`: transformers 5 would rebuild it with
    other ids). A chat model's tokenizer (``prodip.base.chat.chat_contract``) adds ``chat_template.jinja`` (the
    template of its ``tokenizer_config.json``) and its end-of-turn id to ``generation_config.json``.

    Returns:
        Paths written.
    Raises:
        FileNotFoundError: ``tokenizer_dir`` has no ``tokenizer.json``.
        ValueError: an unknown dtype.
        InvalidInput: a chat template other than the contract's, or chat markers missing.
    """
    out = Path(out_dir)
    chat = chat_contract(tokenizer_dir) if tokenizer_dir is not None else None
    written = []
    with writing(out / WEIGHTS_FILE):  # safetensors raises its own SafetensorError for a full disk
        save_file(export_state_dict(model, dtype), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    written.append(out / WEIGHTS_FILE)
    _write_json(out / CONFIG_FILE, hf_config(model.config, dtype))
    stops = read_specials(tokenizer_dir).stop_ids if tokenizer_dir is not None else ()
    _write_json(out / GENERATION_CONFIG_FILE, generation_config(model.config, chat and chat["end_of_turn_id"], stops))
    written += [out / CONFIG_FILE, out / GENERATION_CONFIG_FILE]
    if tokenizer_dir is not None:
        written += copy_tokenizer(tokenizer_dir, out)
        if (out / TOKENIZER_CONFIG_FILE).is_file():
            path = out / TOKENIZER_CONFIG_FILE
            fixed = tokenizer_config_for_model(json.loads(path.read_text(encoding="utf-8")), model.config)
            # a Llama 2-style tokenizer.json runs as written in transformers 5 too (not rebuilt with other ids)
            tok_json = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
            _write_json(path, tokenizer_config_as_written(tok_json, fixed))
    if chat is not None:
        (out / CHAT_TEMPLATE_FILE).write_text(chat["chat_template"], encoding="utf-8")
        written.append(out / CHAT_TEMPLATE_FILE)
    return written


#: The tokenizer's own settings file (copied from the tokenizer dir, then :func:`tokenizer_config_for_model`).
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def tokenizer_config_for_model(tokenizer_config: dict[str, Any], config: Any) -> dict[str, Any]:
    """``tokenizer_config.json`` with the fields ``config.json`` also states set from the model: a copy.

    The tokenizer is trained before any model exists, so its ``model_max_length`` is the tokenizer
    stage's default (2048) whatever the context; transformers and transformers.js truncate and warn by
    it. In an export it is the model's ``max_position_embeddings``, and ``bos/eos/pad_token_id`` are
    the model config's (the same ids by construction; set here so the two files cannot disagree).
    """
    out = dict(tokenizer_config)
    out["model_max_length"] = int(config.max_position_embeddings)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(config, key, None) is not None:
            out[key] = int(getattr(config, key))
    return out


def tokenizer_config_differences(export_dir: str | os.PathLike, config: Any) -> dict[str, list[Any]]:
    """``tokenizer_config.json`` fields of an export that disagree with ``config`` (the checkpoint's
    ModelConfig): ``{"tokenizer_config.json model_max_length": [expected, found], ...}``; empty when
    they agree or the file is absent."""
    path = Path(export_dir) / TOKENIZER_CONFIG_FILE
    if not path.is_file():
        return {}
    found = json.loads(path.read_text(encoding="utf-8"))
    want = tokenizer_config_for_model(found, config)
    return {f"{TOKENIZER_CONFIG_FILE} {k}": [v, found.get(k)] for k, v in want.items() if found.get(k) != v}


def copy_tokenizer(tokenizer_dir: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """Copy the tokenizer files (:data:`TOKENIZER_FILES` that exist) from ``tokenizer_dir``.

    Raises:
        FileNotFoundError: no ``tokenizer.json`` in ``tokenizer_dir`` (made by `prodip tokenizer train`).
    """
    src = Path(tokenizer_dir)
    if not (src / "tokenizer.json").is_file():
        raise MissingInput(
            f"{src / 'tokenizer.json'}: not found; a checkpoint's tokenizer/ copy is "
            "written by `prodip train`, a tokenizer dir by `prodip tokenizer train`"
        )
    written = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, Path(out_dir) / name)
            written.append(Path(out_dir) / name)
    return written


def load_hf_state(export_dir: str | os.PathLike) -> tuple[Any, dict[str, torch.Tensor]]:
    """Read an export's ``config.json`` and ``model.safetensors`` back (for round-trip checks).

    Returns:
        (ModelConfig, tensors) with the tied ``lm_head.weight`` re-added when tied.
    Raises:
        FileNotFoundError: a file is missing.
    """

    root = Path(export_dir)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (root / name).is_file():
            raise MissingInput(f"{root / name}: not found (written by `prodip export`)")
    config = ModelConfig.from_hf_dict(
        json.loads((root / CONFIG_FILE).read_text(encoding="utf-8")), source=str(root / CONFIG_FILE)
    )
    tensors = load_file(str(root / WEIGHTS_FILE))
    if config.tie_word_embeddings:
        tensors[TIED_ALIAS] = tensors["model.embed_tokens.weight"]
    return config, tensors
