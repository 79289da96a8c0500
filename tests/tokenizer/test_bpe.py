"""The default (portable) tokenizer: fixed special ids and the BOS convention, the standard pre-tokenizer,
losslessness (fixed tricky strings + hypothesis), loading by tokenizers and transformers, sampling
proportions, determinism, bad input. The custom kind: test_custom.py."""

from __future__ import annotations

import hashlib
import json
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers

from prodip.tokenizer.bpe import (
    TokenizerTrainConfig,
    load_tokenizer,
    plan_sample,
    tokenizer_sha256,
    train_tokenizer,
    train_tokenizer_from_texts,
)
from prodip.tokenizer.portable import PRETOKENIZERS, pretokenizer_name
from tests.fixtures import write_sources

TRICKY = [
    "",
    " ",
    "  \t\n\n  x  ",
    "\r\n\r\n",
    "a\u0000b",
    "আমার সোনার বাংলা, আমি তোমায় ভালোবাসি।",
    "ক্ষ ক্‌ষ ক্‍ষ র‍্যাব",  # conjunct, ZWNJ-broken and ZWJ half-form (র‍্যাব: ZWJ "ya-phala")
    "য\u09bc য় ড\u09bc ঢ\u09bc",  # nukta decomposed (NFC recomposes some, not others)
    "কো কো ক\u09c7\u09be ক\u09c7\u09d7",  # o/au vowel signs precomposed and decomposed
    "চাঁদ সংখ্যা দুঃখ ৎ",  # candrabindu, anusvara, visarga, khanda ta
    "১২৩৪৫৬৭৮৯০ 1234567890 ১2৩",  # Bengali and ASCII digits
    "বলল। তারপর॥ কী? না!",
    " ।।",
    "\u09bfলেখা শুরু মাত্রা দিয়ে",
    "ি",
    "\u09cd",
    "👩‍👩‍👧‍👦 🇧🇩 ❤️",
    "日本語のテキスト",
    "مرحبا بالعالم",
    "Ω≈ç√∫˜µ≤≥÷",
    "e\u0301 é",
    "<|eos|> inside text",
    "<0x41> looks like a byte token",
    "tab\tsep",
    "don't it's O'Neil’s",
]


def _round_trip(tok, text: str) -> str:
    return tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False)


def test_dir_layout_and_special_ids(tok_dir):
    tok = load_tokenizer(tok_dir)
    assert [tok.token_to_id(t) for t in ("<|pad|>", "<|bos|>", "<|eos|>")] == [0, 1, 2]
    assert tok.get_vocab_size() == 1024
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == ("<|bos|>", "<|eos|>", "<|pad|>")
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0)
    assert (config["add_bos_token"], config["add_eos_token"]) == (True, False)
    tok_json = json.loads((tok_dir / "tokenizer.json").read_text())
    assert tok_json["normalizer"]["type"] == "NFC"
    assert pretokenizer_name(tok_json) == "o200k-marks" and tok_json["model"]["byte_fallback"] is False
    assert all(ch in tok.get_vocab() for ch in pre_tokenizers.ByteLevel.alphabet())  # every byte is a token
    assert tokenizer_sha256(tok_dir) == hashlib.sha256((tok_dir / "tokenizer.json").read_bytes()).hexdigest()
    info = json.loads((tok_dir / "train_info.json").read_text())
    assert abs(info["sample_chars"]["bn"] / sum(info["sample_chars"].values()) - 0.6) < 0.02


@pytest.mark.parametrize("text", TRICKY)
def test_lossless_tricky(tok_dir, text):
    tok = load_tokenizer(tok_dir)
    assert _round_trip(tok, text) == unicodedata.normalize("NFC", text)
    assert tok.token_to_id("<unk>") is None


BANGLA = st.characters(min_codepoint=0x0980, max_codepoint=0x09FF)
MIXED = st.one_of(BANGLA, st.sampled_from(list(" \n\t.,!?।॥'’-\u200c\u200d") + list("abcXYZ019")))


