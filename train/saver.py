"""Checkpoints that do not stop training: snapshot to host memory, write in a background thread.

:class:`AsyncCheckpointer` splits a save in two. On the training thread it waits for the previous
save to finish (its host buffers are reused), reads RNG, data position and the optimizer's param
groups, and takes the model and optimizer tensors into host buffers (pinned, allocated once). From
CUDA the copies are only queued there, ordered on the stream before the next step's in-place
updates. From CPU the copies are made by the background thread while training goes on: parameters
and AdamW state change only inside ``optimizer.step``, so a step pre-hook holds the next
``optimizer.step`` until the copy is complete (forward and backward of the next step overlap
with it). The background thread then hashes the model copy (DDP: every rank,
gathered over a dedicated gloo group and compared, as ``param_sha256_by_rank``) and, on rank 0,
writes the checkpoint with :func:`prodip.train.checkpoint.write_snapshot` (hashed while written,
fsynced, renamed into place, ``latest`` last), so crash safety is that of a blocking save. The
design is that of ``torch.distributed.checkpoint.async_save`` (stage to CPU, write in a thread,
collectives on a separate gloo group), kept on this project's single-file safetensors layout
that export and eval read. The host buffers (4.75 GB for the 0.4B model with AdamW) are allocated
by :meth:`AsyncCheckpointer.prepare` in the background after a run's first step, so no save
allocates them while training waits.

    python -m pytest tests/train/test_saver.py -q
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from prodip.base.jsontypes import JSONObject
from prodip.train import checkpoint
from prodip.train.config import ModelConfig


class AsyncCheckpointer:
    """One save in flight at a time; errors of a background write surface at the next call.

    Args:
        checkpoints_dir: ``run_dir/checkpoints``.
        rank, world_size: this process's place (``world_size`` > 1 needs an initialised process
            group; a gloo group for the background collectives is created here, by every rank).
        background: False writes on the calling thread (the blocking behaviour, for comparison).
    """

    def __init__(
        self, checkpoints_dir: str | Path, *, rank: int = 0, world_size: int = 1, background: bool = True
    ) -> None:
        self.dir, self.rank, self.world_size = Path(checkpoints_dir), rank, world_size
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prodip-ckpt") if background else None
        self._future: Optional[Future] = None
        self._buffers: dict[str, torch.Tensor] = {}
        self._group = dist.new_group(backend="gloo") if world_size > 1 else None
        self.last_write_s: Optional[float] = None
        self._staged: Optional[threading.Event] = None  # set once a CPU snapshot's copy is complete
        self._hooked: set[int] = set()
        self._held_s = 0.0

    def save(
        self,
        *,
        step: int,
        model: torch.nn.Module,
        model_config: ModelConfig,
        optimizer: torch.optim.Optimizer,
        tokenizer_dir: str | Path,
        tokens_seen: int,
        train_config: JSONObject,
        data_state: JSONObject,
        keep_last: int,
        extra_state: Optional[JSONObject] = None,
    ) -> float:
        """Start saving step ``step``; returns the seconds the caller was held now (from CPU, the
        next ``optimizer.step`` may be held too, until the copy is complete: :meth:`pop_held_s`).

        Every rank calls this at the same step. Data state, RNG and ``extra_state`` are read now.

        Raises:
            RuntimeError: DDP ranks hold different parameters (raised by the background write,
                so at the next ``save``/``wait``/``close``), or any error of a previous write.
        """
        start = time.perf_counter()
        self.wait()
        on_cuda = any(p.is_cuda for p in checkpoint.unwrap_model(model).parameters())
        deferred = self._pool is not None and not on_cuda  # CPU: copied by the background thread
        snap = checkpoint.take_snapshot(
            model,
            model_config.tie_word_embeddings,
            optimizer,
            self._buffers,
            model_only=self.rank != 0,
            stage=not deferred,
        )
        self._staged = threading.Event() if deferred else None
        if deferred and id(optimizer) not in self._hooked:
            optimizer.register_step_pre_hook(self._before_optimizer_step)
            self._hooked.add(id(optimizer))
        kwargs: checkpoint.SaveArgs = {
            "step": step,
            "model_config": model_config,
            "tokenizer_dir": tokenizer_dir,
            "tokens_seen": tokens_seen,
            "train_config": train_config,
            "data_state": data_state,
            "extra_state": {"world_size": self.world_size, **(extra_state or {})},
            "keep_last": keep_last,
        }
        if self._pool is None:
            self._write(snap, kwargs)
        else:
            self._future = self._pool.submit(self._write, snap, kwargs)
        return time.perf_counter() - start

    def prepare(self, *, model: torch.nn.Module, tie_word_embeddings: bool, optimizer: torch.optim.Optimizer) -> None:
        """Allocate (and first-touch) the host buffers of a save in the background, now.

        Call once the optimizer holds its state (after the first ``optimizer.step``): the first
        save then finds its 4-byte-per-element copies of the model and AdamW moments ready
        (for the 0.4B model, 4.75 GB) instead of allocating and page-faulting them while training
        waits. Pinned memory when the model is on CUDA. Does nothing when writing on the calling
        thread, when buffers exist already, or while a save is in flight (it allocates them).
        """
        if self._pool is None or self._future is not None or self._buffers:
            return
        snap = checkpoint.take_snapshot(
            model, tie_word_embeddings, optimizer, None, model_only=self.rank != 0, stage=False
        )
        self._future = self._pool.submit(checkpoint.allocate_buffers, snap, self._buffers)

    def _before_optimizer_step(self, *_args) -> None:
        """Hold ``optimizer.step`` (it updates parameters and AdamW state in place) until the
        snapshot's host copy is complete; the time held counts as stall (:meth:`pop_held_s`)."""
        staged = self._staged
        if staged is not None and not staged.is_set():
            start = time.perf_counter()
            staged.wait()
            self._held_s += time.perf_counter() - start

    def pop_held_s(self) -> float:
        """Seconds ``optimizer.step`` was held for snapshot copies since the last call."""
        held, self._held_s = self._held_s, 0.0
        return held

    def _write(self, snap: checkpoint.Snapshot, kwargs: checkpoint.SaveArgs) -> None:
        start = time.perf_counter()
        staged = self._staged
        if staged is not None:
            try:
                checkpoint.stage_snapshot(snap, self._buffers)
            finally:
                staged.set()  # also on an error: never leave the training thread waiting
        snap.wait_ready()
        if self._group is not None:  # ranks must hold identical weights; record and check it
            hashes: list = [None] * self.world_size
            dist.all_gather_object(hashes, checkpoint.tensors_sha256(snap.model), group=self._group)
            if len(set(hashes)) != 1:
                raise RuntimeError(
                    f"step {kwargs['step']}: DDP ranks hold different parameters "
                    f"(sha256 per rank: {hashes}); not saving"
                )
            kwargs["extra_state"]["param_sha256_by_rank"] = hashes
        if self.rank == 0:
            checkpoint.write_snapshot(self.dir, snap, **kwargs)
        self.last_write_s = time.perf_counter() - start

    @property
    def busy(self) -> bool:
        """A save (or the buffers' allocation) is still in flight."""
        return self._future is not None and not self._future.done()

    def wait(self) -> None:
        """Block until the save in flight (if any) is on disk; re-raise its error."""
        future, self._future = self._future, None
        if future is not None:
            future.result()

    def close(self) -> None:
        """:meth:`wait`, then stop the thread and free the host buffers."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._buffers.clear()  # the gloo group goes with the default group (distributed.teardown)
