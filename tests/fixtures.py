"""Builders of tiny tokenizers, shards, checkpoints and exports: the one fixture module of the tests.

Deterministic and CPU-only; the tests' ``conftest.py`` files wrap these in pytest fixtures, and
``bench/serve.py`` uses :func:`build_tiny_export` for its random ~108M export. Two families:

- :func:`build_tiny_checkpoint` / :func:`build_tiny_export`: a random model of any shape (through
  the real ``prodip.export`` path), tokenizer trained by prodip on a few sentences.
- :func:`build_all` (``build_tokenizer``, ``build_shards``, ``build_checkpoint``, ``build_export``):
  the conformance set, whose model has a large ``initializer_range`` so that attention is sharp
  and its logits spread (a default-initialised tiny model attends almost uniformly, which would
  hide RoPE and mask faults in rounding noise).

    python -c "from tests.fixtures import build_all; print(build_all('/tmp/tiny_conf'))"
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from prodip.base.variants import DEFAULT_VARIANTS
from prodip.export.config import ExportConfig
from prodip.export.core import export_checkpoint
from prodip.tokenizer.bpe import tokenizer_config, train_tokenizer_from_texts, with_bos_convention
from prodip.tokenizer.shards import FORMAT_VERSION as SHARDS_FORMAT_VERSION
from prodip.train.checkpoint import save_checkpoint
from prodip.train.config import ModelConfig
from prodip.train.model import LlamaForCausalLM

#: A small bilingual corpus; enough for a byte-fallback BPE of a few hundred tokens.
TINY_TEXTS = {
    "bn": [
        "আমার সোনার বাংলা, আমি তোমায় ভালোবাসি।",
        "চিরদিন তোমার আকাশ, তোমার বাতাস, আমার প্রাণে বাজায় বাঁশি।",
        "বাংলা ভাষা দক্ষিণ এশিয়ার একটি ইন্দো-আর্য ভাষা।",
        "ঢাকা বাংলাদেশের রাজধানী ও বৃহত্তম শহর।",
    ],
    "en": [
        "It was a bright cold day in April, and the clocks were striking thirteen.",
        "The quick brown fox jumps over the lazy dog.",
        "Small language models can run on device.",
    ],
}


def tiny_model_config(
    *,
    vocab_size: int = 512,
    tie: bool = False,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 256,
    intermediate_size: Optional[int] = None,
) -> Any:
    """A ``ModelConfig`` for tests: hidden 64, 2 layers, GQA 4/2, intermediate 2 * hidden by default."""
    intermediate_size = 2 * hidden_size if intermediate_size is None else intermediate_size
    return ModelConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie,
    )


def tiny_model(config: Any, *, seed: int = 0, std: Optional[float] = None) -> Any:
    """``LlamaForCausalLM(config)`` with N(0, std) weights and norms near 1 (eval mode).

    The default ``std = 1 / sqrt(hidden_size)`` (unit gain per matmul, logit std ~ 1) is several
    times the training init, so logits spread out (random-init logits are almost flat, which
    makes argmax agreement between variants meaningless), but not chaotic.
    """

    model = LlamaForCausalLM(config)
    std = config.hidden_size**-0.5 if std is None else std
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
    return model.eval()


def build_tiny_checkpoint(
    tmp_dir: str | os.PathLike,
    *,
    tie: bool = False,
    vocab_size: int = 512,
    seed: int = 0,
    step: int = 10,
    **config_kwargs: Any,
) -> Path:
    """Write a tokenizer dir and a run dir with one checkpoint under ``tmp_dir``.

    Args:
        tmp_dir: empty scratch folder (e.g. from ``tmp_path_factory``).
        tie: tie lm_head to the embedding.
        vocab_size: model vocabulary (tokens); may exceed the tiny tokenizer's (>= 300 tokens).
        seed: weight seed.
        step: the checkpoint's step number.
        **config_kwargs: more :func:`tiny_model_config` arguments (hidden_size, num_key_value_heads, ...).
    Returns:
        The run dir (``tmp_dir/run``); its ``checkpoints/latest`` names the step dir.
    """
    root = Path(tmp_dir)
    tok_dir = train_tokenizer_from_texts(TINY_TEXTS, min(vocab_size, 300), root / "tokenizer")
    config = tiny_model_config(vocab_size=vocab_size, tie=tie, **config_kwargs)
    model = tiny_model(config, seed=seed)
    save_checkpoint(root / "run" / "checkpoints", step=step, model=model, model_config=config, tokenizer_dir=tok_dir)
    return root / "run"


def build_tiny_export(
    tmp_dir: str | os.PathLike,
    *,
    tie: bool = False,
    vocab_size: int = 512,
    variants: Optional[Sequence[str]] = None,
    seed: int = 0,
    export_options: Optional[dict[str, Any]] = None,
    **config_kwargs: Any,
) -> Path:
    """A complete export dir of a tiny random model, built by the real ``prodip export`` path.

    Args:
        tmp_dir: empty scratch folder; gets ``tokenizer/``, ``run/`` and ``export/``.
        tie, vocab_size, seed, **config_kwargs: see :func:`build_tiny_checkpoint`.
        variants: subset of ``prodip.base.variants.VARIANT_NAMES`` (default: DEFAULT_VARIANTS, ~5-10 s on 2 cores).
        export_options: more ExportConfig fields, e.g. ``{"onnx_external_data": True}``.
    Returns:
        The export dir (``tmp_dir/export``).
    """
    run = build_tiny_checkpoint(tmp_dir, tie=tie, vocab_size=vocab_size, seed=seed, **config_kwargs)
    cfg = ExportConfig(
        checkpoint=str(run),
        out=str(Path(tmp_dir) / "export"),
        variants=list(variants or DEFAULT_VARIANTS),
        **(export_options or {}),
    )
    return export_checkpoint(cfg)


# ---- the conformance set ---------------------------------------------------------------------

TEXT = {
    "bn": "আমার সোনার বাংলা, আমি তোমায় ভালোবাসি। চিরদিন তোমার আকাশ, তোমার বাতাস, আমার প্রাণে বাজায় বাঁশি। "
    "বাংলাদেশের রাজধানী ঢাকা। নদীমাতৃক এই দেশে পদ্মা, মেঘনা আর যমুনা বয়ে চলে। ",
    "en": "The quick brown fox jumps over the lazy dog. The old ferry crosses the wide river every morning, "
    "carrying farmers, students and baskets of fresh fish to the market town. ",
}
VOCAB = 384


def byte_level_tokenizer_dir(
    out: Path, texts: dict[str, str], vocab_size: int, repeat: int, model_max_length: int
) -> Path:
    """A byte-level BPE (NFC) tokenizer dir trained on ``texts`` (each repeated ``repeat`` times), with
    <|pad|>=0, <|bos|>=1, <|eos|>=2 and the <|bos|> post-processor; tokenizer.json + config files. No chat
    markers: a tokenizer made before they were reserved (fine-tuning for chat appends them)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|pad|>", "<|bos|>", "<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([t * repeat for t in texts.values()], trainer=trainer)
    with_bos_convention(tok).save(str(out / "tokenizer.json"))
    special = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(model_max_length=model_max_length, chat_tokens=False))
    )
    (out / "special_tokens_map.json").write_text(json.dumps(special))
    return out


