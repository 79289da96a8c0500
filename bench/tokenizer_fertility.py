"""Benchmark: tokenizer variants on the same sample and vocabulary, fertility on held-out text, runtime parity.

Variants (each trained in its own process, so train time and peak RSS are per tokenizer):
``portable`` (the default: byte-level BPE, o200k pre-tokenizer with combining marks), ``llama3`` and
``gpt2`` (the same with Llama-3's and GPT-2's patterns), ``custom`` (prodip's own Bangla-aware regex,
byte fallback) and ``custom-sw`` (the same + 20 % superwords), ``naive`` (GPT-2 recipe on the natural,
unbalanced mix: the experience report's trap). Then the audit's figures per held-out language, and
optionally the runtime parity of the portable tokenizer on given texts (one text per non-empty line).

    python bench/tokenizer_fertility.py --preset shared32k-news --work-dir /tmp/bench_tok32
    python bench/tokenizer_fertility.py --preset demo8k --work-dir /tmp/bench_tok8 \
        --parity-texts bn=../shared/data/bn/bn_news_punctuation_restoration.txt,en=../shared/data/en/gutenberg/pg120_Treasure-Island.txt
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

from prodip.tokenizer.audit import load_heldout, measure_languages
from prodip.tokenizer.bpe import TRAIN_INFO_FILE, TrainInfo, load_tokenizer
from prodip.tokenizer.parity import format_parity, run_parity

REPO = Path(__file__).resolve().parents[1]
# the real data lives beside the repository (../shared/data); PRODIP_SHARED_DATA points elsewhere
S = os.environ.get("PRODIP_SHARED_DATA", str(REPO.parent / "shared" / "data"))
TATOEBA_UDHR = {
    "bn": [f"{S}/parallel/tatoeba_opus_bn-en.tsv", f"{S}/parallel/udhr/ben.txt"],
    "en": [f"{S}/parallel/tatoeba_opus_bn-en.tsv", f"{S}/parallel/udhr/eng.txt"],
}
PRESETS = {
    # All the Bangla prose of ../shared/data in training, the news set included; held out: sources
    # the tokenizer never saw (Tatoeba bn-en pairs and the UDHR; add the issue's own held-out set,
    # Bangla Wikipedia + State of the Union speeches, with --heldout-dir, see bench/get_heldout.sh).
    # bn 0.5 / en 0.5: the share at which the two languages' fertility is equal (bench/tokenizer.md).
    "shared32k-news": {
        "train": {
            "inputs": {
                "bn": [f"{S}/bn", f"{S}/parallel/alice_mt_google/bn.txt"],
                "en": [f"{S}/en/gutenberg", f"{S}/en/tinyshakespeare.txt"],
            },
            "vocab_size": 32000,
            "proportions": {"bn": 0.5, "en": 0.5},
            "sources": [str(REPO / "bench" / "shared_sources.toml")],  # their licence records (the gate)
        },
        "heldout": {"Tatoeba + UDHR": TATOEBA_UDHR},
    },
    "demo8k": {
        "train": {
            "inputs": {"bn": [str(REPO / "data/bn")], "en": [str(REPO / "data/en")]},
            "vocab_size": 8192,
            "proportions": {"bn": 0.6, "en": 0.4},
        },
        "heldout": {
            "UDHR (data/heldout)": {
                "bn": [str(REPO / "data/heldout/udhr_ben.txt")],
                "en": [str(REPO / "data/heldout/udhr_eng.txt")],
            },
            "Tatoeba + UDHR": TATOEBA_UDHR,
        },
    },
}
VARIANTS = {
    "portable": {"kind": "portable", "pretokenizer": "o200k-marks"},
    "llama3": {"kind": "portable", "pretokenizer": "llama3"},
    "gpt2": {"kind": "portable", "pretokenizer": "gpt2"},
    "custom": {"kind": "custom"},
    "custom-sw": {"kind": "custom", "superword_share": 0.2},
    "naive": {"kind": "naive"},
}


def _train(train: dict, variant: dict, out: Path, work: Path) -> tuple[TrainInfo, float]:
    """Train one variant in its own process; its ``train_info.json`` and the wall time (seconds)."""
    config = work / f"{out.name}.toml"
    table = {**train, **variant, "out_dir": str(out), "overwrite": True, "progress": False}
    config.write_text(tomli_w.dumps({"tokenizer": table}))
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "prodip.tokenizer", "train", "--config", str(config)]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return TrainInfo.read(out / TRAIN_INFO_FILE), round(time.perf_counter() - start, 1)


def _lines(spec: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in filter(None, spec.split(",")):
        lang, _, path = item.partition("=")
        out.setdefault(lang, []).extend(
            line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="demo8k")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS)
    )
    parser.add_argument("--work-dir", default=None, help="where the tokenizers go (default: a temp dir)")
    parser.add_argument("--parity-texts", default="", help="lang=file,...: parity of the portable tokenizer on these")
    parser.add_argument("--parity-max-chars", type=int, default=400_000, help="characters per language for parity")
    parser.add_argument(
        "--heldout-dir",
        action="append",
        default=[],
        help="another held-out set: a folder with one subfolder of text files per language (bn/, en/); "
        "bench/get_heldout.sh fetches the issue's (Bangla Wikipedia sentences, State of the Union speeches)",
    )
    parser.add_argument(
        "--proportions", default=None, help="bn=0.55,en=0.45: override the preset's sampling proportions"
    )
    parser.add_argument("--json", default=None, help="write all figures here")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    if args.proportions:
        shares = {k: float(v) for k, _, v in (item.partition("=") for item in args.proportions.split(","))}
        preset = {**preset, "train": {**preset["train"], "proportions": shares}}
    work = Path(args.work_dir or tempfile.mkdtemp(prefix=f"bench_tok_{args.preset}_"))
    if not args.work_dir:  # trained tokenizers: gone at exit, also on an error
        atexit.register(shutil.rmtree, work, True)
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"preset": args.preset, "train": preset["train"], "variants": {}}
    sets = dict(preset["heldout"])
    for folder in map(Path, args.heldout_dir):
        langs = sorted(d for d in folder.iterdir() if d.is_dir())
        if not langs:
            parser.error(f"--heldout-dir {folder}: no language subfolders (expected e.g. {folder}/bn, {folder}/en)")
        sets[folder.name] = {d.name: [str(d)] for d in langs}
    heldouts = {title: load_heldout(h, max_chars=3_000_000, errors="strict") for title, h in sets.items()}
    for name in args.variants.split(","):
        info, wall_s = _train(preset["train"], VARIANTS[name], work / name, work)
        tok = load_tokenizer(work / name)
        figures = {title: measure_languages(tok, docs) for title, docs in heldouts.items()}
        results["variants"][name] = {
            "train_s": info.train_s,
            "wall_s": wall_s,
            "peak_rss_mb": info.peak_rss_mb,
            "sample_chars": info.sample_chars,
            "vocab_size": info.vocab_size,
            "heldout": figures,
        }
        print(
            f"{name:>10}: train {info.train_s or 0:.1f} s, peak RSS {info.peak_rss_mb or 0:.0f} MB, "
            f"sample {info.sample_chars}",
            flush=True,
        )
    print(f"\n== {args.preset}: vocab {preset['train']['vocab_size']}, proportions {preset['train']['proportions']}")
    for title in heldouts:
        print(f"\n-- held out: {title} (chars/token, tokens/word, % tokens ending inside a grapheme cluster)")
        for name, r in results["variants"].items():
            cells = "  ".join(
                f"{lang} {m['chars_per_token']:.3f} {m['tokens_per_word']:.3f} {100 * m['inside_cluster_share']:5.1f}%"
                for lang, m in r["heldout"][title].items()
            )
            print(f"{name:>10}  {cells}")
    if args.parity_texts:
        texts = {lang: _cap(lines, args.parity_max_chars) for lang, lines in _lines(args.parity_texts).items()}
        report = run_parity(work / "portable", texts)
        results["parity"] = report
        print("\n" + format_parity(report))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


def _cap(lines: list[str], max_chars: int) -> list[str]:
    out, size = [], 0
    for line in lines:
        if size >= max_chars:
            break
        out.append(line)
        size += len(line)
    return out


if __name__ == "__main__":
    sys.exit(main())
