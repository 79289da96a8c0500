"""Reload an export's ``model.safetensors`` into prodip's own model (one conformance candidate).

Deliberately independent of ``export/``: it reads only ``config.json`` and the safetensors file,
as any consumer of the export would.

    python -c "from prodip.conformance.reload import load_safetensors_model as f; print(f('runs/demo/export'))"
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from prodip.base.errors import InvalidInput, MissingInput
from prodip.train.config import ModelConfig
from prodip.train.model import LlamaForCausalLM


def load_safetensors_model(export_dir: str | Path, rel_path: str = "model.safetensors") -> torch.nn.Module:
    """Build ``prodip.train.model.LlamaForCausalLM`` from an export's config.json and safetensors weights.

    Weights stored in bf16/fp16 are upcast to float32. A tied ``lm_head.weight`` may be absent
    from the file (stored once as ``model.embed_tokens.weight``).

    Args:
        export_dir: the export dir.
        rel_path: the safetensors file, relative to ``export_dir``.
    Returns:
        The model in float32, eval mode.
    Raises:
        FileNotFoundError: config.json or the weights are missing.
        ValueError: a bad config, or a missing/extra/mis-shaped tensor (named).
    """

    export_dir = Path(export_dir)
    cfg_path = export_dir / "config.json"
    if not cfg_path.is_file():
        raise MissingInput(f"{cfg_path}: missing (written by `prodip export`)")
    config = ModelConfig.from_hf_dict(json.loads(cfg_path.read_text(encoding="utf-8")), source=str(cfg_path))
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    tensors = {k: v.float() for k, v in load_file(str(export_dir / rel_path)).items()}
    if config.tie_word_embeddings and "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    expected = model.state_dict()
    missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or extra:
        raise InvalidInput(f"{export_dir / rel_path}: missing tensors {missing}, unexpected tensors {extra}")
    for key, ref in expected.items():
        if tuple(tensors[key].shape) != tuple(ref.shape):
            raise InvalidInput(
                f"{export_dir / rel_path}: {key} has shape {tuple(tensors[key].shape)}, "
                f"config.json implies {tuple(ref.shape)}"
            )
    model = model.to_empty(device="cpu")
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.load_state_dict(tensors, strict=True)
    return model.eval()