@pytest.mark.slow
@settings(
    max_examples=250,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(text=st.one_of(st.text(), st.text(MIXED)))
def test_lossless_property(tok_dir, text):
    assert _round_trip(load_tokenizer(tok_dir), text) == unicodedata.normalize("NFC", text)


@pytest.mark.slow  # importing transformers takes ~10 s
def test_loads_in_transformers(tok_dir):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    text = "আমার সোনার বাংলা। It is a truth universally acknowledged."
    ref = Tokenizer.from_file(str(tok_dir / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    fast = PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(str(tok_dir))
    for hf in (fast, auto):
        assert hf.encode(text, add_special_tokens=False) == ref
        assert hf.decode(ref) == text
    assert (auto.pad_token_id, auto.bos_token_id, auto.eos_token_id) == (0, 1, 2)


def test_plan_sample_known_answers():
    assert plan_sample({"bn": 100, "en": 1000}, {"bn": 0.5, "en": 0.5}, 10**9) == {"bn": 100, "en": 100}
    assert plan_sample({"bn": 100, "en": 1000}, {}, 10**9) == {"bn": 100, "en": 1000}
    assert plan_sample({"bn": 1000, "en": 1000}, {"bn": 3, "en": 1}, 400) == {"bn": 300, "en": 100}
    with pytest.raises(ValueError, match="must match inputs"):
        plan_sample({"bn": 1, "en": 1}, {"bn": 1.0}, 10)


def test_from_texts_helper(tmp_path):
    out = train_tokenizer_from_texts({"bn": ["আমার সোনার বাংলা"] * 5, "en": ["hello world"] * 5}, 300, tmp_path / "t")
    tok = load_tokenizer(out)
    assert _round_trip(tok, "আমার hello 🙂") == "আমার hello 🙂"


def test_bad_inputs_leave_nothing(tmp_path, corpus):
    def cfg(**kw):
        base = dict(inputs={"bn": [str(corpus["bn"])]}, out_dir=str(tmp_path / "out"), vocab_size=300)
        return TokenizerTrainConfig(**{**base, **kw})

    with pytest.raises(ValueError, match="vocab_size 100 is too small.*5 special.*= 262"):
        train_tokenizer(cfg(vocab_size=100))
    write_sources(tmp_path, {"empty.txt": "en", "bad.txt": "bn"})
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty.txt: empty file"):
        train_tokenizer(cfg(inputs={"bn": [str(corpus["bn"])], "en": [str(tmp_path / "empty.txt")]}))
    (tmp_path / "nofiles").mkdir()
    with pytest.raises(ValueError, match="inputs.en: no text files"):
        train_tokenizer(cfg(inputs={"bn": [str(corpus["bn"])], "en": [str(tmp_path / "nofiles")]}))
    (tmp_path / "bad.txt").write_bytes("ভালো\n".encode() + b"ab\xffcd\n")
    with pytest.raises(ValueError, match=r"bad.txt: invalid UTF-8 at byte offset 15"):
        train_tokenizer(cfg(inputs={"bn": [str(tmp_path / "bad.txt")]}))
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []
    out = train_tokenizer(cfg(inputs={"bn": [str(tmp_path / "bad.txt")]}, errors="skip"))
    assert load_tokenizer(out).get_vocab_size() <= 300
    info = json.loads((out / "train_info.json").read_text())
    assert info["skipped_bytes"] == 1 and info["skipped_where"][0].endswith("bad.txt@15")
    with pytest.raises(FileExistsError, match="already holds a tokenizer"):
        train_tokenizer(cfg())


def test_bos_convention(tok_dir):
    """One special-token convention: encode puts <|bos|> in front (an empty prompt is [<|bos|>])."""
    tok = load_tokenizer(tok_dir)
    assert tok.encode("").ids == [1]
    ids = tok.encode("আমার সোনার বাংলা").ids
    assert ids[0] == 1 and ids[1:] == tok.encode("আমার সোনার বাংলা", add_special_tokens=False).ids
    assert 1 not in ids[1:] and 2 not in ids


def test_a_tokenizer_without_the_bos_post_processor_is_refused(tok_dir, tmp_path):
    (tmp_path / "old").mkdir()
    tok_json = json.loads((tok_dir / "tokenizer.json").read_text())
    tok_json["post_processor"] = None
    (tmp_path / "old" / "tokenizer.json").write_text(json.dumps(tok_json))
    with pytest.raises(ValueError, match="does not prepend <\\|bos\\|>.*re-run `prodip tokenizer train`"):
        load_tokenizer(tmp_path / "old")


def test_marks_stay_with_their_letters():
    """o200k-marks keeps vowel signs, virama and nukta on the word (GPT-2's and Llama-3's patterns cut them)."""
    from tokenizers import Regex

    def pieces(name, text):
        split = pre_tokenizers.Split(Regex(PRETOKENIZERS[name].regex), behavior="isolated")
        return [p for p, _ in split.pre_tokenize_str(text)]

    text = "আমি বাংলায় গান গাই। কৌতূহল স্ত্রী"
    assert pieces("o200k-marks", text) == ["আমি", " বাংলায়", " গান", " গাই", "।", " কৌতূহল", " স্ত্রী"]
    assert len(pieces("gpt2", text)) > 12 and len(pieces("llama3", text)) > 12


def test_training_is_deterministic_and_superwords_need_the_custom_kind(corpus, tok_dir, tmp_path):
    cfg = TokenizerTrainConfig(
        inputs={k: [str(v)] for k, v in corpus.items()},
        out_dir=str(tmp_path / "again"),
        vocab_size=1024,
        proportions={"bn": 0.6, "en": 0.4},
    )
    assert tokenizer_sha256(train_tokenizer(cfg)) == tokenizer_sha256(tok_dir)
    with pytest.raises(ValueError, match="superword_share = 0.2 needs kind = 'custom'"):
        train_tokenizer(TokenizerTrainConfig(**{**cfg.__dict__, "superword_share": 0.2, "overwrite": True}))


@pytest.mark.parametrize("kind", ["portable", "naive", "custom"])
def test_every_kind_reserves_the_chat_markers(tmp_path, kind):
    """Issue 23: <|im_start|> and <|im_end|> are special tokens 3 and 4 of every new tokenizer, listed as
    additional special tokens, and transformers keeps them whole (the ids chat rendering relies on)."""
    from transformers import AutoTokenizer

    from prodip.base.chat import CHAT_TOKENS

    texts = {"bn": ["আমার সোনার বাংলা, আমি তোমায় ভালোবাসি।"] * 3, "en": ["The quick brown fox jumps."] * 3}
    out = train_tokenizer_from_texts(texts, 400, tmp_path / kind, kind=kind)
    tok = load_tokenizer(out)
    assert [tok.token_to_id(t) for t in ("<|pad|>", "<|bos|>", "<|eos|>", *CHAT_TOKENS)] == [0, 1, 2, 3, 4]
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        assert json.loads((out / name).read_text())["additional_special_tokens"] == list(CHAT_TOKENS)
    hf = AutoTokenizer.from_pretrained(str(out))
    ids = hf.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert ids[0] == 3 and ids[-1] == 4 and hf.decode(ids, skip_special_tokens=True) == "user\nhi"
