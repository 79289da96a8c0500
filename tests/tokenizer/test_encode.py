"""Corpus -> shards: the shards decode back to exactly the corpus's documents, the split is deterministic
and seedable, and a failing run leaves nothing behind."""

from __future__ import annotations

import unicodedata
from collections import Counter

import numpy as np
import pytest

from prodip.cli import main as prodip_main
from prodip.tokenizer.bpe import BOS_ID, EOS_ID, load_tokenizer, tokenizer_sha256
from prodip.tokenizer.corpus import expand_inputs, iter_language
from prodip.tokenizer.encode import DataPrepareConfig, prepare_shards
from prodip.tokenizer.shards import load_meta, read_shard, shard_paths
from tests.fixtures import write_sources
from tests.tokenizer.conftest import prepare_args


def _cfg(corpus, tok_dir, out, **kw):
    kw = {"doc_chars": 3000, "val_fraction": 0.1, **kw}
    return DataPrepareConfig(
        tokenizer_dir=str(tok_dir),
        inputs={k: [str(v)] for k, v in corpus.items()},
        out_dir=str(out),
        progress=False,
        **kw,
    )


def _docs(tok, shards_dir, lang, split):
    """The documents of a split; each is <|bos|> ids <|eos|> (the special-token convention)."""
    tokens = np.concatenate([np.asarray(read_shard(p)) for p in shard_paths(shards_dir, lang, split)])
    assert tokens[0] == BOS_ID and tokens[-1] == EOS_ID
    cuts = np.flatnonzero(tokens == EOS_ID)
    starts = np.concatenate([[0], cuts[:-1] + 1])
    assert (tokens[starts] == BOS_ID).all() and (tokens == BOS_ID).sum() == len(starts)
    return [tok.decode(tokens[s + 1 : e].tolist(), skip_special_tokens=False) for s, e in zip(starts, cuts)]


def test_shards_hold_exactly_the_documents(corpus, tok_dir, tmp_path):
    out = prepare_shards(_cfg(corpus, tok_dir, tmp_path / "shards"))
    meta = load_meta(out, expected_tokenizer_sha256=tokenizer_sha256(tok_dir)).to_dict()
    assert meta["token_dtype"] == "uint16" and meta["vocab_size"] == 1024
    assert (meta["bos_id"], meta["eos_id"], meta["document_layout"]) == (1, 2, "<|bos|> ids <|eos|>")
    tok = load_tokenizer(tok_dir)
    files = expand_inputs({k: [str(v)] for k, v in corpus.items()})
    for lang in ("bn", "en"):
        want = [unicodedata.normalize("NFC", d) for _, _, d in iter_language(files[lang], lang, doc_chars=3000)]
        train, val = _docs(tok, out, lang, "train"), _docs(tok, out, lang, "val")
        assert Counter(train + val) == Counter(want)
        assert len(val) >= 1 and len(train) > len(val)
        info = meta["languages"][lang]
        assert info["documents"] == {"train": len(train), "val": len(val)}
        assert sum(e["n_tokens"] for e in info["train"]) == sum(
            read_shard(p).size for p in shard_paths(out, lang, "train")
        )


def test_split_is_deterministic_and_seeded(corpus, tok_dir, tmp_path):
    a = prepare_shards(_cfg(corpus, tok_dir, tmp_path / "a", batch_chars=5000))
    b = prepare_shards(_cfg(corpus, tok_dir, tmp_path / "b", batch_chars=10**7, shard_tokens=5000))
    c = prepare_shards(_cfg(corpus, tok_dir, tmp_path / "c", seed=1))
    for lang in ("bn", "en"):
        va = np.asarray(read_shard(shard_paths(a, lang, "val")[0]))
        vb = np.concatenate([np.asarray(read_shard(p)) for p in shard_paths(b, lang, "val")])
        np.testing.assert_array_equal(va, vb)
    assert len(shard_paths(b, "en", "train")) > 1  # shard_tokens respected
    assert any(
        not np.array_equal(read_shard(shard_paths(a, lang, "val")[0]), read_shard(shard_paths(c, lang, "val")[0]))
        for lang in ("bn", "en")
    )