def build_tokenizer(out: Path) -> Path:
    """The conformance set's tokenizer: byte-level BPE (NFC) with <|pad|>=0, <|bos|>=1, <|eos|>=2."""
    return byte_level_tokenizer_dir(out, TEXT, VOCAB, repeat=10, model_max_length=96)


def build_shards(out: Path, tokenizer_dir: Path) -> Path:
    """Validation (and train) shards per language: the texts above as documents <|bos|> ids <|eos|>."""
    from tokenizers import Tokenizer

    from prodip.tokenizer.shards import write_meta, write_shard
    from prodip.train.checkpoint import file_sha256

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    langs = {}
    for lang, text in TEXT.items():
        ids = ([1] + tok.encode(text, add_special_tokens=False).ids + [2]) * 4
        langs[lang] = {}
        for split in ("train", "val"):
            rel = f"{lang}/{split}_000000.bin"
            (out / lang).mkdir(parents=True, exist_ok=True)
            write_shard(out / rel, np.asarray(ids), "uint16")
            langs[lang][split] = [{"file": rel, "n_tokens": len(ids)}]
    write_meta(
        out,
        {
            "tokenizer_sha256": file_sha256(tokenizer_dir / "tokenizer.json"),
            "vocab_size": VOCAB,
            "token_dtype": "uint16",
            "bos_id": 1,
            "eos_id": 2,
            "pad_id": 0,
            "languages": langs,
        },
    )
    return out


