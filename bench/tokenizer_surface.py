"""Benchmark: how word-frequency lists become BPE input (numbers, bare and capitalised forms, scaling, weights).

One process trains every setting (portable kind, vocab 32,000 unless ``vocab`` says) on the training part of
bench/tokenizer_weights.py's split (90 % of the bundled documents and of the wordfreq words, seed 7), and
measures chars/token on the dev part (corpus documents; dev words as their equivalent text) and on the
held-out sets of bench/get_heldout.sh (``HELDOUT`` dir, default /tmp/heldout). Rows go to stdout and
``$WORK/results.jsonl``. Keys of a setting (JSON): wf / wfbn / wfen = list characters, cbn / cen = corpus
weight, wbn / wen = list weight, num = numbers from wordfreq's digit entries, bare{bn,en} = bare share,
cap{bn,en} = capitalised share, alpha = frequency exponent, floor = minimum count, drop = corpus files
left out, minf = min_frequency, vocab.

    HELDOUT=/tmp/heldout python bench/tokenizer_surface.py '{"wf":4000000,"wbn":3,"num":1,"barebn":0.12,"capen":0.07}'
"""

import hashlib
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tokenizer_weights as tw
import wordfreq

from prodip.tokenizer.audit import load_heldout, measure_languages
from prodip.tokenizer.bpe import _byte_level_trainer, portable_pipeline, with_bos_convention
from prodip.tokenizer.corpus import expand_inputs, iter_language
from prodip.tokenizer.wordcounts import WORD, corpus_casing, count_documents

WORK = Path(os.environ.get("WORK", "/tmp/tok_surface"))
WORK.mkdir(parents=True, exist_ok=True)
SEED, FRAC = 7, 0.1
split = tw.make_split(WORK, FRAC, SEED)
corpus = {
    lang: [(p.name, d) for p, _, d in iter_language(expand_inputs({lang: [str(split / "train" / lang)]})[lang], lang)]
    for lang in ("bn", "en")
}
print({lang: sorted(set(n for n, _ in corpus[lang])) for lang in corpus}, file=sys.stderr)
dev = load_heldout({lang: [str(split / "dev" / lang)] for lang in ("bn", "en")}, max_chars=3_000_000, errors="strict")
held = load_heldout(
    {lang: [f"{os.environ.get('HELDOUT', '/tmp/heldout')}/{lang}"] for lang in ("bn", "en")},
    max_chars=3_000_000,
    errors="strict",
)
casing = {lang: corpus_casing(d for _, d in corpus[lang]) for lang in ("bn", "en")}


