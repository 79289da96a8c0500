"""``prodip train --init-from``: start a run from existing weights with a fresh optimizer and schedule.

The source is either a prodip checkpoint (a step dir, a checkpoints dir or a run dir; verified by
its manifest, and its tokenizer must be the run's, since the shards' ids must mean what the model
learned) or a Hugging Face Llama or Qwen2 folder (``config.json`` with ``model_type`` ``"llama"`` or
``"qwen2"``, the latter the Llama decoder with q/k/v projection biases, and
``model.safetensors`` or sharded ``model-*.safetensors`` with ``model.safetensors.index.json``,
as ``save_pretrained`` writes; a prodip export dir is one). The HF config is mapped onto
:class:`prodip.train.config.ModelConfig` (the same field names); what our model cannot represent
(a RoPE scaling other than llama3, Llama's attention or MLP biases, an activation other than SiLU,
sliding-window attention, another model type) is
refused by name rather than loaded approximately. Weights are cast to float32 (the training
dtype). Only the weights are taken: step 0, new AdamW moments, a new warmup and decay, any corpus
and mixture (fine-tuning and continued pretraining).

    prodip train --config configs/demo.toml --init-from runs/demo/train --out-dir runs/ft --steps 100
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import load_file

from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.files import check_safetensors_size, file_sha256
from prodip.base.specials import Specials, read_specials
from prodip.train import checkpoint
from prodip.train.config import ModelConfig, check_rope_scaling

log = logging.getLogger(__name__)

#: HF LlamaConfig keys whose non-default values change the computation in ways our model lacks.
_REFUSED = {
    "attention_bias": (False,),
    "mlp_bias": (False,),
    "hidden_act": ("silu",),
    "pretraining_tp": (1,),
    "rope_interleaved": (False,),
}
#: model_type values and why each is refused (one line naming the key).
_OTHER_TYPES = {
    "mistral": "sliding-window attention is not in prodip's Llama",
}
#: model_type values prodip's model computes (Qwen2: the Llama decoder with q/k/v biases).
_TYPES = ("llama", "qwen2")
#: LlamaConfig / Qwen2Config keys that fix the model's tensor shapes and that ``save_pretrained`` always writes:
#: a config.json without one is incomplete (transformers would fill in a 7B Llama's size, prodip's defaults
#: another model's), so it is refused naming the key rather than compared tensor by tensor.
REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)
#: transformers' defaults for keys a config.json may omit where ModelConfig's default differs
#: (LlamaConfig and Qwen2Config ``__init__``: ``num_key_value_heads = num_attention_heads`` when None,
#: ``rms_norm_eps = 1e-6``), so an omitted key means what it means to transformers.
_HF_DEFAULT_EPS = 1e-6
_HF_INDEX = "model.safetensors.index.json"


@dataclasses.dataclass
class InitWeights:
    """Weights to start from: ``tensors`` (HF-layout key -> float32 CPU tensor), their config, provenance."""

    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    source: str
    kind: str  # "prodip" or "hf"
    option: str = "--init-from"  # how the user gave the source (``--baseline``, ``prodip export``): errors name it


def load_init(path: str | Path, *, tokenizer_sha256: Optional[str], option: str = "--init-from") -> InitWeights:
    """Read the weights and model config of ``path`` (see the module docstring).

    Args:
        path: prodip step/checkpoints/run dir, or a Hugging Face Llama folder.
        tokenizer_sha256: sha256 of the run's ``tokenizer.json`` (the shards' tokenizer); None: the
            folder's own tokenizer is the one (``prodip export HF_FOLDER``).
        option: how the user gave ``path`` (``--init-from``, ``--baseline``, ``prodip export``): every error
            here and in :func:`apply_init` names it.
    Returns:
        :class:`InitWeights`.
    Raises:
        FileNotFoundError: nothing at ``path``, or no weights file.
        ValueError: a prodip checkpoint trained with another tokenizer, a damaged checkpoint
            (manifest mismatch), a HF weights file truncated or tampered (its size against its header), an HF
            config we cannot represent or missing a :data:`REQUIRED_KEYS` key (naming the key), missing tensors.
    """
    path = Path(path)
    if not path.exists():
        raise MissingInput(f"{option} {path}: does not exist (a prodip run/checkpoint dir or a HF Llama folder)")
    if is_prodip_checkpoint(path):
        return _load_prodip(path, tokenizer_sha256, option)
    if (path / "config.json").is_file():
        return _load_hf(path, tokenizer_sha256, option)
    raise MissingInput(
        f"{option} {path}: neither a prodip checkpoint (step dir with manifest.json, or a run dir with "
        "checkpoints/latest) nor a Hugging Face folder with config.json"
    )


def is_prodip_checkpoint(path: Path) -> bool:
    try:
        checkpoint.resolve_checkpoint(path)
    except FileNotFoundError:
        return False
    return True


def _load_prodip(path: Path, tokenizer_sha256: Optional[str], option: str) -> InitWeights:
    model, config, info = checkpoint.load_model(path)
    if tokenizer_sha256 is not None and info["tokenizer_sha256"] != tokenizer_sha256:
        raise InvalidInput(
            f"{option} {info['checkpoint_dir']}: trained with tokenizer sha256 {info['tokenizer_sha256'][:12]}, "
            f"the run's shards use {tokenizer_sha256[:12]}; encode the new corpus with the checkpoint's tokenizer "
            f"({info['tokenizer_dir']}) via `prodip data prepare --tokenizer-dir {info['tokenizer_dir']}`"
        )
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return InitWeights(config, tensors, f"{info['checkpoint_dir']} (step {info['step']})", "prodip", option)


def hf_model_config(data: dict[str, Any], *, source: str, specials: Optional[Specials] = None) -> ModelConfig:
    """Map a Hugging Face ``LlamaConfig`` (or ``Qwen2Config``) dict onto :class:`ModelConfig`, refusing what
    it cannot represent (Qwen2's sliding window: ``use_sliding_window`` or a ``layer_types`` entry).

    RoPE: ``rope_theta`` and ``rope_scaling`` at the top level (transformers 4) or in transformers 5's
    ``rope_parameters``; no scaling or Llama 3.1's ``llama3`` is computed, any other ``rope_type``
    (yarn, linear, dynamic, longrope) is refused by name. Token ids: ``specials`` (the folder's
    tokenizer, :func:`prodip.base.specials.read_specials`) when given: bos, eos (the tokenizer's
    ``eos_token``; the other stop ids travel in ``generation_config.json``), pad (the eos when the
    model has none, as transformers' generate pads); else the config's, one id each.

    Keys the config may omit take transformers' defaults (``num_key_value_heads`` = ``num_attention_heads``,
    ``rms_norm_eps`` 1e-6), not :class:`ModelConfig`'s; the size keys (:data:`REQUIRED_KEYS`) must be there.

    Raises:
        InvalidInput: another ``model_type``, a missing or null :data:`REQUIRED_KEYS` key, an unsupported RoPE
            scaling, biases, another activation, several eos ids without ``specials`` (each naming the key).
    """
    kind = data.get("model_type")
    if kind in _OTHER_TYPES:
        raise InvalidInput(f"{source}: model_type = {kind!r}: {_OTHER_TYPES[kind]}; prodip imports Llama models")
    if kind not in _TYPES:
        raise InvalidInput(
            f"{source}: model_type = {kind!r}; prodip imports Llama and Qwen2 models (model_type 'llama', 'qwen2') only"
        )
    if kind == "qwen2":
        sliding = [t for t in data.get("layer_types") or [] if t != "full_attention"]
        if data.get("use_sliding_window"):
            raise InvalidInput(
                f"{source}: use_sliding_window = true; prodip's model has full attention in every layer "
                "(sliding-window attention is not computed)"
            )
        if sliding:
            raise InvalidInput(f"{source}: layer_types holds {sliding[0]!r}; prodip's model has full attention only")
    missing = [key for key in REQUIRED_KEYS if data.get(key) is None]
    if missing:
        raise InvalidInput(
            f"{source}: missing {', '.join(map(repr, missing))} (save_pretrained writes every size key of a "
            f"{kind} config; prodip does not guess one)"
        )
    for key, allowed in _REFUSED.items():
        if key in data and data[key] not in allowed and data[key] is not None:
            raise InvalidInput(
                f"{source}: {key} = {data[key]!r} cannot be represented by prodip's Llama (needs {allowed[0]!r})"
            )
    data = dict(data)
    rope = data.get("rope_parameters")
    scaling = data.get("rope_scaling")
    if isinstance(rope, dict):
        data.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = rope if rope.get("rope_type", rope.get("type", "default")) != "default" else scaling
    key = "rope_parameters" if isinstance(rope, dict) and scaling is rope else "rope_scaling"
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        scaling = {k: v for k, v in scaling.items() if k not in ("rope_theta", "type")}
        scaling["rope_type"] = scaling.get("rope_type", (data.get(key) or {}).get("type"))
        check_rope_scaling(scaling, source=f"{source}: {key}")
        data["rope_scaling"] = scaling
    else:
        data["rope_scaling"] = None
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    kept = {k: v for k, v in data.items() if k in names and v is not None}
    kept["model_type"] = kind
    kept.setdefault("num_key_value_heads", kept["num_attention_heads"])  # transformers' default: no GQA
    kept.setdefault("rms_norm_eps", _HF_DEFAULT_EPS)
    if specials is not None:
        bos = specials.bos_id if specials.bos_id is not None else next(iter(_as_ids(data.get("bos_token_id"))), None)
        kept["bos_token_id"] = bos if bos is not None else specials.eos_id
        kept["eos_token_id"] = specials.eos_id
        kept["pad_token_id"] = specials.pad_id if specials.pad_id is not None else specials.eos_id
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if isinstance(kept.get(key), list):  # several eos ids: our config has one
            raise InvalidInput(f"{source}: {key} = {kept[key]!r}; prodip's config holds one id")
    return ModelConfig.from_dict(kept, source=source)


def _as_ids(value: Any) -> list[int]:
    return [value] if isinstance(value, int) else [v for v in value or [] if isinstance(v, int)]


def _load_hf(path: Path, tokenizer_sha256: Optional[str], option: str) -> InitWeights:
    cfg_path = path / "config.json"
    try:
        data = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InvalidInput(f"{cfg_path}: not valid JSON ({err})") from None
    own = (path / "tokenizer.json").is_file()
    config = hf_model_config(data, source=str(cfg_path), specials=read_specials(path) if own else None)
    files = _hf_weight_files(path)
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        check_safetensors_size(f)  # a named error instead of safetensors' "file not fully covered"
        tensors.update(load_file(str(f)))
    tensors = {k: v.float() for k, v in tensors.items() if not k.endswith("rotary_emb.inv_freq")}
    tok = path / "tokenizer.json"
    if tokenizer_sha256 is not None and (not tok.is_file() or file_sha256(tok) != tokenizer_sha256):
        log.warning(
            "%s %s: %s; the shards' token ids are taken to mean what this model learned "
            "(same vocabulary size %d) but that cannot be checked",
            option,
            path,
            "no tokenizer.json" if not tok.is_file() else "its tokenizer.json differs from the run's",
            config.vocab_size,
        )
    return InitWeights(config, tensors, f"{path} (Hugging Face Llama)", "hf", option)


def _hf_weight_files(path: Path) -> list[Path]:
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    index = path / _HF_INDEX
    if index.is_file():
        names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise MissingInput(f"{index}: lists {', '.join(missing)}, missing in {path}")
        return [path / n for n in names]
    raise MissingInput(
        f"{path}: no model.safetensors or {_HF_INDEX} (only safetensors weights are read; "
        "save with `save_pretrained(dir, safe_serialization=True)`)"
    )


def apply_init(model: torch.nn.Module, init: InitWeights) -> None:
    """Copy ``init.tensors`` into ``model`` (built from ``init.config``), every tensor accounted for.

    Raises:
        ValueError: a tensor missing, unexpected or of another shape, naming the option and the source
            (``init.option``: how the user gave it).
    """
    inner = checkpoint.unwrap_model(model)
    expected = inner.state_dict()
    tensors = dict(init.tensors)
    tied = init.config.tie_word_embeddings
    if tied:
        tensors.pop("lm_head.weight", None)  # the same matrix as the embedding
    want = {k for k in expected if not (tied and k == "lm_head.weight")}
    missing, extra = sorted(want - set(tensors)), sorted(set(tensors) - want)
    if missing or extra:
        raise InvalidInput(
            f"{init.option} {init.source}: "
            + "; ".join(
                p
                for p in (
                    f"missing {', '.join(missing)}" if missing else "",
                    f"unexpected {', '.join(extra)}" if extra else "",
                )
                if p
            )
        )
    for key, value in tensors.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise InvalidInput(
                f"{init.option} {init.source}: {key} has shape {tuple(value.shape)}, config implies {tuple(expected[key].shape)}"
            )
    with torch.no_grad():
        for key, value in tensors.items():
            expected[key].copy_(value)
    if tied:
        inner.lm_head.weight = inner.model.embed_tokens.weight


def architecture_differences(run_cfg: ModelConfig, init_cfg: ModelConfig) -> list[str]:
    """``"hidden_size 256 -> 64"`` for each [model] field that the init source overrides (vocab_size unset skipped)."""
    out = []
    for f in dataclasses.fields(ModelConfig):
        mine, theirs = getattr(run_cfg, f.name), getattr(init_cfg, f.name)
        if mine is not None and mine != theirs:
            out.append(f"{f.name} {mine!r} -> {theirs!r}")
    return out