def test_bad_input_leaves_nothing(corpus, tok_dir, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.txt").write_bytes(b"hello\nworld \xc3\x28 again\n")
    write_sources(bad, {"x.txt": "en"})
    cfg = DataPrepareConfig(
        tokenizer_dir=str(tok_dir), inputs={"en": [str(bad)]}, out_dir=str(tmp_path / "out"), progress=False
    )
    with pytest.raises(ValueError, match=r"x.txt: invalid UTF-8 at byte offset 12"):
        prepare_shards(cfg)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp*"))
    out = prepare_shards(DataPrepareConfig(**{**cfg.__dict__, "errors": "skip"}))
    meta = load_meta(out).to_dict()
    assert meta["skipped_bytes"] == 1 and "x.txt@12" in meta["skipped_where"][0]
    with pytest.raises(FileExistsError, match="already holds shards"):
        prepare_shards(cfg)


def test_cli_prepare_and_errors(corpus, tok_dir, tmp_path, capsys):
    out = tmp_path / "cli"
    args = prepare_args(corpus, tok_dir, out)
    assert prodip_main(args) == 0
    assert "MB/s" in capsys.readouterr().out and (out / "data_config.toml").is_file()
    assert prodip_main(args) == 2  # refuses to overwrite
    assert "already holds shards" in capsys.readouterr().err
    assert prodip_main(["data", "prepare", "--tokenizer-dir", str(tmp_path / "nope"), "--out-dir", str(out)]) == 2
    assert "prodip tokenizer train" in capsys.readouterr().err


def test_python_m_tokenizer_entry_point(corpus, tmp_path, capsys):
    from prodip.tokenizer.__main__ import main

    out = tmp_path / "tok"
    assert (
        main(
            [
                "train",
                "--inputs",
                f"en={corpus['en']}",
                "--vocab-size",
                "300",
                "--out-dir",
                str(out),
                "--superword-share",
                "0",
                "--progress",
                "false",
            ]
        )
        == 0
    )
    assert (out / "train_config.toml").is_file() and (out / "special_tokens_map.json").is_file()
    assert main(["train", "--inputs", f"en={corpus['en']}", "--vocab-size", "300", "--out-dir", str(out)]) == 2
    assert "already holds a tokenizer" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["a.txt", "a.jsonl", "a.txt.gz"])
def test_a_byte_order_mark_is_not_text(tmp_path, name):
    """A file saved with a UTF-8 BOM (Windows Notepad) had U+FEFF trained on as the first character of
    its first document; it is a marker and is dropped, like Python's utf-8-sig codec does."""
    import gzip
    import json

    docs = ["প্রথম লাইন", "second line"]
    text = "".join(
        json.dumps({"text": d}, ensure_ascii=False) + "\n" if name.endswith(".jsonl") else d + "\n" for d in docs
    )
    files = {}
    for tag, data in (("bom", b"\xef\xbb\xbf" + text.encode("utf-8")), ("plain", text.encode("utf-8"))):
        files[tag] = tmp_path / tag / name
        files[tag].parent.mkdir()
        files[tag].write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    got = [d for _, _, d in iter_language([files["bom"]], "xx")]
    assert got == [d for _, _, d in iter_language([files["plain"]], "xx")]
    assert got[0].startswith(docs[0])


def test_a_split_share_far_from_val_fraction_is_warned(corpus, tok_dir, tmp_path, caplog):
    """Few long .txt documents: the validation split can hold several times val_fraction of the text, said."""
    few = prepare_shards(_cfg(corpus, tok_dir, tmp_path / "few", doc_chars=20000, val_fraction=0.05))
    meta = load_meta(few).to_dict()
    for lang, entry in meta["languages"].items():
        n = {s: sum(e["n_tokens"] for e in entry[s]) for s in ("train", "val")}
        share = n["val"] / (n["train"] + n["val"])
        warned = [w for w in meta["split_warnings"] if w.startswith(f"{lang}: ")]
        far = abs(share - 0.05) > 0.025
        assert bool(warned) == far, (lang, share, warned)
        if far:
            assert f"holds {share:.1%} of the tokens, not val_fraction 5.0%" in warned[0] and warned[0] in caplog.text
    assert meta["split_warnings"], "the 60k-character corpus in 20k-character documents should be far off 5%"
    many = prepare_shards(_cfg(corpus, tok_dir, tmp_path / "many", doc_chars=300, val_fraction=0.1))
    assert load_meta(many).to_dict()["split_warnings"] == []


def _sentence_per_line(path, n_chars: int) -> str:
    """Real Bangla from the demo corpus, one sentence per line, no blank line: the commonest scraped shape."""
    from tests.tokenizer.conftest import _bn_docs

    sentences = [s.strip() + "।" for d in _bn_docs(n_chars) for s in d.replace("\n", " ").split("।") if s.strip()]
    text = "\n".join(sentences) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    write_sources(path.parent.parent, {f"{path.parent.name}/{path.name}": "bn"}, license="LicenseRef-PublicDomain")
    return text


