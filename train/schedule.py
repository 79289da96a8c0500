"""Learning-rate schedules by optimizer step: cosine (the default) and warmup-stable-decay.

``cosine`` is :func:`prodip.train.loop.lr_at` (linear warmup, cosine to ``min_lr`` over ``steps``):
its value at every step depends on ``steps``, so a run extended past its plan (``--steps`` raised
on ``--resume``) would jump back up the curve. ``wsd`` (warmup-stable-decay: Hu et al. 2024,
MiniCPM, arXiv:2404.06395; Hägele et al. 2024, arXiv:2405.18392) holds ``lr`` flat after warmup
and decays linearly to ``min_lr`` over the last ``decay_fraction`` of ``steps``: up to the start
of that decay the learning rate does not depend on ``steps``, so a run can be extended (resume
with a larger ``--steps``) with no jump, as long as its decay has not started. Past that point, or
for a cosine run, train longer by starting a new schedule from the checkpoint's weights
(``prodip train --init-from RUN_DIR``: fresh optimizer and warmup).

    python -c "from prodip.train.schedule import lr_for; print([lr_for(s, schedule='wsd', lr=1.0, min_lr=0.1, warmup_steps=2, total_steps=10, decay_fraction=0.3) for s in range(10)])"
"""

from __future__ import annotations

import math

from prodip.base.errors import InvalidInput
from prodip.train.config import SCHEDULES
from prodip.train.loop import lr_at


def decay_start(total_steps: int, warmup_steps: int, decay_fraction: float) -> int:
    """First step of the wsd decay: ``steps - ceil(decay_fraction * steps)``, never inside warmup."""
    return max(warmup_steps, total_steps - math.ceil(decay_fraction * total_steps))


def lr_for(
    step: int,
    *,
    schedule: str,
    lr: float,
    min_lr: float,
    warmup_steps: int,
    total_steps: int,
    decay_fraction: float = 0.2,
) -> float:
    """Learning rate of optimizer step ``step`` (0-based) under ``schedule``.

    Args:
        step: optimizer steps already taken.
        schedule: ``"cosine"`` or ``"wsd"`` (see the module docstring).
        lr, min_lr: peak and final learning rate.
        warmup_steps: linear warmup from ``lr / warmup_steps`` to ``lr`` (steps).
        total_steps: the planned length of the run (steps).
        decay_fraction: wsd only: share of ``total_steps`` spent decaying to ``min_lr``.
    Returns:
        the learning rate (same unit as ``lr``).
    Raises:
        ValueError: an unknown schedule.
    """
    if schedule == "cosine":
        return lr_at(step, lr=lr, min_lr=min_lr, warmup_steps=warmup_steps, total_steps=total_steps)
    if schedule != "wsd":
        raise InvalidInput(f"lr_schedule must be one of {SCHEDULES}, got {schedule!r}")
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    start = decay_start(total_steps, warmup_steps, decay_fraction)
    if step < start:
        return lr
    progress = min(1.0, (step - start + 1) / max(1, total_steps - start))
    return lr + (min_lr - lr) * progress
