"""``[train] deterministic``: what a run does to be reproducible, and what resume then guarantees.

What resume guarantees (docs/training.md's statement; :func:`compare_resume` checks it):

- CPU, either setting: N straight steps and N/2 + ``--resume`` give bitwise-identical losses,
  weights and AdamW moments (CPU kernels are deterministic at a fixed thread count; the
  trainer also turns PyTorch's deterministic-algorithm checks on, warn-only).
- CUDA with ``deterministic = true``: bitwise too. :func:`configure` sets
  ``torch.use_deterministic_algorithms(True)`` (an op without a deterministic CUDA
  implementation raises instead of running), ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS
  needs it for reproducible split-K reductions, CUDA docs "Results reproducibility"),
  ``cudnn.deterministic`` / no ``cudnn.benchmark``, Inductor's deterministic mode where the
  installed torch has it, and an attention kernel with a deterministic backward
  (:func:`attention_choice`: flash, then memory-efficient, then math). Under
  ``use_deterministic_algorithms(True)`` (not warn-only) PyTorch runs the flash and
  memory-efficient backwards in their deterministic form (aten/src/ATen/native/transformers/
  cuda/attention_backward.cu passes ``deterministic`` to both): dQ is accumulated in a fixed
  order instead of with atomics. Flash supports GQA (``enable_gqa``) on CUDA; memory-efficient
  does not, so a GQA model goes flash -> math. Math is last because it materialises the
  ``(batch, heads, seq, seq)`` probabilities in fp32 for every layer (0.4B config at micro-batch
  16: ~4 GiB a layer, ~112 GiB over 28 layers). cuDNN attention is refused: its backward has no
  deterministic form. Cost: the deterministic flash backward and scatter/index_add backwards are
  slower than the defaults; ``bench/gpu/bench.py`` measures both settings side by side.
- CUDA with ``deterministic = false`` (the default; fastest kernels): weights, moments, data
  position and RNG are restored exactly, but later steps differ in the last bits. Two straight
  runs differ by as much, so the bench measures that noise floor in the same call and requires
  the resumed losses to stay within :func:`resume_rtol` of it (a wrong data position or a lost
  optimizer state moves the loss by ~3e-3 relative, far above a floor of ~1e-5).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from typing import Optional, TypedDict, Union

import torch

from prodip.base.errors import InvalidInput

log = logging.getLogger("prodip.train")

#: Relative tolerance per step between a resumed run's loss and the straight run's when kernels
#: are not deterministic and no noise floor was measured (tests on CPU): another seed moves the
#: loss by ~3e-3 even on random-token shards (tests/train/test_attention.py). A run on CUDA
#: measures its floor and uses :func:`resume_rtol` instead, which is much tighter.
RESUME_LOSS_RTOL = 2e-3
#: :func:`resume_rtol`: a resumed run may differ from the straight one by this many times the
#: noise floor (two straight runs' largest relative loss difference), but never less than
#: ``MIN_RESUME_RTOL``, below which bf16 reductions alone differ.
NOISE_FACTOR = 5.0
MIN_RESUME_RTOL = 1e-4

#: The cuBLAS workspace setting PyTorch asks for with deterministic algorithms on CUDA.
CUBLAS_WORKSPACE = ":4096:8"


def configure(deterministic: bool, device: torch.device) -> None:
    """Set the process-wide switches for ``[train] deterministic`` before any CUDA work.

    CPU: deterministic-algorithm checks on (warn-only) in either setting, as before.
    CUDA: with ``deterministic`` everything the module docstring lists; without it TF32 for the
    few fp32 matmuls outside bf16 autocast (nanoGPT does the same).
    """
    if device.type != "cuda":
        torch.use_deterministic_algorithms(True, warn_only=True)
        return
    if not deterministic:
        torch.use_deterministic_algorithms(False)  # an earlier deterministic run in this process set it
        torch.set_float32_matmul_precision("high")
        return
    # cuBLAS reads the variable when its handle is created: before the first matmul of the process
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    if os.environ["CUBLAS_WORKSPACE_CONFIG"] not in (":4096:8", ":16:8"):
        raise InvalidInput(
            f"[train] deterministic = true needs CUBLAS_WORKSPACE_CONFIG=:4096:8 or :16:8, "
            f"the environment has {os.environ['CUBLAS_WORKSPACE_CONFIG']!r}"
        )
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("high")  # TF32 is deterministic too: only reduction order matters
    import torch._inductor.config as inductor_config  # noqa: PLC0415 (CUDA-only; heavy import)

    if hasattr(inductor_config, "deterministic"):  # torch >= 2.8: no autotuning by timing, ordered reductions
        inductor_config.deterministic = True
    log.info(
        "deterministic = true: deterministic algorithms, CUBLAS_WORKSPACE_CONFIG=%s, cudnn.deterministic; "
        "costs throughput (deterministic attention and scatter backwards; make gpu-bench measures it)",
        os.environ["CUBLAS_WORKSPACE_CONFIG"],
    )


def attention_choice(backend: str, deterministic: bool, device: torch.device, *, gqa: bool = False) -> list[str]:
    """The ``[train] attention_backend`` values to try, in order, for this run.

    ``auto`` with ``deterministic`` on CUDA becomes ``flash``, ``efficient``, ``math`` (each has a
    deterministic backward under ``use_deterministic_algorithms(True)``; the module docstring says
    why flash comes first and math last); with ``gqa`` (fewer key/value heads than query heads)
    ``efficient`` is left out, since PyTorch's memory-efficient kernel refuses ``enable_gqa`` on
    CUDA. An explicit ``cudnn`` with ``deterministic`` on CUDA is refused. Elsewhere, or without
    ``deterministic``, the setting is tried as given.

    Args:
        backend: the ``[train] attention_backend`` value (``auto`` | ``cudnn`` | ``flash`` | ...).
        deterministic: ``[train] deterministic``.
        device: the training device.
        gqa: ``num_key_value_heads < num_attention_heads``.
    Raises:
        InvalidInput: cudnn together with ``deterministic = true`` on CUDA.
    """
    if device.type != "cuda" or not deterministic:
        return [backend]
    if backend == "auto":
        return ["flash", "math"] if gqa else ["flash", "efficient", "math"]
    if backend == "cudnn":
        raise InvalidInput(
            "[train] attention_backend = cudnn has a nondeterministic backward on CUDA: with "
            "deterministic = true use auto, flash, efficient or math"
        )
    return [backend]


def noise_floor(first: Sequence[float], second: Sequence[float]) -> float:
    """The largest per-step relative difference between two straight runs' losses (same config,
    same seed): what non-deterministic kernels alone change. ``inf`` when the lengths differ."""
    if len(first) != len(second) or not first:
        return math.inf
    return max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(first, second))


def resume_rtol(floor: float) -> float:
    """The per-step relative tolerance of a resume check: ``max(NOISE_FACTOR x floor, MIN_RESUME_RTOL)``."""
    return max(NOISE_FACTOR * floor, MIN_RESUME_RTOL)


class ResumeCheck(TypedDict):
    """:func:`compare_resume`'s verdict (``steps``: the two lengths when they differ)."""

    ok: bool
    mode: str
    rtol: Optional[float]
    steps: Union[int, list[int]]
    max_abs_diff: float
    max_rel_diff: float
    #: 1-based; None when ok
    first_bad_step: Optional[int]