def test_a_sentence_per_line_txt_gets_its_validation_share(tok_dir, tmp_path):
    """A .txt without blank lines is cut at line ends (at 2 * doc_chars), so it is many documents and its
    language gets validation text near val_fraction; the documents are the file's lines, whole and in order."""
    text = _sentence_per_line(tmp_path / "bn" / "lines.txt", 60_000)
    docs = [d for _, _, d in iter_language([tmp_path / "bn" / "lines.txt"], "bn", doc_chars=1500)]
    assert "\n".join(docs) + "\n" == text  # nothing lost, no line cut
    longest_line = max(map(len, text.splitlines()))
    assert len(docs) >= 15 and all(len(d) < 3000 + longest_line for d in docs)
    out = prepare_shards(
        DataPrepareConfig(
            tokenizer_dir=str(tok_dir),
            inputs={"bn": [str(tmp_path / "bn")]},
            out_dir=str(tmp_path / "shards"),
            progress=False,
            doc_chars=1500,
            val_fraction=0.1,
        )
    )
    meta = load_meta(out).to_dict()
    n = {s: sum(e["n_tokens"] for e in meta["languages"]["bn"][s]) for s in ("train", "val")}
    assert meta["languages"]["bn"]["documents"]["val"] >= 1 and 0.03 < n["val"] / (n["train"] + n["val"]) < 0.3, n
    # paragraphs are still cut at blank lines only: a document ends at the first one after doc_chars
    para = "\n\n".join(["ক" * 40] * 5) + "\n"
    assert [len(d) for _, _, d in iter_language([_write(tmp_path / "p.txt", para)], "bn", doc_chars=50)] == [82, 82, 40]


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_a_language_left_without_validation_text_is_named_with_the_real_remedy(tok_dir, tmp_path, caplog):
    """One short .txt document: nothing can go to validation. The warning says so, that eval will skip the
    language, and names options that exist ([data] doc_chars, more rows), not an unnamed held-out file."""
    _sentence_per_line(tmp_path / "bn" / "lines.txt", 3000)
    out = prepare_shards(
        DataPrepareConfig(
            tokenizer_dir=str(tok_dir),
            inputs={"bn": [str(tmp_path / "bn")]},
            out_dir=str(tmp_path / "shards"),
            progress=False,
            doc_chars=20000,
            val_fraction=0.1,
        )
    )
    meta = load_meta(out).to_dict()
    assert meta["languages"]["bn"]["documents"] == {"train": 1, "val": 0}
    (warned,) = meta["split_warnings"]
    assert warned.startswith("bn: the validation split holds 0.0% of the tokens, not val_fraction 10.0% (none: eval")
    assert "a smaller [data] doc_chars (now 20000" in warned and "held-out file of your own" not in warned
    assert warned in caplog.text


@pytest.fixture(scope="module")
def standin_dirs(tmp_path_factory):
    from tests.standins import build_standin

    root = tmp_path_factory.mktemp("encode_standins")
    return {k: build_standin(k, root / k) for k in ("smollm2", "llama32", "qwen25", "tinyllama")}


# kind -> (bos text or None, the document-end text): the tokenizer's own bos only where its post-processor
# prepends one; its end-of-text token, not the instruct model's end of turn (eos_token)
_STANDIN_LAYOUT = {
    "smollm2": (None, "<|endoftext|>"),
    "llama32": ("<|begin_of_text|>", "<|end_of_text|>"),
    "qwen25": (None, "<|endoftext|>"),
    "tinyllama": ("<s>", "</s>"),
}


@pytest.mark.parametrize("kind", sorted(_STANDIN_LAYOUT))
def test_an_imported_tokenizer_writes_its_own_layout(corpus, standin_dirs, tmp_path, kind):
    """Shards of a base model's tokenizer: each document is [bos] ids eos with the tokenizer's own ids
    (meta.json records them), and ids are what transformers' tokenizer of the folder gives."""
    from transformers import AutoTokenizer

    folder = standin_dirs[kind]
    out = prepare_shards(_cfg(corpus, folder, tmp_path / "shards"))
    meta = load_meta(out, expected_tokenizer_sha256=tokenizer_sha256(folder))
    hf = AutoTokenizer.from_pretrained(str(folder))
    bos_text, end_text = _STANDIN_LAYOUT[kind]
    bos = hf.convert_tokens_to_ids(bos_text) if bos_text else None
    end = hf.convert_tokens_to_ids(end_text)
    assert (meta.bos_id, meta.eos_id) == (bos, end)
    assert meta.document_layout == f"{bos_text + ' ' if bos_text else ''}ids {end_text}"
    files = expand_inputs({k: [str(v)] for k, v in corpus.items()})
    for lang in ("bn", "en"):
        want = [unicodedata.normalize("NFC", d) for _, _, d in iter_language(files[lang], lang, doc_chars=3000)]
        tokens = np.concatenate(
            [np.asarray(read_shard(p)) for s in ("train", "val") for p in shard_paths(out, lang, s)]
        ).tolist()
        docs, start = [], 0
        for i, t in enumerate(tokens):
            if t == end:
                docs.append(tokens[start:i])
                start = i + 1
        assert start == len(tokens) and len(docs) == len(want)
        by_ids = {tuple(hf(d)["input_ids"]): d for d in want}  # transformers prepends the bos where it should
        assert all(tuple(d) in by_ids for d in docs)
        assert Counter(by_ids[tuple(d)] for d in docs) == Counter(want)
