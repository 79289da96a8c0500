"""The special-token convention of a tokenizer dir, read from its files rather than assumed.

prodip's own tokenizers put ``<|pad|>`` 0, ``<|bos|>`` 1, ``<|eos|>`` 2 first; an imported Hugging Face
model has its own (SmolLM2: ``<|endoftext|>`` 0, ``<|im_start|>`` 1, ``<|im_end|>`` 2; Llama 3:
``<|begin_of_text|>`` and ``<|eot_id|>`` appended after 128000 tokens; Qwen2: no bos at all). This module
reads, from the files ``save_pretrained`` writes:

- ``tokenizer_config.json``: ``bos_token``/``eos_token``/``pad_token`` (a string or an ``AddedToken``
  dict ``{"content": ...}``), or their ``*_token_id`` when it states them (prodip's does);
- ``tokenizer.json``: the ids of those texts (vocabulary and added tokens), and whether its
  post-processor prepends the bos (``TemplateProcessing`` whose ``single`` starts with a special token);
- ``generation_config.json`` / ``config.json`` (when present): ``eos_token_id``, one id or a list, the
  ids that end generation;
- the tokenizer's end-of-text token (:data:`DOCUMENT_END_TOKENS`, found by its text among its special tokens), which
  ends each pretraining document. An instruct model's configs often leave it out of the stop ids (SmolLM2's
  list only ``<|im_end|>``), yet continued pretraining on shards that end each document with it teaches the
  model to write it after prose, so it ends generation too.

The end-of-turn token of a chat model is :mod:`prodip.base.chat`'s business (``chat_contract``).

    python -c "from prodip.base.specials import read_specials; print(read_specials('runs/demo/tokenizer'))"
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Optional

from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.jsontypes import JSONObject


@dataclasses.dataclass(frozen=True)
class Specials:
    """A tokenizer's special-token ids.

    Attributes:
        bos_id: the token that starts a document/prompt, or None (Qwen2 has none).
        eos_id: the token that ends a document (tokenizer_config's ``eos_token``).
        pad_id: the padding token, or None.
        stop_ids: every id that ends generation (``eos_id`` first, then generation_config's others, then
            ``document_end_id``), without repeats.
        add_bos: the tokenizer's default encode prepends ``bos_id`` (its post-processor does).
        source: the folder read.
        document_end_id: the id that ends a pretraining document: the end-of-text token
            (:data:`DOCUMENT_END_TOKENS`) when the tokenizer has one, else ``eos_id``.
    """

    bos_id: Optional[int]
    eos_id: int
    pad_id: Optional[int]
    stop_ids: tuple[int, ...]
    add_bos: bool
    source: str
    document_end_id: int


#: The end-of-text tokens that separate pretraining documents, by text (GPT-2/SmolLM2/Qwen2, Llama 3, Llama 2):
#: llama.cpp recognises the same texts as end of generation.
DOCUMENT_END_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>")


def _json(path: Path) -> JSONObject:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InvalidInput(f"{path}: not valid JSON ({err})") from None
    return data if isinstance(data, dict) else {}


def token_ids(tokenizer_json: JSONObject) -> dict[str, int]:
    """Text -> id of every token of a parsed ``tokenizer.json`` (vocabulary, then added tokens; entries
    that are not text -> integer are skipped)."""
    model = tokenizer_json.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    out = {k: v for k, v in vocab.items() if isinstance(v, int)} if isinstance(vocab, dict) else {}
    added_tokens = tokenizer_json.get("added_tokens")
    for added in added_tokens if isinstance(added_tokens, list) else []:
        content, token_id = (added.get("content"), added.get("id")) if isinstance(added, dict) else (None, None)
        if isinstance(content, str) and isinstance(token_id, int):
            out[content] = token_id
    return out


def _text(value: Any) -> Optional[str]:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def prepends_bos(tokenizer_json: JSONObject) -> Optional[int]:
    """The id a ``tokenizer.json`` post-processor puts before every single sequence, or None."""
    post = tokenizer_json.get("post_processor") or {}
    if not isinstance(post, dict):
        return None
    procs = post.get("processors", []) if post.get("type") == "Sequence" else [post]
    for proc in procs if isinstance(procs, list) else []:
        if isinstance(proc, dict) and proc.get("type") == "TemplateProcessing":
            single = proc.get("single")
            first = single[0] if isinstance(single, list) and single else {}
            special = first.get("SpecialToken") if isinstance(first, dict) else None
            if isinstance(special, dict):
                tokens = proc.get("special_tokens")
                entry = tokens.get(str(special.get("id"))) if isinstance(tokens, dict) else None
                ids = entry.get("ids") if isinstance(entry, dict) else None
                return ids[0] if isinstance(ids, list) and ids and isinstance(ids[0], int) else None
    return None


def read_specials(tokenizer_dir: str | os.PathLike[str]) -> Specials:
    """The special-token convention of ``tokenizer_dir`` (see the module docstring).

    Raises:
        MissingInput: no ``tokenizer.json``.
        InvalidInput: no eos token stated, or a stated token that ``tokenizer.json`` lacks (the file and
            the field named).
    """
    root = Path(tokenizer_dir)
    tok_path = root / "tokenizer.json"
    if not tok_path.is_file():
        raise MissingInput(f"{tok_path}: not found")
    tok = _json(tok_path)
    ids = token_ids(tok)
    cfg_path = root / "tokenizer_config.json"
    cfg = _json(cfg_path)
    found: dict[str, Optional[int]] = {}
    for key in ("bos", "eos", "pad"):
        given = cfg.get(f"{key}_token_id")
        text = _text(cfg.get(f"{key}_token"))
        if isinstance(given, int) and not isinstance(given, bool):
            found[key] = given
        elif text is not None:
            if text not in ids:
                raise InvalidInput(f"{cfg_path}: {key}_token {text!r} is not a token of {tok_path}")
            found[key] = ids[text]
        else:
            found[key] = None
    gen = _json(root / "generation_config.json")
    model_cfg = _json(root / "config.json")
    stops = _ids(gen.get("eos_token_id")) or _ids(model_cfg.get("eos_token_id"))
    eos = found["eos"] if found["eos"] is not None else (stops[0] if stops else None)
    if eos is None:
        raise InvalidInput(f"{cfg_path}: no eos_token (nor an eos_token_id in generation_config.json or config.json)")
    if found["bos"] is None:  # tokenizer_config may leave it out (Qwen2: null) while config.json states one
        found["bos"] = next(iter(_ids(model_cfg.get("bos_token_id"))), None) if not cfg else None
    prepended = prepends_bos(tok)
    add_bos = prepended is not None and prepended == found["bos"]
    # an instruct model's eos_token is its end of turn; its end of text ends a document (and so generation)
    added_tokens = tok.get("added_tokens")
    special = {
        content: ids[content]
        for a in (added_tokens if isinstance(added_tokens, list) else [])
        if isinstance(a, dict) and a.get("special") and isinstance(content := a.get("content"), str) and content in ids
    }
    doc_end = next((special[t] for t in DOCUMENT_END_TOKENS if t in special), eos)
    stop_ids = tuple(dict.fromkeys([eos, *stops, doc_end]))
    return Specials(found["bos"], eos, found["pad"], stop_ids, add_bos, str(root), doc_end)
