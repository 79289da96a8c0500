"""The opt-in custom tokenizer (tokenizer/custom.py): grapheme-safe regex, danda and digits, superwords,
deterministic alphabet cut, byte fallback; and every export target that cannot carry it refuses it."""

from __future__ import annotations

import unicodedata

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from prodip.tokenizer.bpe import TokenizerTrainConfig, load_tokenizer, tokenizer_sha256, train_tokenizer
from prodip.tokenizer.custom import PHRASE_PATTERN, WORD_PATTERN
from prodip.tokenizer.portable import portability, require_portable

BANGLA = st.characters(min_codepoint=0x0980, max_codepoint=0x09FF)
MIXED = st.one_of(BANGLA, st.sampled_from(list(" \n\t.,!?।॥'’-\u200c\u200d") + list("abcXYZ019")))


def test_layout_byte_fallback_and_bos(custom_tok_dir):
    tok = load_tokenizer(custom_tok_dir)
    # pad, bos, eos, <|im_start|>, <|im_end|> at 0-4 (every kind reserves the chat markers), then the bytes
    assert [tok.token_to_id(t) for t in ("<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>")] == [
        0,
        1,
        2,
        3,
        4,
    ]
    assert tok.token_to_id("<0x00>") == 5 and tok.token_to_id("<0xFF>") == 260
    assert tok.encode("a<|im_end|>").ids[-1] == 4
    assert tok.encode("").ids == [1] and tok.encode("আমি").ids[0] == 1
    text = "ক্ষ ক্‌ষ য\u09bc 👩‍👩‍👧 <0x41>"
    assert tok.decode(tok.encode(text).ids) == unicodedata.normalize("NFC", text)


def test_export_targets_refuse_the_custom_tokenizer(custom_tok_dir):
    table = portability(custom_tok_dir)
    assert table["tokenizers"][0] and table["transformers.js"][0]
    for target in ("onnxruntime-genai", "llama.cpp", "executorch"):
        ok, reason = table[target]
        assert not ok and reason
        with pytest.raises(ValueError, match=f"{target} cannot reproduce this tokenizer"):
            require_portable(custom_tok_dir, target)
    assert "byte-fallback" in table["llama.cpp"][1]


# A combining mark written after a digit, punctuation or space ("0্ক") is not Bengali orthography;
# for it, the `regex` module's \X applies the Unicode 15.1 conjunct rule (GB9c) without its
# "consonant before the virama" condition and reports "0্ক" as one cluster. The marks themselves
# stay with their base either way, so such strings are left out of this property.
_ORPHAN_MARK = regex.compile(r"(?:^|[^\p{L}\p{M}\u200c\u200d])\p{M}")


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(text=st.text(MIXED, max_size=40))
@pytest.mark.parametrize("pattern", [WORD_PATTERN, PHRASE_PATTERN], ids=["word", "phrase"])
def test_pretokenizer_never_splits_a_grapheme_cluster(pattern, text):
    from hypothesis import assume
    from tokenizers import Regex, pre_tokenizers

    text = unicodedata.normalize("NFC", text)
    assume(not _ORPHAN_MARK.search(text))
    pieces = pre_tokenizers.Split(Regex(pattern), behavior="isolated").pre_tokenize_str(text)
    assert "".join(p for p, _ in pieces) == text
    cuts = {end for _, (_, end) in pieces}
    clusters = {m.end() for m in regex.finditer(r"\X", text)}
    assert cuts <= clusters | {len(text)}, (text, pieces)


def test_danda_and_digits_pretokenization():
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(WORD_PATTERN), behavior="isolated").pre_tokenize_str
    assert [p for p, _ in split("কথা হলো। ১২৩৪ টাকা")] == ["কথা", " হলো।", " ", "১২৩", "৪", " টাকা"]
    assert [p for p, _ in split("আমি ।")] == ["আমি", " ।"]


def test_training_is_deterministic_and_learns_superwords(corpus, custom_tok_dir, tmp_path):
    cfg = TokenizerTrainConfig(
        inputs={k: [str(v)] for k, v in corpus.items()},
        out_dir=str(tmp_path / "again"),
        vocab_size=1024,
        proportions={"bn": 0.6, "en": 0.4},
        kind="custom",
        superword_share=0.2,
    )
    assert tokenizer_sha256(train_tokenizer(cfg)) == tokenizer_sha256(custom_tok_dir)
    vocab = load_tokenizer(custom_tok_dir).get_vocab()
    multi = [t for t in vocab if " " in t.strip() and not t.startswith("<")]
    assert len(multi) >= 5  # multi-word tokens from the second stage (e.g. " in the", " to be")
    tok = load_tokenizer(custom_tok_dir)
    assert any(" " in t.strip() for t in tok.encode("She was going to be in the room.").tokens)


def test_superwords_only_join_stage1_tokens(corpus, heldout):
    """The phrase pre-tokeniser + appended stage-2 merges must coarsen stage 1's segmentation, never change it."""
    from prodip.tokenizer.bpe import SPECIAL_TOKENS, train_from_iterator
    from prodip.tokenizer.corpus import expand_inputs, iter_language

    files = expand_inputs({k: [str(v)] for k, v in corpus.items()})

    def texts():
        for lang, fs in files.items():
            for _, _, doc in iter_language(fs, lang):
                yield doc

    vocab, share = 1024, 0.2
    n_super = int(share * (vocab - 256 - len(SPECIAL_TOKENS)))
    final = train_from_iterator(texts, vocab_size=vocab, kind="custom", superword_share=share)
    stage1 = train_from_iterator(texts, vocab_size=vocab - n_super, kind="custom", superword_share=0.0)
    for path in heldout.values():
        text = unicodedata.normalize("NFC", path.read_text(encoding="utf-8"))
        ends_final = {e for _, e in final.encode(text).offsets}
        ends_stage1 = {e for _, e in stage1.encode(text).offsets}
        assert ends_final <= ends_stage1
        assert len(ends_final) < len(ends_stage1)


def test_training_twice_gives_the_same_tokenizer_when_the_alphabet_is_cut(tmp_path):
    """tokenizers' BpeTrainer cut a too-large alphabet at ties in hash-map order, so equally rare
    characters survived at random and two trainings on the same text differed (tokenizer sha,
    shard checks, test fixtures). bpe.top_characters fixes the cut."""
    from prodip.tokenizer.bpe import train_tokenizer_from_texts
    from prodip.tokenizer.custom import top_characters

    texts = {
        "bn": ["আমার সোনার বাংলা আমি তোমায় ভালোবাসি। " * 3, "ঋ ঌ ৠ ৡ ঽ ৎ ৺ ৻ ৼ"],
        "en": ["the quick brown fox jumps over the lazy dog " * 3, "é è ê ë ï î ô û ù ç ß ø å"],
    }
    shas = {
        (train_tokenizer_from_texts(texts, 280, tmp_path / f"t{i}", kind="custom") / "tokenizer.json").read_bytes()
        for i in range(4)
    }
    assert len(shas) == 1
    assert top_characters(lambda: iter(["bba", "ca"]), 2) == ["a", "b"]  # count, then code point
    assert top_characters(lambda: iter(["bba", "ca"]), 3) is None  # nothing cut