#: A checkpoint's ``data_card`` as the trainer records it (``prodip.train.trainer._Run._data_card``): two
#: recorded sources (one with a Hugging Face dataset id, one share-alike) and one unknown licence
#: included by choice, so the conformance set's card carries every kind of statement.
DATA_CARD = {
    "sources": [
        {
            "name": "bn-news",
            "language": "bn",
            "variety": "news Bangla",
            "origin": "https://example.org/bn-news",
            "license": "CC-BY-SA-4.0",
            "license_name": "",
            "license_link": "",
            "dataset_id": "example/bn-news",
            "notes": "",
            "license_class": "share-alike",
            "license_terms": ["share-alike"],
            "included_by_choice": False,
            "documents": 4,
            "chars": 600,
            "tokens": 300,
            "chars_share_of_language": 0.75,
            "tokens_share_of_language": 0.75,
        },
        {
            "name": "bluck_bn_mcq.jsonl",
            "language": "bn",
            "variety": "",
            "origin": "",
            "license": "unknown",
            "license_name": "",
            "license_link": "",
            "dataset_id": "",
            "notes": "",
            "license_class": "unknown",
            "license_terms": [],
            "included_by_choice": True,
            "documents": 2,
            "chars": 200,
            "tokens": 100,
            "chars_share_of_language": 0.25,
            "tokens_share_of_language": 0.25,
        },
        {
            "name": "en-novels",
            "language": "en",
            "variety": "",
            "origin": "GITenberg/Frankenstein_84@c98a483",
            "license": "LicenseRef-PublicDomain",
            "license_name": "",
            "license_link": "",
            "dataset_id": "",
            "notes": "Project Gutenberg header removed",
            "license_class": "public-domain",
            "license_terms": [],
            "included_by_choice": False,
            "documents": 4,
            "chars": 700,
            "tokens": 200,
            "chars_share_of_language": 1.0,
            "tokens_share_of_language": 1.0,
        },
    ],
    "tokens_seen_by_language": {"bn": 4000, "en": 2000},
    "tokens_seen_by_source": {"bn-news": 3000, "bluck_bn_mcq.jsonl": 1000, "en-novels": 2000},
    "tokens_seen_by_source_method": "language counter x the source's share of the language's shard tokens",
    "init_from": None,
}


def build_checkpoint(run_dir: Path, tokenizer_dir: Path, seed: int = 0, **overrides) -> Path:
    """A 2-layer hidden-48 GQA model with a sharp random init, saved as a prodip checkpoint (with
    :data:`DATA_CARD` as its trainer's record of the data)."""
    from prodip.train.checkpoint import save_checkpoint
    from prodip.train.config import ModelConfig
    from prodip.train.model import LlamaForCausalLM

    kw = dict(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=96,
        initializer_range=0.15,
    )
    kw.update(overrides)
    config = ModelConfig(**kw)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.reset_parameters(seed=seed)
    return save_checkpoint(
        run_dir / "checkpoints",
        step=1,
        model=model,
        model_config=config,
        tokenizer_dir=tokenizer_dir,
        extra_state={"data_card": DATA_CARD},
    )


def build_export(ckpt: Path, out: Path, variants=None) -> Path:
    from prodip.export.config import ExportConfig
    from prodip.export.core import export_checkpoint

    cfg = ExportConfig(checkpoint=str(ckpt), out=str(out), variants=list(variants or DEFAULT_VARIANTS))
    return export_checkpoint(cfg)


def build_all(root: str | Path) -> dict[str, Path]:
    root = Path(root)
    tok = build_tokenizer(root / "tokenizer")
    shards = build_shards(root / "shards", tok)
    ckpt = build_checkpoint(root / "run", tok)
    export = build_export(ckpt, root / "export")
    return {"tokenizer": tok, "shards": shards, "checkpoint": ckpt, "export": export}


# ---- on-device targets (GGUF, ExecuTorch): a tokenizer llama.cpp reproduces, a model Q4_K can hold ----


