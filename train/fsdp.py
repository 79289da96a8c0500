"""FSDP2 (``fully_shard``): weights, gradients and AdamW state sharded over the ranks.

For models whose replicated weights + AdamW state (16 B/parameter) do not fit one GPU beside the
activations. ``TrainConfig.parallel = "fsdp"`` under torchrun: every decoder layer is one FSDP2
unit (all-gathered for its forward and backward, gradients reduce-scattered), the root holds the
embedding, final norm and lm_head (torchtitan's layout). Same code on CPU with gloo, which is how
the tests check that 2 ranks train like 1 process.

Checkpoints keep the layout of ``prodip.train.checkpoint`` (one step dir, manifest, ``latest``
last), so export and eval read them unchanged: ``model.safetensors`` is the full model gathered
to rank 0; the AdamW state is saved sharded, each rank writing its own shard, with
``torch.distributed.checkpoint`` into ``optimizer/`` (it can be loaded at another world size).

    torchrun --nproc_per_node 2 -m prodip.train train --config configs/demo.toml --device cpu --parallel fsdp
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.jsontypes import JSONObject
from prodip.train import checkpoint
from prodip.train.config import ModelConfig
from prodip.train.records import TrainerState


def shard_model(model: torch.nn.Module, device: torch.device) -> None:
    """Apply ``fully_shard`` to each decoder layer, then to the root (in place).

    Args:
        model: a ``LlamaForCausalLM`` on ``device``, in an initialised process group.
    """
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def save_checkpoint(
    checkpoints_dir: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rank: int,
    world_size: int,
    step: int,
    model_config: ModelConfig,
    tokenizer_dir: str | Path,
    tokens_seen: int,
    train_config: JSONObject,
    data_state: JSONObject,
    keep_last: int,
    extra_state: JSONObject | None = None,
) -> float:
    """Save an FSDP2 run's step dir (every rank calls it at the same step); blocking.

    Returns:
        Seconds training was held (the whole save).
    Raises:
        FileNotFoundError / ValueError: as :func:`prodip.train.checkpoint.write_snapshot`.
    """
    start = time.perf_counter()
    root = Path(checkpoints_dir)
    tmp = root / checkpoint.temp_dir_name(step, tag="fsdp")
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    dist.barrier()
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    dcp.save(
        {"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(tmp / checkpoint.OPTIMIZER_DCP_DIR)
    )
    if rank == 0:
        tensors = {
            k: v.contiguous()
            for k, v in full.items()
            if not (model_config.tie_word_embeddings and k == checkpoint.TIED_ALIAS)
        }
        snap = checkpoint.Snapshot(tensors, None, None, checkpoint._rng_tensors())
        checkpoint.write_snapshot(
            root,
            snap,
            step=step,
            model_config=model_config,
            tokenizer_dir=tokenizer_dir,
            tokens_seen=tokens_seen,
            train_config=train_config,
            data_state=data_state,
            extra_state={"world_size": world_size, "parallel": "fsdp", **(extra_state or {})},
            keep_last=keep_last,
            prepared_dir=tmp,
        )
    dist.barrier()
    return time.perf_counter() - start


def load_training_state(
    path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, restore_rng: bool = True
) -> checkpoint.Resumed:
    """Resume an FSDP2 run: full weights from ``model.safetensors``, sharded AdamW state via DCP.

    Args:
        path: step dir, checkpoints dir or run dir.
        model: the ``fully_shard``-ed model; optimizer: its AdamW.
    Returns:
        :class:`prodip.train.checkpoint.Resumed`: the checkpoint's :class:`TrainerState` and its step dir.
    Raises:
        FileNotFoundError: no checkpoint, or one without ``optimizer/`` (a DDP run's checkpoint:
            resume it with ``parallel = "ddp"``).
        ValueError: a hash mismatch or another model config (as ``checkpoint.load_training_state``).
    """
    ckpt = checkpoint.resolve_checkpoint(path)
    checkpoint.verify_manifest(ckpt)
    config = ModelConfig.load(ckpt / checkpoint.CONFIG_FILE)
    if getattr(model, "config", config) != config:
        raise InvalidInput(
            f"{ckpt / checkpoint.CONFIG_FILE}: model config differs from the run's [model] "
            "config; resume needs the same architecture"
        )
    opt_dir = ckpt / checkpoint.OPTIMIZER_DCP_DIR
    if not opt_dir.is_dir():
        raise MissingInput(
            f"{opt_dir}: no sharded optimizer state (written by an FSDP run); this "
            "checkpoint is a DDP run's: resume it with --parallel ddp"
        )
    tensors = load_file(str(ckpt / checkpoint.MODEL_FILE))
    if config.tie_word_embeddings:
        tensors[checkpoint.TIED_ALIAS] = tensors[checkpoint.TIED_KEY]
    set_model_state_dict(model, tensors, options=StateDictOptions(full_state_dict=True))
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=str(opt_dir))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    if restore_rng:
        rng = load_file(str(ckpt / checkpoint.RNG_FILE))
        torch.set_rng_state(rng["torch_cpu"])
    return checkpoint.Resumed(TrainerState.read(ckpt / checkpoint.TRAINER_STATE_FILE), ckpt)