def is_dev(lang, word):
    h = hashlib.blake2b(f"{SEED}\0{lang}\0{word.lower()}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2**64 < FRAC


FREQ = {
    lang: [(w, f) for w, f in wordfreq.get_frequency_dict(lang, wordlist="large").items() if WORD.fullmatch(w)]
    for lang in ("bn", "en")
}
# dev words: as tokenizer_weights (list at 4 M chars, dev words only, counts by frequency)
BN_DIGITS = str.maketrans("0123456789", "০১২৩৪৫৬৭৮৯")


def numbers(lang):
    d = wordfreq.get_frequency_dict(lang, wordlist="large")
    out = []
    for k in (1, 2, 3, 4):
        fs = [(str(n).zfill(k), wordfreq.word_frequency(str(n).zfill(k), lang, wordlist="large")) for n in range(10**k)]
        tot = sum(f for _, f in fs)
        mass = d.get("0" * k, 0.0)
        out += [((w.translate(BN_DIGITS) if lang == "bn" else w), f * mass / tot) for w, f in fs if f > 0]
    return out


NUMS = {lang: numbers(lang) for lang in ("bn", "en")}


def table(lang, chars, alpha=1.0, floor=0, topk=None, train=True, num=0):
    fr = [(casing[lang].get(w, w), f**alpha) for w, f in FREQ[lang][:topk] if is_dev(lang, w) != train]
    if num:
        fr += [(w, f**alpha) for w, f in NUMS[lang] if is_dev(lang, w) != train]
    scale = chars / sum((len(w) + 1) * f for w, f in fr)
    for _ in range(10):
        got = sum((len(w) + 1) * max(floor, round(f * scale)) for w, f in fr)
        if abs(got - chars) <= 0.005 * chars:
            break
        scale *= chars / max(got, 1)
    out = {}
    for w, f in fr:
        c = max(floor, round(f * scale))
        if c > 0:
            out[w] = out.get(w, 0) + c
    return list(out.items())


DEVW = {lang: table(lang, 4_000_000, train=False) for lang in ("bn", "en")}


def words_cpt(tok, words):
    encs = tok.encode_batch([" " + w for w, _ in words], add_special_tokens=False)
    return round(sum((len(w) + 1) * c for w, c in words) / sum(len(e.ids) * c for e, (_, c) in zip(encs, words)), 4)


def run(s):
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    tabs = {
        lang: table(
            lang,
            s.get(f"wf{lang}", s.get("wf", 0)),
            s.get("alpha", 1.0),
            s.get("floor", 0),
            s.get("topk"),
            num=s.get("num", 0),
        )
        if s.get(f"wf{lang}", s.get("wf", 0))
        else []
        for lang in ("bn", "en")
    }

    def texts():
        for lang in ("bn", "en"):
            for _ in range(s.get(f"c{lang}", 1)):
                yield from (d for n, d in corpus[lang] if not any(k in n for k in s.get("drop", [])))
            bare = s.get(f"bare{lang}", s.get("bare", 0.0))
            cap = s.get(f"cap{lang}", 0.0)
            capd = [
                (w[:1].upper() + w[1:], round(c * cap)) for w, c in tabs[lang] if w[:1].islower() and round(c * cap) > 0
            ]
            tl = [(w, c - (round(c * cap) if w[:1].islower() else 0)) for w, c in tabs[lang]] + capd
            spaced = [(w, c - round(c * bare)) for w, c in tl]
            bares = [(w, round(c * bare)) for w, c in tl if round(c * bare) > 0]
            for _ in range(s.get(f"w{lang}", 1)):
                yield from count_documents([(w, c) for w, c in spaced if c > 0])
                for w, c in bares:
                    for i in range(0, c, 1000):
                        yield (w + "\n") * min(1000, c - i)

    tok = portable_pipeline()
    tok.train_from_iterator(texts(), trainer=_byte_level_trainer(s.get("vocab", 32000), s.get("minf", 2), False))
    tok = with_bos_convention(tok)
    (WORK / "toks").mkdir(exist_ok=True)
    tok.save(str(WORK / "toks") + "/" + hashlib.md5(json.dumps(s, sort_keys=True).encode()).hexdigest()[:10] + ".json")
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
    md, mh = measure_languages(tok, dev), measure_languages(tok, held)
    row = {
        "s": s,
        "dev_bn": md["bn"]["chars_per_token"],
        "dev_en": md["en"]["chars_per_token"],
        "devw_bn": words_cpt(tok, DEVW["bn"]),
        "devw_en": words_cpt(tok, DEVW["en"]),
        "held_bn": mh["bn"]["chars_per_token"],
        "held_en": mh["en"]["chars_per_token"],
        "lossless": md["bn"]["lossless"] and mh["bn"]["lossless"] and mh["en"]["lossless"],
        "sample": {
            lang: sum(len(d) for n, d in corpus[lang] if not any(k in n for k in s.get("drop", [])))
            * s.get(f"c{lang}", 1)
            + sum((len(w) + 1) * c for w, c in tabs[lang]) * s.get(f"w{lang}", 1)
            for lang in ("bn", "en")
        },
        "cpu_s": round(cpu, 1),
        "wall_s": round(time.perf_counter() - t0, 1),
        "rss_mb": round(c1.ru_maxrss / 1024),
    }
    print(json.dumps(row), flush=True)
    with open(WORK / "results.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
    return tok


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run(json.loads(arg))
