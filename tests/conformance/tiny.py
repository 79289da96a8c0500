"""Builders of a tiny tokenizer, checkpoint, shards and export for the conformance tests.

Deterministic and CPU-only. The model is given a large ``initializer_range`` so that its
attention is sharp and its logits spread: a default-initialised tiny model attends almost
uniformly, which would hide RoPE and mask faults in rounding noise.

    python -c "from tests.conformance.tiny import build_all; print(build_all('/tmp/tiny_conf'))"
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

TEXT = {
    "bn": "আমার সোনার বাংলা, আমি তোমায় ভালোবাসি। চিরদিন তোমার আকাশ, তোমার বাতাস, আমার প্রাণে বাজায় বাঁশি। "
          "বাংলাদেশের রাজধানী ঢাকা। নদীমাতৃক এই দেশে পদ্মা, মেঘনা আর যমুনা বয়ে চলে। ",
    "en": "The quick brown fox jumps over the lazy dog. The old ferry crosses the wide river every morning, "
          "carrying farmers, students and baskets of fresh fish to the market town. ",
}
VOCAB = 384


def build_tokenizer(out: Path) -> Path:
    """Byte-level BPE (NFC) with <|pad|>=0, <|bos|>=1, <|eos|>=2."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|pad|>", "<|bos|>", "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([t * 10 for t in TEXT.values()], trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    special = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
    (out / "tokenizer_config.json").write_text(json.dumps({**special, "model_max_length": 96}))
    (out / "special_tokens_map.json").write_text(json.dumps(special))
    return out


def build_shards(out: Path, tokenizer_dir: Path) -> Path:
    """Validation (and train) shards per language: the texts above, encoded, <|eos|> between."""
    from tokenizers import Tokenizer

    from prodip.tokenizer.shards import write_meta, write_shard
    from prodip.train.checkpoint import file_sha256

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    langs = {}
    for lang, text in TEXT.items():
        ids = (tok.encode(text, add_special_tokens=False).ids + [2]) * 4
        langs[lang] = {}
        for split in ("train", "val"):
            rel = f"{lang}/{split}_000000.bin"
            (out / lang).mkdir(parents=True, exist_ok=True)
            write_shard(out / rel, np.asarray(ids), "uint16")
            langs[lang][split] = [{"file": rel, "n_tokens": len(ids)}]
    write_meta(out, {"tokenizer_sha256": file_sha256(tokenizer_dir / "tokenizer.json"), "vocab_size": VOCAB,
                     "token_dtype": "uint16", "bos_id": 1, "eos_id": 2, "pad_id": 0, "languages": langs})
    return out


def build_checkpoint(run_dir: Path, tokenizer_dir: Path, seed: int = 0, **overrides) -> Path:
    """A 2-layer hidden-48 GQA model with a sharp random init, saved as a prodip checkpoint."""
    from prodip.train.checkpoint import save_checkpoint
    from prodip.train.config import ModelConfig
    from prodip.train.model import LlamaForCausalLM

    kw = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
              initializer_range=0.15)
    kw.update(overrides)
    config = ModelConfig(**kw)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.reset_parameters(seed=seed)
    return save_checkpoint(run_dir / "checkpoints", step=1, model=model, model_config=config,
                           tokenizer_dir=tokenizer_dir)


def build_export(ckpt: Path, out: Path, variants=None) -> Path:
    from prodip.export.config import VARIANTS, ExportConfig
    from prodip.export.core import export_checkpoint

    cfg = ExportConfig(checkpoint=str(ckpt), out=str(out), variants=list(variants or VARIANTS))
    return export_checkpoint(cfg)


def build_all(root: str | Path) -> dict[str, Path]:
    root = Path(root)
    tok = build_tokenizer(root / "tokenizer")
    shards = build_shards(root / "shards", tok)
    ckpt = build_checkpoint(root / "run", tok)
    export = build_export(ckpt, root / "export")
    return {"tokenizer": tok, "shards": shards, "checkpoint": ckpt, "export": export}