def compare_resume(
    straight: Sequence[float], resumed: Sequence[float], *, bitwise: bool, rtol: float = RESUME_LOSS_RTOL
) -> ResumeCheck:
    """Compare the per-step losses of N straight steps with N/2 + resume (the same N steps).

    Args:
        straight, resumed: loss per step (nats/token), the same steps in the same order.
        bitwise: demand exact equality (CPU; CUDA with ``deterministic = true``).
        rtol: per-step relative tolerance otherwise.
    Returns:
        {"ok", "mode" ("bitwise" | "rtol"), "rtol", "max_abs_diff", "max_rel_diff", "steps",
        "first_bad_step" (1-based, None when ok)}.
    """
    mode = "bitwise" if bitwise else "rtol"
    if len(straight) != len(resumed) or not straight:
        return {"ok": False, "mode": mode, "rtol": None if bitwise else rtol, "steps": [len(straight), len(resumed)],
                "max_abs_diff": math.inf, "max_rel_diff": math.inf, "first_bad_step": 1}  # fmt: skip
    abs_d = [abs(a - b) for a, b in zip(straight, resumed)]
    rel_d = [d / max(abs(a), 1e-12) for d, a in zip(abs_d, straight)]
    bad = [i for i, (a, b, r) in enumerate(zip(straight, resumed, rel_d)) if (a != b if bitwise else not r <= rtol)]
    return {
        "ok": not bad,
        "mode": mode,
        "rtol": None if bitwise else rtol,
        "steps": len(straight),
        "max_abs_diff": max(abs_d),
        "max_rel_diff": max(rel_d),
        "first_bad_step": bad[0] + 1 if bad else None,
    }