def build_device_set(root: str | Path, variants: Sequence[str] = ()) -> dict[str, Path]:
    """Tokenizer (the default, portable kind), shards, a hidden-256 checkpoint (Q4_K's super-block) and an export with
    ``variants`` (plus safetensors) for the GGUF and ExecuTorch tests.

    The model's vocabulary (512) is larger than the tokenizer's (384), as when a tokenizer comes out
    smaller than ``vocab_size``: the GGUF pads its token list.
    """
    root = Path(root)
    tok = train_tokenizer_from_texts({lang: [text * 10] for lang, text in TEXT.items()}, VOCAB, root / "tokenizer")
    shards = build_shards(root / "shards", tok)
    ckpt = build_checkpoint(
        root / "run", tok, vocab_size=512, hidden_size=256, intermediate_size=512, num_attention_heads=4,
        num_key_value_heads=2, initializer_range=0.06,
    )  # fmt: skip
    export = build_export(ckpt, root / "export", variants=["safetensors", *variants])
    return {"tokenizer": tok, "shards": shards, "checkpoint": ckpt, "export": export}


# ---- the train tests' tokenizer, shards and model configs ----------------------------------

TINY_VOCAB = 320  # byte-level BPE: 256 bytes + 3 specials + a few merges
TRAIN_TEXT = {
    "bn": "আমার সোনার বাংলা, আমি তোমায় ভালোবাসি। চিরদিন তোমার আকাশ, তোমার বাতাস। ",
    "en": "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. ",
}


def build_train_tokenizer(out: Path) -> Path:
    """A byte-level BPE tokenizer dir (tokenizer.json + config files), ids pad=0, bos=1, eos=2."""
    return byte_level_tokenizer_dir(out, TRAIN_TEXT, TINY_VOCAB, repeat=20, model_max_length=64)


def _write_shard(path: Path, tokens: np.ndarray) -> None:
    """Shard writer: tokenizer.shards if present, else the llm.c layout it documents."""
    try:
        from prodip.tokenizer.shards import write_shard
    except ImportError:
        path.parent.mkdir(parents=True, exist_ok=True)
        header = np.zeros(256, dtype=np.int32)
        header[:3] = (20240520, 1, len(tokens))
        with open(path, "wb") as fh:
            fh.write(header.tobytes())
            fh.write(tokens.astype(np.uint16).tobytes())
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_shard(path, tokens, "uint16")


