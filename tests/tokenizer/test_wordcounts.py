"""Per-source weights and word-frequency tables in the tokenizer's training sample.

A weight of 2 is the source listed twice (same tokenizer, same sample); a table of counts gives the
same tokenizer as its equivalent text; the wordfreq package's lists load from the installed wheel,
true-cased from the corpus, and their licence (CC BY-SA 4.0, share-alike) is recorded in
train_info.json and fertility.json; bad weights and tables are refused naming the option, file and line.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from prodip.base.errors import InvalidInput
from prodip.tokenizer.audit import AuditConfig, run_audit
from prodip.tokenizer.bpe import TokenizerTrainConfig, tokenizer_sha256, train_tokenizer
from prodip.tokenizer.wordcounts import (
    WORD,
    corpus_digits,
    count_documents,
    equivalent_text,
    read_counts_file,
    wordfreq_counts,
)
from tests.fixtures import write_sources

from .conftest import REPO


def _train(tmp_path: Path, name: str, **kw) -> Path:
    cfg = TokenizerTrainConfig(out_dir=str(tmp_path / name), vocab_size=700, progress=False, **kw)
    return train_tokenizer(cfg)


def _info(tok_dir: Path) -> dict:
    return json.loads((tok_dir / "train_info.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("proportions", [{}, {"bn": 0.6, "en": 0.4}], ids=["natural", "sampled"])
def test_weight_two_is_the_source_listed_twice(corpus, tmp_path, proportions):
    bn, en = str(corpus["bn"]), str(corpus["en"])
    weighted = _train(tmp_path, "w2", inputs={"bn": [bn], "en": [en]}, weights={bn: 2}, proportions=proportions)
    twice = _train(tmp_path, "twice", inputs={"bn": [bn, bn], "en": [en]}, proportions=proportions)
    once = _train(tmp_path, "once", inputs={"bn": [bn], "en": [en]}, proportions=proportions)
    assert tokenizer_sha256(weighted) == tokenizer_sha256(twice)
    assert tokenizer_sha256(weighted) != tokenizer_sha256(once)  # the weight changes the sample
    w, t, o = _info(weighted), _info(twice), _info(once)
    assert w["sample_chars"] == t["sample_chars"]
    (bn_src,) = [s for s in w["sources"] if s["language"] == "bn"]
    assert bn_src["weight"] == 2 and bn_src["kind"] == "text"
    assert w["available_chars"]["bn"] == 2 * bn_src["available_chars"] == 2 * o["available_chars"]["bn"]
    # the characters each source contributed add up to the language's sample
    for lang in ("bn", "en"):
        assert sum(s["sample_chars"] for s in w["sources"] if s["language"] == lang) == w["sample_chars"][lang]
    if not proportions:  # the natural mix takes everything: each copy contributes all of it
        assert bn_src["sample_chars"] == 2 * bn_src["available_chars"]
        assert sum(s["sample_chars"] for s in t["sources"] if s["language"] == "bn") == bn_src["sample_chars"]


@pytest.mark.parametrize(("bare_share", "cap_share"), [(0.0, 0.0), (0.25, 0.2)], ids=["spaced", "bare-capitalised"])
def test_a_table_of_counts_is_its_equivalent_text(corpus, tmp_path, bare_share, cap_share):
    en_text = next(corpus["en"].glob("*.txt")).read_text(encoding="utf-8")
    counts = Counter(WORD.findall(en_text)).most_common(400)
    table = tmp_path / "en_counts.tsv"
    table.write_text("".join(f"{w}\t{c}\n" for w, c in counts), encoding="utf-8")
    text_dir = tmp_path / "en_text"
    text_dir.mkdir()
    text = equivalent_text(counts, bare_share, cap_share)
    (text_dir / "words.txt").write_text(text, encoding="utf-8")
    write_sources(tmp_path, {"en_counts.tsv": "en", "en_text/words.txt": "en"})  # the licence gate's records
    assert read_counts_file(table) == counts
    docs = list(count_documents(counts, chunk_chars=50, bare_share=bare_share, capitalised_share=cap_share))
    assert "".join(docs).replace("\n", "") == text.replace("\n", "")
    # the bare share: round(count * share) occurrences of each word start a line, without the space
    # a lower-case word whose capitalised form the table lacks: its "Word" occurrences are the share's
    the, n_the = next((w, c) for w, c in counts if w.islower() and w.capitalize() not in dict(counts))
    title = the.capitalize()
    assert n_the * bare_share * cap_share > 1 or not bare_share
    n_title = round(n_the * cap_share)  # a sentence's first word, split into spaced and bare the same way
    assert text.split("\n").count(the) == round((n_the - n_title) * bare_share)
    assert text.split("\n").count(title) == round(n_title * bare_share)
    words = Counter(text.split())
    assert words[the] + words[title] == n_the and words[title] == n_title
    bn = [str(corpus["bn"])]
    shares = {"bare_share": {"en": bare_share}, "capitalised_share": {"en": cap_share}} if bare_share else {}
    from_table = _train(tmp_path, "table", inputs={"bn": bn}, word_counts={"en": [str(table)]}, **shares)
    from_text = _train(tmp_path, "text", inputs={"bn": bn, "en": [str(text_dir)]})
    a = json.loads((from_table / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    b = json.loads((from_text / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    assert a["merges"] == b["merges"] and a["vocab"] == b["vocab"]
    assert len(a["merges"]) > 300  # the table taught English merges (e.g. " the")
    assert "Ġthe" in a["vocab"]
    (src,) = [s for s in _info(from_table)["sources"] if s["language"] == "en"]
    assert src["kind"] == "word_counts" and src["words"] == 400 and src["bare_share"] == bare_share
    assert src["capitalised_share"] == cap_share
    assert src["available_chars"] == sum((len(w) + 1) * c for w, c in counts) == src["sample_chars"]


def test_wordfreq_lists_are_true_cased_and_carry_their_licence(corpus, tmp_path):
    casing = {"elizabeth": "Elizabeth", "darcy": "Darcy"}
    table = wordfreq_counts("en", 300_000, casing)
    words = dict(table.counts)
    assert "Elizabeth" in words and "elizabeth" not in words and "the" in words
    # wordfreq's "0000" (any 4-digit number) is spread over the concrete numbers, years the likeliest
    assert all(WORD.fullmatch(w) or w.isdigit() for w in words)
    assert words["2000"] > words.get("7382", 0) and words["2000"] > words.get("0042", 0)
    assert abs(table.chars() - 300_000) / 300_000 < 0.01
    assert words["the"] > words["of"] > words["house"] > 0  # frequency order kept
    assert table.license["license"] == "CC-BY-SA-4.0" and table.license["share_alike"]
    bn_table = wordfreq_counts("bn", 100_000)
    assert "এবং" in dict(bn_table.counts) and any(w.isascii() and w.isdigit() for w, _ in bn_table.counts)
    # numbers in the digits the language's text uses (data/bn writes ০-৯; build_sources passes them)
    assert corpus_digits(["১৯৭১ সালে ২৬ মার্চ, 1971"]) == "০১২৩৪৫৬৭৮৯" and corpus_digits(["no digits"]) == "0123456789"
    bn_words = dict(wordfreq_counts("bn", 100_000, digits=corpus_digits(["১৯৭১"])).counts)
    assert any(w.isdigit() for w in bn_words) and not any(ch in "0123456789" for w in bn_words for ch in w)

    bn = str(corpus["bn"])
    tok = _train(
        tmp_path,
        "wf",
        inputs={"bn": [bn], "en": [str(corpus["en"])]},
        word_counts={"bn": ["wordfreq:bn"]},
        wordfreq_chars=100_000,
        weights={"wordfreq:bn": 2},
    )
    (src,) = [s for s in _info(tok)["sources"] if s["source"] == "wordfreq:bn"]
    assert src["weight"] == 2 and src["sample_chars"] == 2 * src["available_chars"]
    assert src["license"]["license"] == "CC-BY-SA-4.0" and src["version"] == "3.1.1"
    report = run_audit(
        AuditConfig(tokenizer_dir=str(tok), heldout={"bn": [str(REPO / "data/heldout/udhr_ben.txt")]}, parity="off")
    )
    recorded = json.loads((tok / "fertility.json").read_text(encoding="utf-8"))["training_sources"]
    assert recorded == report.training_sources == _info(tok)["sources"]
    assert {s["source"] for s in recorded} == {bn, str(corpus["en"]), "wordfreq:bn"}


def test_the_naive_baseline_trains_from_a_config_with_every_word_list_option(corpus, tmp_path):
    """The audit's naive baseline is the text corpus's natural mix: a tokenizer trained with word-count
    tables, their weights and their bare and capitalised shares still gets one (it used to fail with
    "bare_share.bn: 'bn' has no word_counts table" after dropping only the tables)."""
    from dataclasses import fields

    from prodip.tokenizer.audit import naive_baseline

    bn = str(corpus["bn"])
    tok = _train(
        tmp_path,
        "wf",
        inputs={"bn": [bn], "en": [str(corpus["en"])]},
        word_counts={"bn": ["wordfreq:bn"], "en": ["wordfreq:en"]},
        wordfreq_chars=50_000,
        weights={"wordfreq:bn": 3, bn: 2},
        bare_share={"bn": 0.12},
        capitalised_share={"en": 0.07},
    )
    naive = naive_baseline(tok, str(tmp_path / "naive"))
    stamp = (naive / "tokenizer.json").stat().st_mtime_ns
    assert naive_baseline(tok, str(tmp_path / "naive")) == naive  # reused although data/bn is weighted 2
    assert (naive / "tokenizer.json").stat().st_mtime_ns == stamp
    (naive / "train_info.json").write_text("{damaged")
    assert naive_baseline(tok, str(tmp_path / "naive")) == naive  # a damaged baseline is retrained
    info = _info(naive)
    assert info["kind"] == "naive"
    assert {s["source"] for s in info["sources"]} == {bn, str(corpus["en"])}
    assert all(s["kind"] == "text" and s["weight"] == 1 for s in info["sources"])
    # every option whose help ties it to the word-count tables or the per-source mix is reset
    cfg = TokenizerTrainConfig(
        word_counts={"bn": ["x"]},
        bare_share={"bn": 0.1},
        capitalised_share={"bn": 0.1},
        weights={"x": 2},
        proportions={"bn": 0.6, "en": 0.4},
    )
    tied = ["word_counts"] + [f.name for f in fields(cfg) if "word_counts" in str(f.metadata.get("help", ""))]
    assert set(tied) >= {"bare_share", "capitalised_share", "weights"}, tied
    plain = cfg.corpus_only()
    assert all(getattr(plain, name) == getattr(TokenizerTrainConfig(), name) for name in tied)
    assert plain.proportions == {}  # the natural mix (a share could name a language only a table brought)


def test_bad_weights_and_tables_are_refused(corpus, tmp_path):
    bn, en = str(corpus["bn"]), str(corpus["en"])
    inputs = {"bn": [bn], "en": [en]}
    with pytest.raises(InvalidInput, match=r"weights\.data/xx: not a source"):
        _train(tmp_path, "a", inputs=inputs, weights={"data/xx": 2})
    with pytest.raises(InvalidInput, match=rf"weights\.{bn}: 0 must be an integer >= 1"):
        _train(tmp_path, "b", inputs=inputs, weights={bn: 0})
    with pytest.raises(InvalidInput, match=r"is another language's list \(expected wordfreq:en\)"):
        _train(tmp_path, "c", inputs=inputs, word_counts={"en": ["wordfreq:bn"]})
    with pytest.raises(InvalidInput, match=r"bare_share\.en: 'en' has no word_counts table"):
        _train(tmp_path, "f", inputs=inputs, word_counts={"bn": ["wordfreq:bn"]}, bare_share={"en": 0.1})
    with pytest.raises(InvalidInput, match=r"capitalised_share\.en: 1\.5 must be a share in \[0, 1\]"):
        _train(tmp_path, "g", inputs=inputs, word_counts={"en": ["wordfreq:en"]}, capitalised_share={"en": 1.5})
    bad = tmp_path / "bad.tsv"
    write_sources(tmp_path, {"bad.tsv": "en"})  # recorded, so the table's own errors are what is refused
    bad.write_text("the\t10\nof 5\n", encoding="utf-8")
    with pytest.raises(InvalidInput, match=r"bad\.tsv:2: expected 'word<TAB>count'"):
        _train(tmp_path, "d", inputs=inputs, word_counts={"en": [str(bad)]})
    bad.write_text("the\tmany\n", encoding="utf-8")
    with pytest.raises(InvalidInput, match=r"bad\.tsv:1: count 'many' is not a positive integer"):
        _train(tmp_path, "e", inputs=inputs, word_counts={"en": [str(bad)]})
    for name in "abcdefg":
        assert not (tmp_path / name).exists()
