"""Live curves of a training run: ``loss.png`` and TensorBoard event files beside ``metrics.jsonl``.

``metrics.jsonl`` stays the record (one JSON object per logged step); :class:`RunObserver` mirrors
each line into TensorBoard scalars (``torch.utils.tensorboard``, event files in the run dir, so
``tensorboard --logdir RUN_DIR`` shows the run while it trains) and redraws ``loss.png`` from
``metrics.jsonl`` whenever the trainer asks: at every held-out evaluation, every checkpoint, the
end of the run and on an interrupt. :func:`interrupt_message` says which checkpoint was kept and
how to resume.

    python -c "from prodip.train.observe import plot_loss; plot_loss('runs/demo/train/metrics.jsonl', 'loss.png')"
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from torch.utils.tensorboard import SummaryWriter

from prodip.base.files import writing

METRICS_NAME = "metrics.jsonl"
PLOT_NAME = "loss.png"


class RunObserver:
    """TensorBoard scalars and ``loss.png`` refreshes for one invocation (main rank only).

    Args:
        run_dir: the run dir holding ``metrics.jsonl``; event files go beside it.
        start_step: the step this invocation starts from; TensorBoard drops events an earlier,
            killed invocation wrote past it (``purge_step``), as the trainer trims ``metrics.jsonl``.
        no_val: languages without validation tokens (named in the plot, never drawn as 0).
    """

    def __init__(self, run_dir: str | os.PathLike, start_step: int = 0, no_val: Sequence[str] = ()) -> None:
        self.run_dir = Path(run_dir)
        self.no_val = list(no_val)
        self.writer = SummaryWriter(log_dir=str(self.run_dir), purge_step=start_step or None)

    def log(self, row: Mapping[str, object]) -> None:
        """One ``metrics.jsonl`` row as scalars at ``row["step"]``: numbers by key, dicts as ``key/sub``.

        Raises:
            TypeError: ``row["step"]`` is not a number.
        """
        step = row["step"]
        if not isinstance(step, (int, float)):
            raise TypeError(f"metrics row: step {step!r} is not a number")
        at = int(step)
        for key, value in row.items():
            if key == "step":
                continue
            if isinstance(value, dict):
                for sub, v in value.items():
                    if isinstance(v, (int, float)):
                        self.writer.add_scalar(f"{key}/{sub}", v, at)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, at)

    def refresh(self) -> None:
        """Flush the event file and redraw ``loss.png`` from ``metrics.jsonl``."""
        self.writer.flush()
        plot_loss(self.run_dir / METRICS_NAME, self.run_dir / PLOT_NAME, no_val=self.no_val)

    def close(self) -> None:
        self.refresh()
        self.writer.close()


def interrupt_message(ckpt_dir: Path, kept: Path | None, argv: Sequence[str] | None = None) -> str:
    """What an interrupted run kept and the command that continues it.

    Args:
        ckpt_dir: the run's ``checkpoints/`` dir.
        kept: the newest complete checkpoint (None: none was saved yet).
        argv: the command line (default ``sys.argv``), from which the resume command is built:
            ``prodip run ...`` is repeated without ``--force`` (the pipeline resumes by itself, and
            ``--force`` would delete the run if its config changed since); a stage command gets
            ``--resume`` added when there is a checkpoint to resume from (``prodip train --force``
            only overrides the tokenizer gate, which a resume passes again, so it is kept there).
    """
    argv = list(sys.argv if argv is None else argv)
    if argv[1:2] == ["run"]:
        argv = _without_force(argv)
    entry = Path(argv[0])
    if entry.name == "__main__.py":  # python -m prodip (prodip/__main__.py) or python -m prodip.train
        prog = f"{Path(sys.executable).name} -m {'prodip' if entry.parent.name == 'prodip' else 'prodip.train'}"
    else:
        prog = "prodip"
    args = argv[1:]
    if kept is None:  # nothing to resume from: the same command starts again
        command = shlex.join([*prog.split(), *args])
        return (
            f"training interrupted before its first checkpoint: nothing kept in {ckpt_dir}; start again with: {command}"
        )
    if args[:1] != ["run"] and "--resume" not in args:
        args.append("--resume")
    command = shlex.join([*prog.split(), *args])
    return f"training interrupted; kept checkpoint {kept} (the newest complete one); resume with: {command}"


_BOOL_WORDS = {"true", "false", "yes", "no", "1", "0"}  # what a bool flag accepts


def _without_force(argv: list[str]) -> list[str]:
    """``argv`` without ``--force``, ``--force BOOL`` or ``--force=BOOL``."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--force":
            skip = i + 1 < len(argv) and argv[i + 1].lower() in _BOOL_WORDS
            continue
        if arg.startswith("--force="):
            continue
        out.append(arg)
    return out


def plot_loss(metrics_path: str | os.PathLike, out_path: str | os.PathLike, no_val: Sequence[str] = ()) -> None:
    """Write ``loss.png``: train loss (and held-out loss per language) against step.

    Args:
        metrics_path: ``metrics.jsonl`` (nothing is drawn if it is missing or empty).
        out_path: the PNG, written to a temporary file and renamed into place.
        no_val: languages without a held-out loss, named in the title instead of drawn.
    """
    metrics_path, out_path = Path(metrics_path), Path(out_path)
    if not metrics_path.exists():
        return
    matplotlib.use("Agg")
    rows = []
    for line in metrics_path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
    rows = [r for r in rows if "step" in r and "loss" in r]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="train", lw=1)
    for lang in sorted({k for r in rows for k in r.get("val_loss", {})}):
        pts = [(r["step"], r["val_loss"][lang]) for r in rows if r.get("val_loss", {}).get(lang) is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=f"val {lang}")
    if no_val:
        ax.set_title(f"no validation tokens (not measured): {', '.join(no_val)}", fontsize=9)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    tmp = out_path.with_name(out_path.name + ".tmp.png")
    with writing(out_path):
        fig.savefig(tmp, dpi=100, bbox_inches="tight")
        plt.close(fig)
        os.replace(tmp, out_path)
