"""Tiny checkpoints and exports for the test fixtures of every package (export, conformance, serve).

They go through the real APIs: ``prodip.tokenizer.bpe.train_tokenizer_from_texts``,
``prodip.train.checkpoint.save_checkpoint`` and :func:`prodip.export.core.export_checkpoint`. Weights are
random (seeded) with unit-gain scale, so logits are far from flat and argmax comparisons mean something.

    python -c "import tempfile, export; print(export.build_tiny_export(tempfile.mkdtemp(), variants=['fp32']))"
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence

#: A small bilingual corpus; enough for a byte-fallback BPE of a few hundred tokens.
TINY_TEXTS = {
    "bn": ["আমার সোনার বাংলা, আমি তোমায় ভালোবাসি।", "চিরদিন তোমার আকাশ, তোমার বাতাস, আমার প্রাণে বাজায় বাঁশি।",
           "বাংলা ভাষা দক্ষিণ এশিয়ার একটি ইন্দো-আর্য ভাষা।", "ঢাকা বাংলাদেশের রাজধানী ও বৃহত্তম শহর।"],
    "en": ["It was a bright cold day in April, and the clocks were striking thirteen.",
           "The quick brown fox jumps over the lazy dog.", "Small language models can run on device."],
}


def tiny_model_config(*, vocab_size: int = 512, tie: bool = False, hidden_size: int = 64,
                      num_hidden_layers: int = 2, num_attention_heads: int = 4,
                      num_key_value_heads: int = 2, max_position_embeddings: int = 256,
                      intermediate_size: Optional[int] = None) -> Any:
    """A ``ModelConfig`` for tests: hidden 64, 2 layers, GQA 4/2, intermediate 2 * hidden by default."""
    from prodip.train.config import ModelConfig
    intermediate_size = 2 * hidden_size if intermediate_size is None else intermediate_size
    return ModelConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                       num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                       num_key_value_heads=num_key_value_heads, max_position_embeddings=max_position_embeddings,
                       tie_word_embeddings=tie)


def tiny_model(config: Any, *, seed: int = 0, std: Optional[float] = None) -> Any:
    """``LlamaForCausalLM(config)`` with N(0, std) weights and norms near 1 (eval mode).

    The default ``std = 1 / sqrt(hidden_size)`` (unit gain per matmul, logit std ~ 1) is several
    times the training init, so logits spread out (random-init logits are almost flat, which
    makes argmax agreement between variants meaningless), but not chaotic.
    """
    import torch

    from prodip.train.model import LlamaForCausalLM
    model = LlamaForCausalLM(config)
    std = config.hidden_size ** -0.5 if std is None else std
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
    return model.eval()


def build_tiny_checkpoint(tmp_dir: str | os.PathLike, *, tie: bool = False, vocab_size: int = 512,
                          seed: int = 0, step: int = 10, **config_kwargs: Any) -> Path:
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
    from prodip.tokenizer.bpe import train_tokenizer_from_texts
    from prodip.train.checkpoint import save_checkpoint
    root = Path(tmp_dir)
    tok_dir = train_tokenizer_from_texts(TINY_TEXTS, min(vocab_size, 300), root / "tokenizer")
    config = tiny_model_config(vocab_size=vocab_size, tie=tie, **config_kwargs)
    model = tiny_model(config, seed=seed)
    save_checkpoint(root / "run" / "checkpoints", step=step, model=model, model_config=config,
                    tokenizer_dir=tok_dir)
    return root / "run"


def build_tiny_export(tmp_dir: str | os.PathLike, *, tie: bool = False, vocab_size: int = 512,
                      variants: Optional[Sequence[str]] = None, seed: int = 0,
                      export_options: Optional[dict[str, Any]] = None, **config_kwargs: Any) -> Path:
    """A complete export dir of a tiny random model, built by the real ``prodip export`` path.

    Args:
        tmp_dir: empty scratch folder; gets ``tokenizer/``, ``run/`` and ``export/``.
        tie, vocab_size, seed, **config_kwargs: see :func:`build_tiny_checkpoint`.
        variants: subset of ``prodip.export.config.VARIANTS`` (default all: ~5-10 s on 2 cores).
        export_options: more ExportConfig fields, e.g. ``{"onnx_external_data": True}``.
    Returns:
        The export dir (``tmp_dir/export``).
    """
    from prodip.export.config import VARIANTS, ExportConfig
    from prodip.export.core import export_checkpoint
    run = build_tiny_checkpoint(tmp_dir, tie=tie, vocab_size=vocab_size, seed=seed, **config_kwargs)
    cfg = ExportConfig(checkpoint=str(run), out=str(Path(tmp_dir) / "export"),
                       variants=list(variants or VARIANTS), **(export_options or {}))
    return export_checkpoint(cfg)