def make_shards(out: Path, tokenizer_sha256: str, vocab_size: int, n_tokens: dict[str, int], seed: int = 0) -> Path:
    """Random-token shards (ids 3..vocab-1; documents <|bos|> ... <|eos|> of ~40 tokens) for each language."""
    rng = np.random.default_rng(seed)
    langs = {}
    for lang, n in n_tokens.items():
        langs[lang] = {}
        for split, count in (("train", n), ("val", max(256, n // 10))):
            tokens = rng.integers(3, vocab_size, size=count, dtype=np.int64)
            ends = np.flatnonzero(rng.random(count) < 0.025)
            ends = ends[ends > 0]
            tokens[0] = 1  # a shard starts at a document start
            tokens[ends] = 2
            tokens[ends[ends + 1 < count] + 1] = 1
            rel = f"{lang}/{split}_000000.bin"
            _write_shard(out / rel, tokens)
            langs[lang][split] = [{"file": rel, "n_tokens": int(count)}]
    meta = {
        "format_version": SHARDS_FORMAT_VERSION,
        "tokenizer_sha256": tokenizer_sha256,
        "vocab_size": vocab_size,
        "token_dtype": "uint16",
        "bos_id": 1,
        "eos_id": 2,
        "pad_id": 0,
        "languages": langs,
    }
    try:  # tokenizer.shards adds each shard's sha256 and max_id
        from prodip.tokenizer.shards import add_checksums

        add_checksums(out, meta)
    except ImportError:
        pass
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return out


def tiny_config(**overrides) -> ModelConfig:
    """2 layers, hidden 32, GQA 4/2 heads, 64 positions, vocab of the tiny tokenizer."""
    kw = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    kw.update(overrides)
    return ModelConfig(**kw)


def write_sources(folder: Path, records: dict[str, str], license: str = "CC0-1.0") -> Path:
    """A ``sources.toml`` sidecar in ``folder`` with one record per ``{file or glob: language}``, all under
    ``license`` (the test's own text): what the licence gate of tokenizer train / data prepare asks for."""
    text = "".join(
        f'[[source]]\nname = "test-{i}"\nfiles = ["{pattern}"]\nlanguage = "{lang}"\nlicense = "{license}"\n\n'
        for i, (pattern, lang) in enumerate(records.items())
    )
    path = Path(folder) / "sources.toml"
    path.write_text(text, encoding="utf-8")
    return path


# ---- a tiny chat model -------------------------------------------------------------------------


def add_chat_tokens(tokenizer_dir: Path) -> dict[str, int]:
    """Make ``tokenizer_dir`` a chat model's tokenizer: ``<|im_start|>`` / ``<|im_end|>`` added as special
    tokens (HF ``tokenizers``; a no-op where they exist already) and ``chat_template`` =
    ``prodip.base.chat.CHAT_TEMPLATE`` in tokenizer_config.json. Returns the markers' ids (found by text)."""
    from tokenizers import AddedToken, Tokenizer

    from prodip.base.chat import CHAT_TEMPLATE, CHAT_TOKENS

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAT_TOKENS])
    tok.save(str(tokenizer_dir / "tokenizer.json"))
    cfg_path = tokenizer_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")
    return {t: tok.token_to_id(t) for t in CHAT_TOKENS}


def _chat_prompt() -> list[dict[str, str]]:
    from prodip.conformance.chat import CONVERSATIONS, GREEDY_CONVERSATION

    return CONVERSATIONS[GREEDY_CONVERSATION]


#: The conversation whose greedy reply :func:`build_tiny_chat_export` ends with ``<|im_end|>``: the one
#: conformance decodes greedily in every runtime (a system prompt and a Bangla question).
CHAT_PROMPT = _chat_prompt()


def build_tiny_chat_export(
    tmp_dir: str | os.PathLike,
    *,
    variants: Optional[Sequence[str]] = None,
    stop_after: int = 3,
    export_options: Optional[dict[str, Any]] = None,
) -> tuple[Path, dict[str, Any]]:
    """A tiny random *chat* model exported by the real path, whose greedy reply to :data:`CHAT_PROMPT`
    is ``stop_after - 1`` tokens and then ``<|im_end|>``.

    The end of turn is planted by swapping two ``lm_head`` rows (the model is untied, so inputs are
    unchanged): those of ``<|im_end|>`` and of the token greedy decoding emits at step ``stop_after``
    (chosen new: it and ``<|im_end|>`` appear nowhere earlier in the reply, so steps before it keep
    their tokens). The tokenizer is :func:`build_tiny_checkpoint`'s (portable to every runtime) with the chat markers.

    Returns:
        (export dir, ``{"prompt_ids": [...], "reply_ids": [... , im_end], "end_of_turn_id": int}``).
    """
    from prodip.base.chat import END_OF_TURN, render

    root = Path(tmp_dir)
    tok_dir = train_tokenizer_from_texts(TINY_TEXTS, 300, root / "tokenizer")  # portable to every runtime
    ids = add_chat_tokens(tok_dir)
    eot = ids[END_OF_TURN]
    from tokenizers import Tokenizer

    prompt = (
        Tokenizer.from_file(str(tok_dir / "tokenizer.json")).encode(render(CHAT_PROMPT), add_special_tokens=False).ids
    )
    config = tiny_model_config(vocab_size=320, tie=False, max_position_embeddings=128)
    for seed in range(50):
        model = tiny_model(config, seed=seed)
        reply = _greedy(model, prompt, stop_after + 2)
        if eot not in reply[:stop_after] and reply[stop_after - 1] not in reply[: stop_after - 1]:
            break
    else:  # pragma: no cover (a seed always qualifies for the tiny vocabulary)
        raise RuntimeError("no seed gives a reply whose planted token is new")
    swap = reply[stop_after - 1]
    with torch.no_grad():
        w = model.lm_head.weight
        w[[swap, eot]] = w[[eot, swap]]
    planted = _greedy(model, prompt, stop_after)
    assert planted == [*reply[: stop_after - 1], eot], (planted, reply)
    save_checkpoint(root / "run" / "checkpoints", step=1, model=model, model_config=config, tokenizer_dir=tok_dir)
    cfg = ExportConfig(
        checkpoint=str(root / "run"),
        out=str(root / "export"),
        variants=list(variants or ["fp32"]),
        **(export_options or {}),
    )
    return export_checkpoint(cfg), {"prompt_ids": prompt, "reply_ids": planted, "end_of_turn_id": eot}


def _greedy(model: Any, prompt: Sequence[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt`` (the training model, full recompute: the reference)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt) :]
