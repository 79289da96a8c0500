"""Benchmark: prodip's Bangla-aware tokenizer vs the naive GPT-2-style baseline, same corpus and vocabulary.

Trains both (each in its own process, so train time and peak RSS are per tokenizer), audits both on
held-out text never seen in training, and prints the audit table plus ours/naive ratios.

    python bench/tokenizer_fertility.py --preset shared32k   # the issue's 32k target (../shared/data)
    python bench/tokenizer_fertility.py --preset demo8k      # the bundled demo corpus at vocab 8192
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

REPO = Path(__file__).resolve().parents[1]
# the real data lives beside the repository (../shared/data); PRODIP_SHARED_DATA points elsewhere
S = os.environ.get("PRODIP_SHARED_DATA", str(REPO.parent / "shared" / "data"))
SHARED_HELDOUT = {
    "bn": [f"{S}/bn/bn_news_punctuation_restoration.txt", f"{S}/parallel/tatoeba_opus_bn-en.tsv"],
    "en": [f"{S}/parallel/tatoeba_opus_bn-en.tsv"],
}
PRESETS = {
    "shared32k": {
        "train": {
            "inputs": {
                "bn": [
                    f"{S}/bn/bn_pd_literature_majantali_site.jsonl",
                    f"{S}/bn/bn_pd_literature_majantali_wip.jsonl",
                    f"{S}/bn/bn_pd_poems_bengali_poem_dataset.jsonl",
                    f"{S}/parallel/alice_mt_google/bn.txt",
                ],
                "en": [f"{S}/en/gutenberg", f"{S}/en/tinyshakespeare.txt"],
            },
            "vocab_size": 32000,
            "proportions": {"bn": 0.7, "en": 0.3},
            "superword_share": 0.2,
        },
        "heldout": SHARED_HELDOUT,
    },
    # All the Bangla prose of ../shared/data in training, the news set included (the issue's
    # "Bangla and English prose"); held out: sources the tokenizer never saw (Tatoeba bn-en pairs
    # and the UDHR).
    "shared32k-news": {
        "train": {
            "inputs": {
                "bn": [f"{S}/bn", f"{S}/parallel/alice_mt_google/bn.txt"],
                "en": [f"{S}/en/gutenberg", f"{S}/en/tinyshakespeare.txt"],
            },
            "vocab_size": 32000,
            "proportions": {"bn": 0.7, "en": 0.3},
            "superword_share": 0.2,
        },
        "heldout": {
            "bn": [f"{S}/parallel/tatoeba_opus_bn-en.tsv", f"{S}/parallel/udhr/ben.txt"],
            "en": [f"{S}/parallel/tatoeba_opus_bn-en.tsv", f"{S}/parallel/udhr/eng.txt"],
        },
    },
    "demo8k": {
        "train": {
            "inputs": {"bn": [str(REPO / "data/bn")], "en": [str(REPO / "data/en")]},
            "vocab_size": 8192,
            "proportions": {"bn": 0.6, "en": 0.4},
            "superword_share": 0.2,
        },
        "heldout": {"bn": [str(REPO / "data/heldout/udhr_ben.txt")], "en": [str(REPO / "data/heldout/udhr_eng.txt")]},
        "heldout_extra": SHARED_HELDOUT,  # also measured when ../shared/data is present
    },
}


def _train(train: dict, kind: str, out: Path, work: Path) -> dict:
    config = work / f"{kind}.toml"
    config.write_text(tomli_w.dumps({"tokenizer": {**train, "kind": kind, "out_dir": str(out), "overwrite": True}}))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "prodip.tokenizer", "train", "--config", str(config)], check=True, cwd=REPO)
    info = json.loads((out / "train_info.json").read_text())
    info["wall_s"] = round(time.perf_counter() - start, 1)
    return info


def _audit(tok_dir: Path, heldout: dict, baseline_dir: Path) -> dict:
    from prodip.tokenizer.audit import AuditConfig, run_audit

    return run_audit(
        AuditConfig(
            tokenizer_dir=str(tok_dir),
            heldout=heldout,
            baseline="naive",
            baseline_dir=str(baseline_dir),
            max_chars=3_000_000,
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="demo8k")
    parser.add_argument("--work-dir", default=None, help="where the tokenizers go (default: a temp dir)")
    args = parser.parse_args()
    from prodip.tokenizer.audit import format_table

    preset = PRESETS[args.preset]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix=f"bench_tok_{args.preset}_"))
    work.mkdir(parents=True, exist_ok=True)
    ours_dir, naive_dir = work / "prodip", work / "naive"
    infos = {
        "prodip": _train(preset["train"], "prodip", ours_dir, work),
        "naive": _train(preset["train"], "naive", naive_dir, work),
    }
    heldouts = [("held-out", preset["heldout"])]
    if "heldout_extra" in preset and Path(S).is_dir():
        heldouts.append(("shared held-out (news + Tatoeba)", preset["heldout_extra"]))
    print(
        f"\n== {args.preset}: vocab {preset['train']['vocab_size']}, proportions "
        f"{preset['train']['proportions']}, superword_share {preset['train']['superword_share']}"
    )
    for kind, info in infos.items():
        print(
            f"{kind:>7}: train {info['train_s']:.1f} s (process wall {info['wall_s']:.1f} s), peak RSS "
            f"{info['peak_rss_mb']:.0f} MB, sample chars {info['sample_chars']}"
        )
    for title, heldout in heldouts:
        report = _audit(ours_dir, heldout, naive_dir)
        print(f"\n-- {title}: {json.dumps(heldout)}")
        print(format_table(report))
        for lang, m in report["languages"].items():
            b = report["baseline"]["languages"][lang]
            print(
                f"{lang}: ours/naive chars per token = {m['chars_per_token']:.3f}/{b['chars_per_token']:.3f} "
                f"= {m['chars_per_token'] / b['chars_per_token']:.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
