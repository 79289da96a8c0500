"""Crash-safe training checkpoints: the only owner of the run-dir checkpoint layout.

    run_dir/checkpoints/step_0000100/
        model.safetensors     clean HF keys; a tied lm_head is stored once as model.embed_tokens.weight
        config.json           ModelConfig.to_dict()
        optimizer.safetensors AdamW moments + step counts (tensors; param_groups in its JSON metadata)
        optimizer/            instead, in FSDP2 runs: the sharded AdamW state (torch.distributed.checkpoint,
                              one __{rank}_0.distcp per rank + .metadata; prodip.train.fsdp)
        rng.safetensors       torch CPU/CUDA generator states
        trainer_state.json    {format_version, step, tokens_seen, tokenizer_sha256, train_config,
                               data_state, python_rng, numpy_rng, ...}
        tokenizer/            copy of the tokenizer dir, so a checkpoint is self-contained for export
        manifest.json         {format_version, files: {relpath: {bytes, sha256}}}
    run_dir/checkpoints/latest   text: the newest COMPLETE step dir name

A checkpoint is written into a hidden temporary folder, every file hashed while written and
fsynced, the folder renamed into place, and only then ``latest`` is rewritten (atomically), so a
process killed at any moment never leaves ``latest`` pointing at a partial checkpoint. A save is
two halves: :func:`take_snapshot` copies the state to host memory, :func:`write_snapshot` writes
it (``prodip.train.saver`` runs the second half in a background thread). Nothing here unpickles.

    python -c "from prodip.train.checkpoint import load_model; print(load_model('runs/demo/train')[2])"
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TypedDict

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.files import file_sha256, writing
from prodip.base.jsontypes import JSONObject
from prodip.base.records import refuse_newer
from prodip.train.config import ModelConfig
from prodip.train.model import LlamaForCausalLM
from prodip.train.records import CHECKPOINT_MANIFEST_FILE, TRAINER_STATE_FILE, CheckpointManifest, TrainerState
from prodip.train.safetensors_stream import write_safetensors

FORMAT_VERSION = 1
CHECKPOINTS_DIRNAME = "checkpoints"
LATEST_FILE = "latest"
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_DCP_DIR = "optimizer"  # FSDP2 runs: sharded AdamW state, torch.distributed.checkpoint format
RNG_FILE = "rng.safetensors"
MANIFEST_FILE = CHECKPOINT_MANIFEST_FILE
TOKENIZER_SUBDIR = "tokenizer"
TIED_KEY, TIED_ALIAS = "model.embed_tokens.weight", "lm_head.weight"
_PREFIXES = ("_orig_mod.", "module.")  # torch.compile and DDP wrappers


def step_dir_name(step: int) -> str:
    """``step_0000100`` for step 100 (7 digits, so names sort by step)."""
    return f"step_{step:07d}"


def temp_dir_name(step: int, tag: Optional[str] = None) -> str:
    """Hidden folder a step dir is written into before its rename: ``.tmp_step_NNNNNNN_{tag}``
    (default tag: this process id; :func:`_prune` removes those of dead writers)."""
    return f".tmp_{step_dir_name(step)}_{os.getpid() if tag is None else tag}"


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


def _write_json(path: Path, data: JSONObject) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


class SaveArgs(TypedDict):
    """The keywords of a checkpoint save besides the model (:func:`save_checkpoint`, :func:`write_snapshot`): what
    the trainer hands every save, and the background saver each write."""

    step: int
    model_config: ModelConfig
    tokenizer_dir: str | Path
    tokens_seen: int
    train_config: JSONObject
    data_state: JSONObject
    keep_last: int
    extra_state: JSONObject


@dataclass(frozen=True)
class Resumed:
    """What :func:`load_training_state` (and ``prodip.train.fsdp``'s) restored: the checkpoint's
    ``trainer_state.json`` and the step dir it came from."""

    state: TrainerState
    checkpoint_dir: Path


@dataclass
class Snapshot:
    """Host copies of what a checkpoint holds, taken at one step; see :func:`take_snapshot`.

    Attributes:
        model: clean key -> CPU tensor (dtype as trained).
        optimizer: ``state.{param_idx}.{name}`` -> CPU tensor, or None (no optimizer state).
        optimizer_meta: JSON of the param groups and non-tensor state, or None.
        rng: torch CPU/CUDA generator states (uint8 CPU tensors).
        ready: a CUDA event recorded after the device-to-host copies (None on CPU): a reader in
            another thread waits on it (:meth:`wait_ready`) before touching the tensors.
    """

    model: dict[str, torch.Tensor]
    optimizer: Optional[dict[str, torch.Tensor]]
    optimizer_meta: Optional[str]
    rng: dict[str, torch.Tensor]
    ready: Any = None

    def wait_ready(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()


def _host_buffer(name: str, src: torch.Tensor, buffers: dict[str, torch.Tensor], zero: bool = False) -> torch.Tensor:
    """``buffers[name]``, (re)allocated on the host when missing or of another shape or dtype: pinned
    for a CUDA ``src``; ``zero`` touches every page now, so a later copy does not page-fault."""
    buf = buffers.get(name)
    if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
        make = torch.zeros if zero else torch.empty
        buf = buffers[name] = make(src.shape, dtype=src.dtype, device="cpu", pin_memory=src.is_cuda)
    return buf


def _stage(name: str, tensor: torch.Tensor, buffers: Optional[dict[str, torch.Tensor]]) -> torch.Tensor:
    """Copy ``tensor`` to the host; into ``buffers[name]`` (allocated on first use) when given.

    From CUDA the copy is non-blocking into pinned memory, so it is only queued on the current
    stream (ordered before any later in-place update of the source); see :class:`Snapshot`.
    """
    src = tensor.detach()
    if buffers is None:
        return src.to("cpu", copy=True).contiguous() if src.device.type != "cpu" else src.contiguous().clone()
    buf = _host_buffer(name, src, buffers)
    buf.copy_(src, non_blocking=src.is_cuda)
    return buf


def take_snapshot(
    model: torch.nn.Module,
    tie_word_embeddings: bool,
    optimizer: Optional[torch.optim.Optimizer] = None,
    buffers: Optional[dict[str, torch.Tensor]] = None,
    model_only: bool = False,
    stage: bool = True,
) -> Snapshot:
    """Copy the model (clean keys), optimizer state and RNG to the host, for a later write.

    Args:
        model: the (possibly wrapped) model.
        tie_word_embeddings: drop the tied ``lm_head.weight`` alias (stored once).
        optimizer: if given (and not ``model_only``), its full state.
        buffers: reusable host buffers by name (pinned for CUDA sources); ``None`` makes fresh
            copies. A caller that reuses buffers must not take a new snapshot into them before the
            previous one has been written.
        model_only: only the model tensors (a DDP rank that hashes but does not write).
        stage: False returns the live tensors (no copy yet; RNG and the optimizer's param groups
            are read now): call :func:`stage_snapshot` before anything updates them in place.
    Returns:
        The :class:`Snapshot`; with CUDA sources, wait on ``ready`` before reading it.
    """
    tensors = {}
    for key, tensor in unwrap_model(model).state_dict().items():
        for prefix in _PREFIXES:
            key = key.replace(prefix, "")
        if not (tie_word_embeddings and key == TIED_ALIAS):
            tensors[key] = tensor.detach()
    opt_tensors, meta = None, None
    if optimizer is not None and not model_only:
        sd = optimizer.state_dict()
        opt_tensors, scalars = {}, {}
        for idx, state in sd["state"].items():
            for name, value in state.items():
                if torch.is_tensor(value):
                    opt_tensors[f"state.{idx}.{name}"] = value.detach()
                else:
                    scalars[f"{idx}.{name}"] = value
        meta = json.dumps({"param_groups": sd["param_groups"], "scalars": scalars})
    snap = Snapshot(tensors, opt_tensors, meta, {} if model_only else _rng_tensors())
    if stage:
        stage_snapshot(snap, buffers)
    return snap


def stage_snapshot(snap: Snapshot, buffers: Optional[dict[str, torch.Tensor]] = None) -> None:
    """Replace the snapshot's live tensors by host copies (see :func:`take_snapshot`), in place.

    From CUDA the copies are queued (non-blocking, into pinned buffers) and ``snap.ready``
    records their completion; from CPU they are done when this returns.
    """
    snap.model = {k: _stage("model." + k, t, buffers) for k, t in snap.model.items()}
    if snap.optimizer is not None:
        snap.optimizer = {k: _stage("opt." + k, t, buffers) for k, t in snap.optimizer.items()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        snap.ready = torch.cuda.Event()
        snap.ready.record()


def allocate_buffers(snap: Snapshot, buffers: dict[str, torch.Tensor]) -> None:
    """Fill ``buffers`` with zeroed host tensors shaped like the live tensors of an unstaged
    snapshot (``take_snapshot(..., stage=False)``), under the names :func:`stage_snapshot` uses;
    pinned for CUDA sources. Zeroing touches every page, so a later copy does not page-fault."""
    for prefix, tensors in (("model.", snap.model), ("opt.", snap.optimizer or {})):
        for key, src in tensors.items():
            _host_buffer(prefix + key, src.detach(), buffers, zero=True)


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over each ``name`` and tensor's bytes, in dict order (CPU tensors)."""
    h = hashlib.sha256()
    for name, t in tensors.items():
        h.update(name.encode())
        if t.numel():
            h.update(memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


def _rng_tensors() -> dict[str, torch.Tensor]:
    out = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            out[f"torch_cuda_{i}"] = state
    return out


#: Files of a run's tokenizer dir a checkpoint's copy leaves out: model weights. An adapted base's run uses the
#: extended Hugging Face folder (``prodip tokenizer extend``: tokenizer, resized weights, records) as its tokenizer
#: dir, and every checkpoint would otherwise hold another copy of the base's weights.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".onnx_data", ".data", ".pte", ".ckpt")


def _is_weights(name: str) -> bool:
    """A weights file or a sharded-weights index (``model.safetensors.index.json``) by its name."""
    return name.endswith(WEIGHT_SUFFIXES) or any(name.endswith(s + ".index.json") for s in WEIGHT_SUFFIXES)


def _copy_tokenizer(tokenizer_dir: Path, dest: Path) -> str:
    """Copy the run's tokenizer dir into a checkpoint (fsynced), its weights files left out (:data:`WEIGHT_SUFFIXES`).

    Returns:
        sha256 of the copied ``tokenizer.json``.
    Raises:
        MissingInput: no ``tokenizer.json`` in ``tokenizer_dir``.
    """
    src = Path(tokenizer_dir)
    if not (src / "tokenizer.json").is_file():
        raise MissingInput(f"{src}/tokenizer.json: tokenizer dir not found (made by `prodip tokenizer train`)")
    dest.mkdir()
    for item in sorted(src.iterdir()):
        if item.is_file() and not _is_weights(item.name):
            shutil.copyfile(item, dest / item.name)
            with open(dest / item.name, "rb+") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(dest)
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
    train_config: Optional[JSONObject] = None,
    data_state: Optional[JSONObject] = None,
    extra_state: Optional[JSONObject] = None,
    keep_last: int = 3,
) -> Path:
    """Write ``checkpoints_dir/step_NNNNNNN`` atomically, then point ``latest`` at it (blocking).

    :func:`take_snapshot` then :func:`write_snapshot`; ``prodip.train.saver.AsyncCheckpointer``
    does the same with the write in a background thread.

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
    snap = take_snapshot(model, model_config.tie_word_embeddings, optimizer)
    snap.wait_ready()
    return write_snapshot(
        checkpoints_dir,
        snap,
        step=step,
        model_config=model_config,
        tokenizer_dir=tokenizer_dir,
        tokens_seen=tokens_seen,
        train_config=train_config,
        data_state=data_state,
        extra_state=extra_state,
        keep_last=keep_last,
    )


def write_snapshot(
    checkpoints_dir: str | os.PathLike,
    snap: Snapshot,
    *,
    step: int,
    model_config: ModelConfig,
    tokenizer_dir: str | os.PathLike,
    tokens_seen: int = 0,
    train_config: Optional[JSONObject] = None,
    data_state: Optional[JSONObject] = None,
    extra_state: Optional[JSONObject] = None,
    keep_last: int = 3,
    prepared_dir: Optional[Path] = None,
) -> Path:
    """Write a :class:`Snapshot` as ``checkpoints_dir/step_NNNNNNN``, crash-safely.

    Every file goes into a hidden temporary folder, is hashed while written and fsynced; the
    manifest is written last, the folder renamed into place, and only then ``latest`` rewritten
    (atomically). A process killed at any moment leaves ``latest`` naming a complete checkpoint.
    Safe to call from a background thread (it touches only the snapshot and the disk).

    Args and Raises: as :func:`save_checkpoint` (``snap`` replaces model and optimizer), and
        prepared_dir: a temporary folder (``temp_dir_name``) already holding files written by
            others (FSDP2's sharded optimizer state, ``OPTIMIZER_DCP_DIR``); they are hashed
            into the manifest like every other file.
    Returns:
        The step dir path.
    """
    if keep_last < 1:
        raise InvalidInput(f"keep_last must be >= 1, got {keep_last}")
    root = Path(checkpoints_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = step_dir_name(step)
    if prepared_dir is None:
        tmp = root / temp_dir_name(step)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    else:
        tmp = Path(prepared_dir)
    snap.wait_ready()
    with writing(tmp, shown_as=root / name, remove_on_error=True):  # a full disk: one line naming the file
        files: dict[str, JSONObject] = {}
        written = [(MODEL_FILE, snap.model, {"format": "pt"}), (RNG_FILE, snap.rng, None)]
        if snap.optimizer is not None:
            written.append((OPTIMIZER_FILE, snap.optimizer, {"optimizer": snap.optimizer_meta}))
        for rel, tensors, meta in written:
            size, sha = write_safetensors(tmp / rel, tensors, meta)
            files[rel] = {"bytes": size, "sha256": sha}
        tok_sha = _copy_tokenizer(Path(tokenizer_dir), tmp / TOKENIZER_SUBDIR)
        state = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "tokens_seen": tokens_seen,
            "tokenizer_sha256": tok_sha,
            "train_config": train_config or {},
            "data_state": data_state,
            **(extra_state or {}),
        }
        _write_json(tmp / CONFIG_FILE, model_config.to_dict())
        TrainerState.from_dict(state, root / name / TRAINER_STATE_FILE).write(tmp / TRAINER_STATE_FILE)
        for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
            rel = path.relative_to(tmp).as_posix()
            if rel not in files:  # small files: json, tokenizer copy
                files[rel] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
        listed = {"format_version": FORMAT_VERSION, "files": dict(sorted(files.items()))}
        CheckpointManifest.from_dict(listed, root / name / MANIFEST_FILE).write(tmp / MANIFEST_FILE)
        for rel in (CONFIG_FILE, TRAINER_STATE_FILE, MANIFEST_FILE):
            with open(tmp / rel, "rb+") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        final = root / name
        if final.exists():  # re-saving a step (e.g. after a resume): move the old one aside first
            for record in (TrainerState, CheckpointManifest):  # never one a newer prodip wrote
                refuse_newer(record, final / record.FILE, action="saving a checkpoint", instead="move it away")
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


def refuse_newer_checkpoints(checkpoints_dir: str | os.PathLike, *, action: str = "prodip train") -> None:
    """Refuse to train into ``checkpoints_dir`` when a step dir there was written by a newer prodip.

    A run replaces a step dir of the number it saves and prunes the older ones (:func:`write_snapshot`), so a
    checkpoint this prodip cannot read must stop the run before its first step, not be deleted by it.

    Raises:
        OutputExists: a ``step_*/trainer_state.json`` or ``manifest.json`` has a format_version newer than this
            prodip reads (the file and the version named; :func:`prodip.base.records.refuse_newer`).
    """
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return
    for step in sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_")):
        for record in (TrainerState, CheckpointManifest):
            refuse_newer(record, step / record.FILE, action=action, instead="choose another --out-dir")


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
def resolve_checkpoint(path: str | os.PathLike, *, or_hf_folder: bool = False) -> Path:
    """Find a step dir from a step dir, a checkpoints dir or a run dir (following ``latest``).

    Args:
        path: the dir given on the command line.
        or_hf_folder: the command also reads a Hugging Face folder (``prodip export``, ``prodip
            conformance``): the no-checkpoint message names that layout too, and which of its files
            are missing, so a folder lacking ``config.json`` is not taken for a bad checkpoint.

    Raises:
        FileNotFoundError: nothing checkpoint-like at ``path``, ``latest`` names a missing dir, or ``path``
            is a prodip export dir (its ``manifest.json`` is an export's: the message names the checkpoint
            it was exported from). So ``--init-from EXPORT_DIR`` reads an export as the Hugging Face folder
            it is, and ``prodip export``/``eval``/``conformance`` given one say so instead of failing on a
            file a checkpoint has and an export lacks.
    """
    path = Path(path)
    if (path / MANIFEST_FILE).is_file():  # a step dir (loading it verifies every listed file)
        _refuse_export_dir(path)
        return path
    for root in (path, path / CHECKPOINTS_DIRNAME):
        latest = root / LATEST_FILE
        if latest.is_file():
            name = latest.read_text(encoding="utf-8").strip()
            step = root / name
            if not (step / MANIFEST_FILE).is_file():
                raise MissingInput(f"{latest} names {name!r} but {step} holds no {MANIFEST_FILE}")
            return step
    prodip = (
        f"a step dir with {MANIFEST_FILE}, or a run/checkpoints dir with a '{LATEST_FILE}' file; made by `prodip train`"
    )
    if not or_hf_folder:
        raise MissingInput(f"{path}: no checkpoint (expected {prodip})")
    hf_files = ("config.json", "model.safetensors", "tokenizer.json")
    missing = [f for f in hf_files if not (path / f).is_file()]
    if "model.safetensors" in missing and (path / "model.safetensors.index.json").is_file():
        missing.remove("model.safetensors")  # sharded weights
    raise MissingInput(
        f"{path}: neither a prodip checkpoint ({prodip}) nor a Hugging Face folder "
        f"({' + '.join(hf_files)}; missing here: {', '.join(missing)})"
    )


def require_checkpoint_tokenizer(checkpoint: str | os.PathLike) -> Path:
    """Resolve a checkpoint and check it holds its ``tokenizer/tokenizer.json`` copy.

    Args:
        checkpoint: a step dir, checkpoints dir or run dir.
    Returns:
        The resolved step dir.
    Raises:
        FileNotFoundError: no checkpoint there, or its ``tokenizer/tokenizer.json`` is missing
            (named, with the command that writes it).
    """
    ckpt = resolve_checkpoint(checkpoint, or_hf_folder=True)  # its callers read HF folders too
    tok = ckpt / TOKENIZER_SUBDIR / "tokenizer.json"
    if not tok.is_file():
        raise MissingInput(
            f"{tok}: missing; a checkpoint must carry its tokenizer copy (written by `prodip train`, "
            "which copies the dir made by `prodip tokenizer train`). Re-save the checkpoint with `prodip train`, "
            f"or copy tokenizer.json, tokenizer_config.json and special_tokens_map.json of the tokenizer it was "
            f"trained with into {tok.parent}/ and list them in {ckpt / 'manifest.json'}"
        )
    return ckpt


def is_hf_folder(path: str | os.PathLike) -> bool:
    """A Hugging Face model folder (``config.json``, no prodip checkpoint there)."""
    p = Path(path)
    if not (p / "config.json").is_file():
        return False
    try:
        resolve_checkpoint(p)
    except FileNotFoundError:
        return True
    return False


def _refuse_export_dir(path: Path) -> None:
    """Raise when ``path/manifest.json`` is a prodip export's (it has ``source_checkpoint``; a checkpoint's
    has only ``files`` and ``format_version``). An unreadable manifest passes: the checkpoint reader names
    what is wrong with it.

    Raises:
        FileNotFoundError: ``path`` is an export dir (naming the checkpoint it was exported from).
    """
    try:
        doc = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return
    if not (isinstance(doc, dict) and "source_checkpoint" in doc):
        return
    source = doc["source_checkpoint"]
    made_from = source.get("path") if isinstance(source, dict) else None
    raise MissingInput(
        f"{path}: a prodip export dir (made by `prodip export`), not a checkpoint; pass the run or step dir "
        f"`prodip train` wrote" + (f", e.g. the one it was exported from: {made_from}" if made_from else "")
    )


def verify_manifest(ckpt_dir: Path) -> CheckpointManifest:
    """Check every file listed in ``manifest.json`` (bytes + sha256) and that no file is unlisted.

    Raises:
        ValueError: bad manifest, a size/hash mismatch or an unlisted file, naming the file.
        FileNotFoundError: the manifest or a listed file is missing.
    """
    mpath = ckpt_dir / MANIFEST_FILE
    manifest = CheckpointManifest.read(mpath)
    files = manifest.files
    for rel, meta in files.items():
        path = ckpt_dir / rel
        if not path.is_file():
            raise MissingInput(f"{path}: listed in {mpath} but missing")
        if path.stat().st_size != meta.bytes:
            raise InvalidInput(
                f"{path}: {path.stat().st_size} bytes, manifest says {meta.bytes} (truncated or tampered)"
            )
        if file_sha256(path) != meta.sha256:
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
    state = TrainerState.read(ckpt / TRAINER_STATE_FILE)
    tok_sha = file_sha256(ckpt / TOKENIZER_SUBDIR / "tokenizer.json")
    if state.tokenizer_sha256 != tok_sha:
        raise InvalidInput(
            f"{ckpt / TOKENIZER_SUBDIR}: tokenizer.json sha256 {tok_sha[:12]} differs from "
            f"{TRAINER_STATE_FILE}'s {state.tokenizer_sha256[:12]}"
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
        "step": state.step,
        "model_sha256": manifest.files[MODEL_FILE].sha256,
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
) -> Resumed:
    """Restore weights, optimizer state and torch RNG for ``--resume``; verify hashes first.

    Args:
        path: step dir, checkpoints dir or run dir.
        model: the (possibly wrapped) model to load into, already on its device.
        optimizer: built over the same parameters in the same order as when saved.
        restore_rng: also set torch CPU (and CUDA) RNG states.
    Returns:
        :class:`Resumed`: ``trainer_state.json`` as a :class:`TrainerState` and the step dir.
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
    return Resumed(TrainerState.read(ckpt / TRAINER_STATE_FILE), ckpt)


def _load_optimizer(path: Path, optimizer: torch.optim.Optimizer) -> None:
    if not path.is_file():
        raise MissingInput(f"{path}: checkpoint has no optimizer state; cannot resume from it")
    with safe_open(str(path), framework="pt") as fh:
        meta = json.loads(fh.metadata()["optimizer"])
    tensors = load_file(str(path))
    state: dict[int, dict[str, object]] = {}  # param index -> tensors (safetensors) and scalars (metadata)
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
