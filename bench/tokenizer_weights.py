"""Benchmark: per-source weights and word-frequency tables in the tokenizer sample, tuned on a dev split.

The dev split is cut from the training sources: from the bundled ``data/bn`` and ``data/en``, every
document whose seeded draw is < ``--dev-fraction`` (the rule of the shards' validation split); from
the wordfreq lists, the words whose seeded draw is < ``--dev-fraction`` (measured as their
equivalent text, so frequent words count more). The sweep's tokenizers are trained on the rest (the
lists' other words as ``word<TAB>count`` files) and measured on both: the corpus's own domain
(19th-century Bangla literature and verse, English novels and Shakespeare) and the general
vocabulary of the lists (web, Wikipedia, subtitles, news). The score is the lower language's mean
of the two. ``--heldout-dir`` (made by
bench/get_heldout.sh: Bangla Wikipedia, State of the Union) is measured only with ``--final``, on
tokenizers trained on the whole bundled corpus, so no setting is chosen on held-out text.

    python bench/tokenizer_weights.py --work-dir /tmp/tw --vocab 32000 \
        --setting "wf=2000000,bn=2,wfbn=2,prop=" --setting "wf=0,prop=bn:0.5/en:0.5"
    python bench/tokenizer_weights.py --work-dir /tmp/tw --final --heldout-dir /tmp/heldout ...

A setting: ``wf`` = wordfreq_chars (0: no wordfreq tables), ``bn``/``en`` = weight of data/bn, data/en,
``wfbn``/``wfen`` = weight of wordfreq:bn / wordfreq:en, ``prop`` = proportions (empty: natural mix).
Each training runs in its own process (CPU seconds and peak RSS per tokenizer, from train_info.json).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prodip.tokenizer.bpe import TrainInfo

REPO = Path(__file__).resolve().parents[1]


def make_split(work: Path, dev_fraction: float, seed: int) -> Path:
    """Write ``work/split/{train,dev}/{bn,en}/*.jsonl.gz`` from the bundled corpus (once)."""
    from prodip.tokenizer.bpe import _doc_unit  # noqa: PLC0415
    from prodip.tokenizer.corpus import expand_inputs, iter_language  # noqa: PLC0415

    out = work / "split"
    if (out / "done").exists():
        return out
    for lang in ("bn", "en"):
        files = expand_inputs({lang: [str(REPO / "data" / lang)]})[lang]
        for part in ("train", "dev"):
            (out / part / lang).mkdir(parents=True, exist_ok=True)
        for f in files:
            parts: dict[str, list[str]] = {"train": [], "dev": []}
            for path, i, doc in iter_language([f], lang):
                part = "dev" if _doc_unit(seed, lang, path, i) < dev_fraction else "train"
                parts[part].append(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
            for part, lines in parts.items():
                if lines:  # a file with no document in a part is left out (the reader refuses empty files)
                    with gzip.open(out / part / lang / (f.name.split(".")[0] + ".jsonl.gz"), "wt") as fh:
                        fh.writelines(lines)
    (out / "done").write_text("")
    return out


def word_split(
    work: Path, lang: str, chars: int, casing_root: Path, dev_fraction: float, seed: int
) -> tuple[Path, list]:
    """The wordfreq list of ``lang`` at ``chars``: its train words written as a table, its dev words returned."""
    import hashlib  # noqa: PLC0415

    from prodip.tokenizer.corpus import expand_inputs, iter_language  # noqa: PLC0415
    from prodip.tokenizer.wordcounts import corpus_casing, wordfreq_counts  # noqa: PLC0415

    files = expand_inputs({lang: [str(casing_root / lang)]})[lang]
    casing = corpus_casing(doc for _, _, doc in iter_language(files, lang))
    table = wordfreq_counts(lang, chars, casing)

    def is_dev(word: str) -> bool:
        h = hashlib.blake2b(f"{seed}\0{lang}\0{word.lower()}".encode(), digest_size=8).digest()
        return int.from_bytes(h, "little") / 2**64 < dev_fraction

    out = work / "split" / f"wordfreq_{lang}_{chars}.tsv"
    out.write_text("".join(f"{w}\t{c}\n" for w, c in table.counts if not is_dev(w)), encoding="utf-8")
    return out, [(w, c) for w, c in table.counts if is_dev(w)]


def words_cpt(tok_dir: Path, dev_words: list) -> float:
    """Characters per token of the dev words' equivalent text (each ``" word"`` weighted by its count)."""
    from prodip.tokenizer.bpe import load_tokenizer  # noqa: PLC0415

    tok = load_tokenizer(tok_dir)
    encs = tok.encode_batch([" " + w for w, _ in dev_words], add_special_tokens=False)
    chars = sum((len(w) + 1) * c for w, c in dev_words)
    return round(chars / sum(len(e.ids) * c for e, (_, c) in zip(encs, dev_words)), 4)


def parse_setting(text: str) -> dict:
    kv = dict(p.split("=", 1) for p in text.split(",") if p)
    return {
        "wf": int(kv.get("wf", 0)),
        "bn": int(kv.get("bn", 1)),
        "en": int(kv.get("en", 1)),
        "wfbn": int(kv.get("wfbn", 1)),
        "wfen": int(kv.get("wfen", 1)),
        "prop": {k: float(v) for k, v in (p.split(":") for p in kv.get("prop", "").split("/") if p)},
    }


def train(setting: dict, root: Path, vocab: int, out: Path, tables: dict | None = None) -> TrainInfo:
    from prodip.tokenizer.bpe import TRAIN_INFO_FILE, TrainInfo  # noqa: PLC0415

    bn, en = str(root / "bn"), str(root / "en")
    cfg = {
        "inputs": {"bn": [bn], "en": [en]},
        "vocab_size": vocab,
        "proportions": setting["prop"],
        "weights": {bn: setting["bn"], en: setting["en"]},
        "out_dir": str(out),
        "overwrite": True,
        "progress": False,
    }
    if setting["wf"]:
        # tuning: the lists' train words as table files; final: the package's lists themselves
        srcs = {lang: str(tables[lang]) if tables else f"wordfreq:{lang}" for lang in ("bn", "en")}
        cfg["word_counts"] = {lang: [src] for lang, src in srcs.items()}
        cfg["wordfreq_chars"] = setting["wf"]
        cfg["weights"].update({srcs["bn"]: setting["wfbn"], srcs["en"]: setting["wfen"]})
    code = (
        "import json,sys; from prodip.base.config import from_dict; "
        "from prodip.tokenizer.bpe import TokenizerTrainConfig, train_tokenizer; "
        "train_tokenizer(from_dict(TokenizerTrainConfig, json.loads(sys.argv[1]), source='bench'))"
    )
    subprocess.run([sys.executable, "-c", code, json.dumps(cfg)], check=True)
    return TrainInfo.read(out / TRAIN_INFO_FILE)


def measure(tok_dir: Path, docs: dict[str, list[str]]) -> dict:
    from prodip.tokenizer.audit import measure_languages  # noqa: PLC0415
    from prodip.tokenizer.bpe import load_tokenizer  # noqa: PLC0415

    return measure_languages(load_tokenizer(tok_dir), docs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--setting", action="append", required=True)
    ap.add_argument("--dev-fraction", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--final", action="store_true", help="train on all of data/ and measure --heldout-dir")
    ap.add_argument("--heldout-dir", default="")
    args = ap.parse_args()
    from prodip.tokenizer.audit import load_heldout  # noqa: PLC0415

    work = Path(args.work_dir)
    if args.final:
        root = REPO / "data"
        docs = load_heldout(
            {"bn": [f"{args.heldout_dir}/bn"], "en": [f"{args.heldout_dir}/en"]}, max_chars=3_000_000, errors="strict"
        )
    else:
        split = make_split(work, args.dev_fraction, args.seed)
        root = split / "train"
        docs = load_heldout(
            {"bn": [str(split / "dev" / "bn")], "en": [str(split / "dev" / "en")]}, max_chars=3_000_000, errors="strict"
        )
    # the dev words: one fixed set for every setting (the lists at 4 M characters, dev words only)
    dev_words = (
        {}
        if args.final
        else {lang: word_split(work, lang, 4_000_000, root, args.dev_fraction, args.seed)[1] for lang in ("bn", "en")}
    )
    for text in args.setting:
        setting = parse_setting(text)
        name = f"{'final' if args.final else 'dev'}-{args.vocab}-" + text.replace("/", "_").replace(",", "_").replace(
            "=", ""
        ).replace(":", "")
        tables = None
        if setting["wf"] and not args.final:
            tables = {
                lang: word_split(work, lang, setting["wf"], root, args.dev_fraction, args.seed)[0]
                for lang in ("bn", "en")
            }
        info = train(setting, root, args.vocab, work / name, tables)
        figs = measure(work / name, docs)
        row = {
            "setting": text,
            "vocab": args.vocab,
            "eval": "heldout" if args.final else "dev",
            "bn": figs["bn"]["chars_per_token"],
            "en": figs["en"]["chars_per_token"],
            "lossless": figs["bn"]["lossless"] and figs["en"]["lossless"],
            **(
                {}
                if args.final
                else {f"{lang}_words": words_cpt(work / name, dev_words[lang]) for lang in ("bn", "en")}
            ),
            "sample_chars": info.sample_chars,
            "train_cpu_s": info.train_cpu_s,
            "peak_rss_mb": info.peak_rss_mb,
        }
        if not args.final:
            row["score"] = round(min((row[lang] + row[f"{lang}_words"]) / 2 for lang in ("bn", "en")), 4)
        print(json.dumps(row), flush=True)
        with open(work / "results.jsonl", "a") as fh:
            fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
