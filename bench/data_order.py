"""Which source file each training row comes from, step by step, under the sequential and shuffled samplers.

Rebuilds each language's train token stream file by file (the documents ``prodip data prepare``
sent to ``train``, in its order, each with its ``<|eos|>``), checks the total against the shards'
meta.json, then replays ``prodip.train.data.MixtureBatches`` for ``[train] steps`` batches of the
config (no model: exact and cheap) with ``data_order = sequential`` (prodip before issue 12) and
``shuffle``, and reports per language the longest run of consecutive steps whose rows all came from
one source file, and how far each step's source mix is from the language's token shares.

    python bench/data_order.py --config configs/demo.toml --shards-dir runs/demo/shards \
        --tokenizer-dir runs/demo/tokenizer --out bench/results/data_order_demo
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from prodip.base.config import read_toml  # noqa: E402
from prodip.tokenizer.bpe import _doc_unit, load_tokenizer  # noqa: E402
from prodip.tokenizer.corpus import expand_inputs, iter_language  # noqa: E402
from prodip.tokenizer.shards import load_meta  # noqa: E402
from prodip.train.data import MixtureBatches  # noqa: E402


def file_boundaries(tok, lang: str, files: list[Path], val_fraction: float, seed: int) -> tuple[list[str], np.ndarray]:
    """Source names and the train-stream offset where each one ends (cumulative tokens, EOS included)."""
    ends, names, total = [], [], 0
    for f in files:
        texts = [doc for path, i, doc in iter_language([f], lang) if _doc_unit(seed, lang, path, i) >= val_fraction]
        total += sum(len(e.ids) + 1 for e in tok.encode_batch(texts, add_special_tokens=False))
        names.append(f.name.split(".")[0][:28])
        ends.append(total)
    return names, np.asarray(ends)


def replay(batches: MixtureBatches, steps: int, ends: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per language, (steps, n_sources) counts of rows by source file of each window's first token."""
    counts = {lang: np.zeros((steps, len(e)), dtype=np.int64) for lang, e in ends.items()}
    for step in range(steps):
        for li in batches._languages(batches.batch_index):
            lang = batches.langs[li]
            start = batches._start(lang) % int(ends[lang][-1])
            counts[lang][step, int(np.searchsorted(ends[lang], start, side="right"))] += 1
            batches.positions[lang] += batches.seq_len
        batches.batch_index += 1
    return counts


def longest_single_source_run(counts: np.ndarray) -> tuple[int, int]:
    """Longest run of consecutive steps (with rows of this language) drawn from one source; and its start step."""
    best, best_start, run, run_start, last = 0, 0, 0, 0, -1
    for step, row in enumerate(counts):
        if row.sum() == 0:
            continue
        sources = np.flatnonzero(row)
        if len(sources) == 1 and sources[0] == last:
            run += 1
        elif len(sources) == 1:
            run, run_start, last = 1, step, sources[0]
        else:
            run, last = 0, -1
        if run > best:
            best, best_start = run, run_start
    return best, best_start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/demo.toml")
    ap.add_argument("--shards-dir", default="runs/demo/shards")
    ap.add_argument("--tokenizer-dir", default="runs/demo/tokenizer")
    ap.add_argument("--out", default="bench/results/data_order_demo")
    args = ap.parse_args()
    doc = read_toml(args.config)
    data, train = doc["data"], doc["train"]
    meta = load_meta(args.shards_dir).to_dict()
    tok = load_tokenizer(args.tokenizer_dir)
    files = expand_inputs(data["inputs"])
    names, ends = {}, {}
    for lang in sorted(files):
        names[lang], ends[lang] = file_boundaries(
            tok, lang, files[lang], data.get("val_fraction", 0.02), data.get("seed", 0)
        )
        expected = sum(e["n_tokens"] for e in meta["languages"][lang]["train"])
        # data prepare holds the last train document back in case val is empty: at most one document off
        assert abs(int(ends[lang][-1]) - expected) < 50_000, (lang, ends[lang][-1], expected)
        ends[lang][-1] = expected
    steps, T, B = train["steps"], train["seq_len"], train["batch_size"]
    report = {"config": args.config, "steps": steps, "seq_len": T, "batch_size": B, "languages": {}}
    fig, axes = plt.subplots(2, len(ends), figsize=(6 * len(ends), 6), squeeze=False)
    for row, order in enumerate(("sequential", "shuffle")):
        mb = MixtureBatches(args.shards_dir, train["mixture"], B, T, seed=train.get("seed", 1234), order=order)
        counts = replay(mb, steps, ends)
        for col, lang in enumerate(sorted(ends)):
            c = counts[lang]
            shares = np.diff(np.concatenate([[0], ends[lang]])) / ends[lang][-1]
            # per 10-step window: total-variation distance between the rows' source mix and the token shares
            windows = c[: steps // 10 * 10].reshape(-1, 10, c.shape[1]).sum(1)
            mix = windows / np.maximum(1, windows.sum(1, keepdims=True))
            tv = 0.5 * np.abs(mix - shares).sum(1)
            run, start = longest_single_source_run(c)
            report["languages"].setdefault(lang, {"sources": dict(zip(names[lang], shares.round(4).tolist()))})
            report["languages"][lang][order] = {
                "longest_single_source_run_steps": run,
                "run_starts_at_step": start,
                "source_mix_tv_distance_per_10_steps_mean": round(float(tv.mean()), 3),
                "source_mix_tv_distance_per_10_steps_max": round(float(tv.max()), 3),
                "epochs": round(mb.epochs()[lang], 3),
            }
            ax = axes[row][col]
            frac = c / np.maximum(1, c.sum(1, keepdims=True))
            ax.stackplot(np.arange(1, steps + 1), frac.T, labels=names[lang])
            ax.set_title(f"{lang}, {order}: source of each step's rows", fontsize=9)
            ax.set_xlabel("optimizer step")
            ax.set_ylim(0, 1)
            if row == 0:
                ax.legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out.with_suffix(".png"), dpi=90)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
