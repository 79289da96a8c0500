"""Loss curves and held-out bits/char of two runs that differ only in ``[train] data_order``.

Reads each run dir's ``metrics.jsonl`` and ``eval.json`` (``prodip eval``), marks in the sequential
run the steps where its stream crosses from one source file to the next (boundaries rebuilt as in
``bench/data_order.py``), and writes a PNG and a JSON summary.

    python bench/data_order_curves.py --sequential runs/bench/sub_sequential --shuffle runs/bench/sub_shuffle \
        --inputs runs/bench/subcorpus/en --shards-dir runs/bench/subshards --out bench/results/data_order_subcorpus
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from data_order import file_boundaries  # noqa: E402

from prodip.tokenizer.bpe import load_tokenizer  # noqa: E402
from prodip.tokenizer.corpus import expand_inputs  # noqa: E402
from prodip.tokenizer.shards import load_meta  # noqa: E402
from prodip.train.records import EVAL_FILE, EvalReport  # noqa: E402


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequential", type=Path, required=True)
    ap.add_argument("--shuffle", type=Path, required=True)
    ap.add_argument("--inputs", required=True, help="the en folder the shards were prepared from")
    ap.add_argument("--shards-dir", type=Path, required=True)
    ap.add_argument("--tokenizer-dir", default="runs/demo/tokenizer")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    meta = load_meta(args.shards_dir)
    if meta.val_fraction is None or meta.seed is None:
        ap.error(f"--shards-dir {args.shards_dir}: meta.json records no val_fraction and seed of the split")
    names, ends = file_boundaries(
        load_tokenizer(args.tokenizer_dir),
        "en",
        expand_inputs({"en": [args.inputs]})["en"],
        meta.val_fraction,
        meta.seed,
    )
    rows = {"sequential": _rows(args.sequential), "shuffle": _rows(args.shuffle)}
    first = rows["sequential"][0]
    tokens_per_step = first["tokens_seen"] // first["step"]
    stream = sum(e.n_tokens for e in meta.languages["en"].train)
    steps = rows["sequential"][-1]["step"]
    # the sequential stream advances tokens_per_step per step: where it enters each source file
    starts = np.concatenate([[0], ends[:-1]])
    crossings = sorted(
        (int((epoch * stream + s) // tokens_per_step), name)
        for epoch in range(steps * tokens_per_step // stream + 1)
        for s, name in zip(starts, names)
        if 0 < (epoch * stream + s) // tokens_per_step <= steps
    )
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    summary = {"tokens_per_step": int(tokens_per_step), "stream_tokens": stream, "crossings": crossings, "runs": {}}
    for order, rs in rows.items():
        loss = np.array([r["loss"] for r in rs])
        smooth = np.convolve(loss, np.ones(5) / 5, mode="valid")
        val = [(r["step"], r["val_loss"]["en"]) for r in rs if "val_loss" in r]
        en = EvalReport.read((args.sequential if order == "sequential" else args.shuffle) / EVAL_FILE).languages["en"]
        ax1.plot(np.arange(5, len(loss) + 1), smooth, label=f"{order} (5-step mean)", lw=1)
        ax2.plot(*zip(*val), marker="o", ms=3, label=order)
        rises = smooth[5:] - smooth[:-5]
        summary["runs"][order] = {
            "final_train_loss_5_step_mean": round(float(loss[-5:].mean()), 3),
            "largest_rise_of_5_step_mean_after_step_40": round(float(rises[40:].max()), 3),
            "val_loss_nats_per_token": [round(v, 3) for _, v in val],
            "heldout_bits_per_char": round(en["trained"]["bits_per_char"], 4),
            "heldout_nll_nats_per_token": round(en["trained"]["nll_nats_per_token"], 4),
            "random_init_bits_per_char": round(en["random_init"]["bits_per_char"], 4),
            "heldout_tokens": en["tokens"],
        }
    for ax in (ax1, ax2):
        for step, name in crossings:
            ax.axvline(step, color="grey", ls=":", lw=0.8)
            ax.text(step, ax.get_ylim()[1] if ax is ax1 else 7.6, name[:12], rotation=90, fontsize=6, va="top")
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("train loss (nats/token)")
    ax2.set_ylabel("held-out loss (nats/token)")
    ax1.set_title("dotted: the sequential stream enters a source file", fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out.with_suffix(".png"), dpi=90)
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
