"""Crash-safe training checkpoints: the only owner of the run-dir checkpoint layout.

    run_dir/checkpoints/step_0000100/
        model.safetensors     clean HF keys; a tied lm_head is stored once as model.embed_tokens.weight
        config.json           ModelConfig.to_dict()
        optimizer.safetensors AdamW moments + step counts (tensors; param_groups in its JSON metadata)
        rng.safetensors       torch CPU/CUDA generator states
        trainer_state.json    {format_version, step, tokens_seen, tokenizer_sha256, train_config,
                               data_state, python_rng, numpy_rng, ...}
        tokenizer/            copy of the tokenizer dir, so a checkpoint is self-contained for export
        manifest.json         {format_version, files: {relpath: {bytes, sha256}}}
    run_dir/checkpoints/latest   text: the newest COMPLETE step dir name

A checkpoint is written into a hidden temporary folder, every file fsynced, the folder renamed
into place, and only then ``latest`` is rewritten (atomically), so a process killed at any moment
never leaves ``latest`` pointing at a partial checkpoint. Nothing here unpickles.

    python -c "from train.checkpoint import load_model; print(load_model('runs/demo/train')[2])"
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.files import file_sha256
from prodip.train.config import ModelConfig
from prodip.train.model import LlamaForCausalLM

FORMAT_VERSION = 1
CHECKPOINTS_DIRNAME = "checkpoints"
LATEST_FILE = "latest"
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
OPTIMIZER_FILE = "optimizer.safetensors"
RNG_FILE = "rng.safetensors"
TRAINER_STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
TOKENIZER_SUBDIR = "tokenizer"
TIED_KEY, TIED_ALIAS = "model.embed_tokens.weight", "lm_head.weight"
_PREFIXES = ("_orig_mod.", "module.")  # torch.compile and DDP wrappers


def step_dir_name(step: int) -> str:
    """``step_0000100`` for step 100 (7 digits, so names sort by step)."""
    return f"step_{step:07d}"


def model_sha256(ckpt_dir: str | os.PathLike) -> str:
    """The checkpoint's sha256: that of its ``model.safetensors`` bytes.

    Args:
        ckpt_dir: a step dir, checkpoints dir or run dir (see :func:`resolve_checkpoint`).
    Raises:
        FileNotFoundError: no checkpoint there.
    """
    return file_sha256(resolve_checkpoint(ckpt_dir) / MODEL_FILE)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module under DDP (``.module``) and ``torch.compile`` (``._orig_mod``) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def clean_state_dict(model: torch.nn.Module, tie_word_embeddings: bool) -> dict[str, torch.Tensor]:
    """State dict with wrapper prefixes removed, the tied alias dropped, contiguous CPU tensors.

    Returns:
        key -> tensor (dtype as trained, fp32 for mixed-precision training); when
        ``tie_word_embeddings`` the shared matrix appears once, as ``model.embed_tokens.weight``
        (safetensors refuses tensors sharing memory).
    """
    out = {}
    for key, tensor in unwrap_model(model).state_dict().items():
        for prefix in _PREFIXES:
            key = key.replace(prefix, "")
        if tie_word_embeddings and key == TIED_ALIAS:
            continue
        out[key] = tensor.detach().to("cpu").contiguous().clone()
    return out


# ---- writing ---------------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with open(Path(dirpath) / name, "rb+") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(dirpath))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], str]:
    """Flatten an optimizer state dict: tensors ``state.{param_idx}.{name}``, groups as JSON."""
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, state in sd["state"].items():
        for name, value in state.items():
            if torch.is_tensor(value):
                tensors[f"state.{idx}.{name}"] = value.detach().to("cpu").contiguous().clone()
            else:
                scalars[f"{idx}.{name}"] = value
    return tensors, json.dumps({"param_groups": sd["param_groups"], "scalars": scalars})


def _rng_tensors() -> dict[str, torch.Tensor]:
    out = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            out[f"torch_cuda_{i}"] = state
    return out


def _write_model_files(dest: Path, model: torch.nn.Module, model_config: ModelConfig) -> None:
    save_file(
        clean_state_dict(model, model_config.tie_word_embeddings), str(dest / MODEL_FILE), metadata={"format": "pt"}
    )
    _write_json(dest / CONFIG_FILE, model_config.to_dict())


def _copy_tokenizer(tokenizer_dir: Path, dest: Path) -> str:
    src = Path(tokenizer_dir)
    if not (src / "tokenizer.json").is_file():
        raise MissingInput(f"{src}/tokenizer.json: tokenizer dir not found (made by `prodip tokenizer train`)")
    dest.mkdir()
    for item in sorted(src.iterdir()):
        if item.is_file():
            shutil.copyfile(item, dest / item.name)
    return file_sha256(dest / "tokenizer.json")


def save_checkpoint(
    checkpoints_dir: str | os.PathLike,
    *,
    step: int,
    model: torch.nn.Module,
    model_config: ModelConfig,
    tokenizer_dir: str | os.PathLike,
    optimizer: Optional[torch.optim.Optimizer] = None,
    tokens_seen: int = 0,
    train_config: Optional[dict[str, Any]] = None,
    data_state: Optional[dict[str, Any]] = None,
    extra_state: Optional[dict[str, Any]] = None,
    keep_last: int = 3,
) -> Path:
    """Write ``checkpoints_dir/step_NNNNNNN`` atomically, then point ``latest`` at it.

    Args:
        checkpoints_dir: ``run_dir/checkpoints`` (created if missing).
        step: optimizer steps taken so far.
        model: the model (DDP/compile wrappers are removed from the keys).
        model_config: its config, written as ``config.json``.
        tokenizer_dir: tokenizer dir whose files are copied into ``tokenizer/``.
        optimizer: if given, its full state (AdamW moments, step counts, param groups).
        tokens_seen: training tokens consumed so far (all ranks).
        train_config: the resolved TrainConfig as a JSON-able dict.
        data_state: the data loader's exact position (JSON-able), see ``prodip.train.data``.
        extra_state: more JSON-able fields for ``trainer_state.json`` (e.g. python/numpy RNG).
        keep_last: keep this many newest complete checkpoints (>= 1); older ones are removed.

    Returns:
        The step dir path.
    Raises:
        FileNotFoundError: ``tokenizer_dir`` has no ``tokenizer.json``.
        ValueError: ``keep_last`` < 1.
    """
    if keep_last < 1:
        raise InvalidInput(f"keep_last must be >= 1, got {keep_last}")
    root = Path(checkpoints_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = step_dir_name(step)
    tmp = root / f".tmp_{name}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    _write_model_files(tmp, model, model_config)
    tok_sha = _copy_tokenizer(Path(tokenizer_dir), tmp / TOKENIZER_SUBDIR)
    if optimizer is not None:
        tensors, groups = _optimizer_tensors(optimizer)
        save_file(tensors, str(tmp / OPTIMIZER_FILE), metadata={"optimizer": groups})
    save_file(_rng_tensors(), str(tmp / RNG_FILE))
    state = {
        "format_version": FORMAT_VERSION,
        "step": step,
        "tokens_seen": tokens_seen,
        "tokenizer_sha256": tok_sha,
        "train_config": train_config or {},
        "data_state": data_state,
        **(extra_state or {}),
    }
    _write_json(tmp / TRAINER_STATE_FILE, state)
    files = {}
    for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
        files[path.relative_to(tmp).as_posix()] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    _write_json(tmp / MANIFEST_FILE, {"format_version": FORMAT_VERSION, "files": files})
    _fsync_tree(tmp)
    final = root / name
    if final.exists():  # re-saving a step (e.g. after a resume): move the old one aside first
        old = root / f".old_{name}_{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    _write_latest(root, name)
    _prune(root, keep_last, keep=name)
    return final


def _write_latest(root: Path, name: str) -> None:
    tmp = root / f".{LATEST_FILE}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, root / LATEST_FILE)
    _fsync_dir(root)


def _prune(root: Path, keep_last: int, keep: str) -> None:
    """Remove complete step dirs beyond the newest ``keep_last`` and stale temp dirs of dead runs."""
    steps = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))
    for old in steps[:-keep_last]:
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp_step_*"):
        if not stale.name.endswith(f"_{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)


# ---- reading ---------------------------------------------------------------------------------
def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """Find a step dir from a step dir, a checkpoints dir or a run dir (following ``latest``).

    Raises:
        FileNotFoundError: nothing checkpoint-like at ``path``, or ``latest`` names a missing dir.
    """
    path = Path(path)
    if (path / MANIFEST_FILE).is_file():  # a step dir (loading it verifies every listed file)
        return path
    for root in (path, path / CHECKPOINTS_DIRNAME):
        latest = root / LATEST_FILE
        if latest.is_file():
            name = latest.read_text(encoding="utf-8").strip()
            step = root / name
            if not (step / MANIFEST_FILE).is_file():
                raise MissingInput(f"{latest} names {name!r} but {step} holds no {MANIFEST_FILE}")
            return step
    raise MissingInput(
        f"{path}: no checkpoint (expected a step dir with {MANIFEST_FILE}, or a "
        f"run/checkpoints dir with a '{LATEST_FILE}' file; made by `prodip train`)"
    )


def verify_manifest(ckpt_dir: Path) -> dict[str, Any]:
    """Check every file listed in ``manifest.json`` (bytes + sha256) and that no file is unlisted.

    Raises:
        ValueError: bad manifest, a size/hash mismatch or an unlisted file, naming the file.
        FileNotFoundError: the manifest or a listed file is missing.
    """
    mpath = ckpt_dir / MANIFEST_FILE
    manifest = json.loads(mpath.read_text(encoding="utf-8"))
    if manifest.get("format_version") != FORMAT_VERSION:
        raise InvalidInput(f"{mpath}: format_version {manifest.get('format_version')!r}, expected {FORMAT_VERSION}")
    files = manifest["files"]
    for rel, meta in files.items():
        path = ckpt_dir / rel
        if not path.is_file():
            raise MissingInput(f"{path}: listed in {mpath} but missing")
        if path.stat().st_size != meta["bytes"]:
            raise InvalidInput(
                f"{path}: {path.stat().st_size} bytes, manifest says {meta['bytes']} (truncated or tampered)"
            )
        if file_sha256(path) != meta["sha256"]:
            raise InvalidInput(f"{path}: sha256 differs from {mpath} (tampered or corrupted)")
    for path in ckpt_dir.rglob("*"):
        rel = path.relative_to(ckpt_dir).as_posix()
        if path.is_file() and rel != MANIFEST_FILE and rel not in files:
            raise InvalidInput(f"{path}: not listed in {mpath} (foreign file in a checkpoint)")
    return manifest


def _check_tensors(path: Path, expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing:
        raise InvalidInput(f"{path}: missing tensor(s) {', '.join(missing)} for this config.json")
    if extra:
        raise InvalidInput(f"{path}: unexpected tensor(s) {', '.join(extra)} for this config.json")
    for key, ref in expected.items():
        if tuple(got[key].shape) != tuple(ref.shape):
            raise InvalidInput(
                f"{path}: tensor {key} has shape {tuple(got[key].shape)}, config.json implies {tuple(ref.shape)}"
            )


def load_model(
    path: str | os.PathLike, map_location: str | torch.device = "cpu"
) -> tuple[torch.nn.Module, ModelConfig, dict[str, Any]]:
    """Load a verified checkpoint into a fresh ``LlamaForCausalLM`` (fp32 as saved, eval mode).

    Args:
        path: step dir, checkpoints dir or run dir.
        map_location: device for the model.
    Returns:
        (model, config, info) with info = {"step", "model_sha256", "tokenizer_dir",
        "tokenizer_sha256", "checkpoint_dir"}.
    Raises:
        FileNotFoundError: no checkpoint / a listed file missing.
        ValueError: a hash mismatch naming the file; a missing/extra/mis-shaped tensor naming it
            and both shapes; a bad config.json; the tokenizer copy not matching trainer_state.json.
    """

    ckpt = resolve_checkpoint(path)
    manifest = verify_manifest(ckpt)
    config = ModelConfig.load(ckpt / CONFIG_FILE)
    state = json.loads((ckpt / TRAINER_STATE_FILE).read_text(encoding="utf-8"))
    tok_sha = file_sha256(ckpt / TOKENIZER_SUBDIR / "tokenizer.json")
    if state.get("tokenizer_sha256") != tok_sha:
        raise InvalidInput(
            f"{ckpt / TOKENIZER_SUBDIR}: tokenizer.json sha256 {tok_sha[:12]} differs from "
            f"{TRAINER_STATE_FILE}'s {str(state.get('tokenizer_sha256'))[:12]}"
        )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    expected = {k: v for k, v in model.state_dict().items() if not (config.tie_word_embeddings and k == TIED_ALIAS)}
    tensors = load_file(str(ckpt / MODEL_FILE), device=str(map_location))
    _check_tensors(ckpt / MODEL_FILE, expected, tensors)
    model = model.to_empty(device=map_location)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
        tensors = {**tensors, TIED_ALIAS: tensors[TIED_KEY]}
    model.load_state_dict(tensors, strict=True)
    model.eval()
    info = {
        "step": state["step"],
        "model_sha256": manifest["files"][MODEL_FILE]["sha256"],
        "tokenizer_dir": ckpt / TOKENIZER_SUBDIR,
        "tokenizer_sha256": tok_sha,
        "checkpoint_dir": ckpt,
    }
    return model, config, info


def load_training_state(
    path: str | os.PathLike,
    model: torch.nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore weights, optimizer state and torch RNG for ``--resume``; verify hashes first.

    Args:
        path: step dir, checkpoints dir or run dir.
        model: the (possibly wrapped) model to load into, already on its device.
        optimizer: built over the same parameters in the same order as when saved.
        restore_rng: also set torch CPU (and CUDA) RNG states.
    Returns:
        ``trainer_state.json`` as a dict, plus ``"checkpoint_dir"``.
    Raises:
        ValueError / FileNotFoundError: as :func:`load_model`; also a config.json differing from
            ``model.config`` or a checkpoint without optimizer state.
    """
    ckpt = resolve_checkpoint(path)
    verify_manifest(ckpt)
    inner = unwrap_model(model)
    config = ModelConfig.load(ckpt / CONFIG_FILE)
    if getattr(inner, "config", config) != config:
        raise InvalidInput(
            f"{ckpt / CONFIG_FILE}: model config differs from the run's [model] config; "
            "resume needs the same architecture"
        )
    tensors = load_file(str(ckpt / MODEL_FILE))
    expected = clean_state_dict(inner, config.tie_word_embeddings)
    _check_tensors(ckpt / MODEL_FILE, expected, tensors)
    if config.tie_word_embeddings:
        tensors[TIED_ALIAS] = tensors[TIED_KEY]
    inner.load_state_dict(tensors, strict=True)
    if optimizer is not None:
        _load_optimizer(ckpt / OPTIMIZER_FILE, optimizer)
    if restore_rng:
        rng = load_file(str(ckpt / RNG_FILE))
        torch.set_rng_state(rng["torch_cpu"])
        cuda = [rng[k] for k in sorted(rng) if k.startswith("torch_cuda_")]
        if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
    state = json.loads((ckpt / TRAINER_STATE_FILE).read_text(encoding="utf-8"))
    state["checkpoint_dir"] = str(ckpt)
    return state


def _load_optimizer(path: Path, optimizer: torch.optim.Optimizer) -> None:
    if not path.is_file():
        raise MissingInput(f"{path}: checkpoint has no optimizer state; cannot resume from it")
    with safe_open(str(path), framework="pt") as fh:
        meta = json.loads(fh.metadata()["optimizer"])
    tensors = load_file(str(path))
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = value
    for key, value in meta["scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    groups = [
        {k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in g.items()}
        for g in meta["param_groups"]
    ]  # JSON turned tuples (betas) into lists
    optimizer.load_state_dict({"state": state, "param_groups": groups})
