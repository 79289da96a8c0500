"""``prodip tokenizer extend``: new tokens appended to a base model's byte-level BPE, the model resized.

The bases are the stand-ins of tests/standins.py (SmolLM2, Llama 3.2, Qwen2.5 tokenizers built the way the
real ones are, trained on English only, so Bangla is about one token per UTF-8 byte).
"""

from __future__ import annotations

import dataclasses
import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from prodip.base.errors import InvalidInput, OutputExists
from prodip.cli import main as prodip_main
from prodip.tokenizer.audit import AuditConfig, run_audit
from prodip.tokenizer.extend import ExtendConfig, extend, resize_matrix
from tests.standins import KINDS, build_standin
from tests.tokenizer.conftest import skip_or_fail

#: the stand-ins with a byte-level BPE; TinyLlama's byte-fallback (SentencePiece-style) one is refused
EXTENDABLE = tuple(k for k in KINDS if k != "tinyllama")

safetensors_numpy = pytest.importorskip("safetensors.numpy")


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bases")
    return {kind: build_standin(kind, root / kind) for kind in KINDS}


@pytest.fixture(scope="module")
def extended(bases, corpus, heldout, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """Each stand-in extended with up to 300 tokens learned on the tests' Bangla corpus slice."""
    root = tmp_path_factory.mktemp("extended")
    out = {}
    for kind in EXTENDABLE:
        base = bases[kind]
        cfg = ExtendConfig(
            base=str(base),
            out=str(root / kind),
            inputs={"bn": [str(corpus["bn"])]},
            new_tokens=300,
            heldout={k: [str(v)] for k, v in heldout.items()},
            min_chars_per_token={"bn": 1.0},
            parity="off",
        )
        out[kind] = (root / kind, extend(cfg))
    return out


@pytest.mark.parametrize("kind", EXTENDABLE)
def test_every_base_id_decodes_and_merges_as_before(bases, extended, kind):
    base_dir, (ext_dir, record) = bases[kind], extended[kind]
    base = Tokenizer.from_file(str(base_dir / "tokenizer.json"))
    ext = Tokenizer.from_file(str(ext_dir / "tokenizer.json"))
    n = base.get_vocab_size()
    assert record["first_new_id"] == n and record["added_tokens"] > 100
    assert ext.get_vocab_size() == n + record["added_tokens"]
    for i in range(n):  # the whole base vocabulary, added and special tokens included
        assert ext.id_to_token(i) == base.id_to_token(i), i
        assert ext.decode([i], skip_special_tokens=False) == base.decode([i], skip_special_tokens=False), i
    for token, i in base.get_vocab().items():
        assert ext.token_to_id(token) == i
    b_json = json.loads((base_dir / "tokenizer.json").read_text(encoding="utf-8"))
    e_json = json.loads((ext_dir / "tokenizer.json").read_text(encoding="utf-8"))
    assert e_json["model"]["merges"][: len(b_json["model"]["merges"])] == b_json["model"]["merges"]
    assert len(e_json["model"]["merges"]) == len(b_json["model"]["merges"]) + record["added_tokens"]
    assert e_json["added_tokens"] == b_json["added_tokens"]
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        assert e_json[key] == b_json[key], key
    # the chat template and the special-token files travel unchanged
    for name in ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        assert (ext_dir / name).read_bytes() == (base_dir / name).read_bytes(), name
    # English the new (Bangla) merges never touch encodes to the same ids
    text = "It was the best of times, it was the worst of times."
    assert ext.encode(text).ids == base.encode(text).ids


@pytest.mark.parametrize("kind", EXTENDABLE)
def test_bangla_fertility_rises_by_what_the_audit_reports(bases, extended, heldout, tmp_path, kind):
    base_dir, (ext_dir, record) = bases[kind], extended[kind]
    fert = record["fertility"]
    audits = {}
    for name, folder in (("base", base_dir), ("ext", ext_dir)):
        audits[name] = run_audit(
            AuditConfig(
                tokenizer_dir=str(folder / "tokenizer.json"),
                report=str(tmp_path / f"{name}.json"),
                heldout={k: [str(v)] for k, v in heldout.items()},
                parity="off",
            )
        ).languages
    for lang in ("bn", "en"):
        assert fert[lang]["chars_per_token_before"] == audits["base"][lang].chars_per_token
        assert fert[lang]["chars_per_token_after"] == audits["ext"][lang].chars_per_token
        assert audits["ext"][lang].lossless
    assert fert["bn"]["chars_per_token_before"] < 0.5  # the trap: ~1 token per UTF-8 byte
    assert fert["bn"]["chars_per_token_after"] > 2 * fert["bn"]["chars_per_token_before"]
    assert fert["en"]["tokens_after"] <= fert["en"]["tokens_before"]
    for lang in ("bn", "en"):  # no vocabulary beats one token per pre-token; the audit reports that ceiling
        assert fert[lang]["chars_per_token_after"] <= fert[lang]["chars_per_pretoken"]
        assert audits["base"][lang].chars_per_pretoken == audits["ext"][lang].chars_per_pretoken
        assert audits["base"][lang].chars_per_pretoken == fert[lang]["chars_per_pretoken"]
    assert record["gate"]["passed"]
    text = unicodedata.normalize("NFC", heldout["bn"].read_text(encoding="utf-8")[:3000])  # Qwen2 normalises
    ext = Tokenizer.from_file(str(ext_dir / "tokenizer.json"))
    assert ext.decode(ext.encode(text, add_special_tokens=False).ids) == text


@pytest.mark.parametrize("kind", EXTENDABLE)
def test_new_rows_are_the_mean_of_their_base_pieces(bases, extended, kind):
    base_dir, (ext_dir, record) = bases[kind], extended[kind]
    base = Tokenizer.from_file(str(base_dir / "tokenizer.json"))
    ext = Tokenizer.from_file(str(ext_dir / "tokenizer.json"))
    old = safetensors_numpy.load_file(str(base_dir / "model.safetensors"))
    new = safetensors_numpy.load_file(str(ext_dir / "model.safetensors"))
    assert set(old) == set(new)
    for key in old:
        if key != "model.embed_tokens.weight":
            assert np.array_equal(old[key], new[key]), key
    emb_old, emb = old["model.embed_tokens.weight"], new["model.embed_tokens.weight"]
    config = json.loads((ext_dir / "config.json").read_text(encoding="utf-8"))
    assert emb.shape == (config["vocab_size"], emb_old.shape[1])
    assert config["vocab_size"] == max(record["model"]["vocab_size_before"], ext.get_vocab_size())
    n = base.get_vocab_size()
    assert np.array_equal(emb[:n], emb_old[:n])
    for i in range(n, ext.get_vocab_size()):
        pieces = [t.id for t in base.model.tokenize(ext.id_to_token(i))]
        assert len(pieces) > 1
        np.testing.assert_allclose(emb[i], emb_old[pieces].mean(axis=0), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("kind", EXTENDABLE)
def test_transformers_gives_the_base_logits_on_base_ids(bases, extended, kind):
    """The extended model is the base model on every base id: transformers' logits over the base ids equal."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    base_dir, (ext_dir, _) = bases[kind], extended[kind]
    text = "আমি বাংলায় গান গাই। It was a bright cold day."
    tok_b = transformers.AutoTokenizer.from_pretrained(str(base_dir))
    tok_e = transformers.AutoTokenizer.from_pretrained(str(ext_dir))
    ids_b, ids_e = tok_b.encode(text), tok_e.encode(text)
    assert len(ids_e) < len(ids_b)
    assert tok_e.decode(ids_e, skip_special_tokens=True) == tok_b.decode(ids_b, skip_special_tokens=True) == text
    m_b = transformers.AutoModelForCausalLM.from_pretrained(str(base_dir)).eval()
    m_e = transformers.AutoModelForCausalLM.from_pretrained(str(ext_dir)).eval()
    assert m_e.get_input_embeddings().weight.shape[0] == m_e.config.vocab_size
    with torch.no_grad():
        lb = m_b(torch.tensor([ids_b])).logits
        le = m_e(torch.tensor([ids_b])).logits
    n = len(tok_b)  # Qwen2's padding rows beyond the tokenizer are reused for new ids
    assert torch.equal(lb[..., :n], le[..., :n])


def _write_model(folder: Path, emb: np.ndarray, head: np.ndarray | None, tok_src: Path) -> None:
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((tok_src / "tokenizer.json").read_bytes())
    (folder / "config.json").write_text(
        json.dumps({"vocab_size": emb.shape[0], "tie_word_embeddings": head is None}), encoding="utf-8"
    )
    tensors = {"model.embed_tokens.weight": emb, "model.norm.weight": np.ones(emb.shape[1], dtype=emb.dtype)}
    if head is not None:
        tensors["lm_head.weight"] = head
    safetensors_numpy.save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_untied_bf16_rows_round_to_nearest_even_as_torch_does(bases, corpus, tmp_path):
    """bf16 embeddings and a separate lm_head: base rows kept bit for bit, new rows the float32 mean rounded
    to bf16 as torch rounds it (an independent implementation)."""
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    n = Tokenizer.from_file(str(bases["llama32"] / "tokenizer.json")).get_vocab_size()
    rng = np.random.default_rng(0)
    emb = rng.normal(0, 0.3, (n, 16)).astype(ml_dtypes.bfloat16)
    head = rng.normal(0, 0.3, (n, 16)).astype(ml_dtypes.bfloat16)
    base = tmp_path / "base"
    _write_model(base, emb, head, bases["llama32"])
    record = extend(
        ExtendConfig(base=str(base), out=str(tmp_path / "ext"), inputs={"bn": [str(corpus["bn"])]}, new_tokens=50)
    )
    assert record["model"]["tied"] is False and record["model"]["dtype"] == "bfloat16"
    new = safetensors_numpy.load_file(str(tmp_path / "ext/model.safetensors"))
    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    ext = Tokenizer.from_file(str(tmp_path / "ext/tokenizer.json"))
    for key, old in (("model.embed_tokens.weight", emb), ("lm_head.weight", head)):
        got = new[key]
        assert got.dtype == ml_dtypes.bfloat16 and got.shape == (n + 50, 16)
        assert got[:n].view(np.uint16).tobytes() == old.view(np.uint16).tobytes()
        t_old = torch.from_numpy(old.view(np.uint16).astype(np.int32) << 16).view(torch.float32)  # exact bf16->f32
        for i in range(n, n + 50):
            pieces = [t.id for t in tok.model.tokenize(ext.id_to_token(i))]
            want = t_old[pieces].mean(dim=0).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            assert np.array_equal(got[i].view(np.uint16), want), (key, i)
    assert json.loads((tmp_path / "ext/config.json").read_text())["vocab_size"] == n + 50


def test_resize_reuses_padding_rows_and_refuses_a_short_matrix():
    m = np.arange(12, dtype=np.float32).reshape(6, 2)  # a padded vocab: tokenizer 4 ids, 6 rows
    out = resize_matrix(m, 7, 4, [[0, 1], [2, 3], [1, 3]])
    assert out.shape == (7, 2)
    assert np.array_equal(out[:4], m[:4])
    assert np.array_equal(out[4:], [[1, 2], [5, 6], [4, 5]])
    with pytest.raises(InvalidInput, match="smaller than the tokenizer"):
        resize_matrix(m[:3], 7, 4, [[0, 1]])


def test_errors_are_one_line_and_exit_2(bases, extended, corpus, tmp_path, capsys):
    ext_dir = extended["smollm2"][0]
    with pytest.raises(OutputExists, match="--overwrite"):
        extend(ExtendConfig(base=str(bases["smollm2"]), out=str(ext_dir), inputs={"bn": [str(corpus["bn"])]}))
    wordpiece = tmp_path / "wp"
    wordpiece.mkdir()
    from tokenizers import models

    Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(str(wordpiece / "tokenizer.json"))
    args = ["tokenizer", "extend", str(wordpiece), "--inputs", f"bn={corpus['bn']}", "--out", str(tmp_path / "o")]
    assert prodip_main(args) == 2
    err = capsys.readouterr().err
    assert "only a byte-level BPE" in err and "wp/tokenizer.json" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.tmp").exists()
    assert prodip_main(["tokenizer", "extend", str(tmp_path / "missing"), "--inputs", f"bn={corpus['bn']}"]) == 2
    assert "not found" in capsys.readouterr().err


def test_cli_extends_and_records(bases, corpus, heldout, tmp_path, capsys):
    out = tmp_path / "ext"
    toml = tmp_path / "extend.toml"
    toml.write_text(
        f'[extend]\ninputs = {{ bn = ["{corpus["bn"]}"] }}\nnew_tokens = 100\n'
        f'heldout = {{ bn = ["{heldout["bn"]}"] }}\nmin_chars_per_token = {{ bn = 50.0 }}\nparity = "off"\n',
        encoding="utf-8",
    )
    args = ["tokenizer", "extend", str(bases["qwen25"]), "--config", str(toml), "--out", str(out)]
    assert prodip_main(args) == 2  # extended, but the (impossible) gate fails: one line, exit 2
    captured = capsys.readouterr()
    assert "+100 tokens" in captured.out and "gate: FAILED" in captured.out and "(not written" in captured.out
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("prodip tokenizer: error: fertility gate failed: bn: "), err
    assert "no vocabulary reaches it" in err[0] and err[0].endswith(f"; nothing written to {out}")
    assert "no vocabulary reaches it" not in captured.out  # printed once
    # a rejected extension leaves nothing a later stage could take for a tokenizer dir
    assert not out.exists() and not out.with_name("ext.tmp").exists()
    assert prodip_main(["data", "prepare", "--tokenizer-dir", str(out), "--inputs", f"bn={corpus['bn']}"]) == 2
    capsys.readouterr()
    # the same extension under a reachable minimum is written, with its record
    toml.write_text(toml.read_text(encoding="utf-8").replace("bn = 50.0", "bn = 0.1"), encoding="utf-8")
    assert prodip_main(args) == 0
    record = json.loads((out / "extension.json").read_text(encoding="utf-8"))
    assert record["added_tokens"] == 100 and record["gate"]["passed"] is True
    assert record["base_tokenizer_sha256"] != record["tokenizer_sha256"]
    assert set(record["weights_sha256"]) == {"model.safetensors"}
    # a later failing run with --overwrite leaves that accepted folder as it was
    toml.write_text(toml.read_text(encoding="utf-8").replace("bn = 0.1", "bn = 50.0"), encoding="utf-8")
    before = (out / "extension.json").read_bytes()
    assert prodip_main([*args, "--overwrite", "true"]) == 2
    assert (out / "extension.json").read_bytes() == before


@pytest.mark.slow
@pytest.mark.parametrize("kind", EXTENDABLE)
def test_extended_tokenizer_ids_are_identical_in_every_runtime(extended, heldout, kind):
    """tokenizer/parity.py on each extended stand-in: held-out lines and the tricky strings, every runtime."""
    from prodip.tokenizer.audit import load_heldout, parity_texts
    from prodip.tokenizer.parity import missing_runtimes, run_parity

    missing = missing_runtimes()
    if missing:
        skip_or_fail(f"runtimes not installed: {missing}")
    ext_dir = extended[kind][0]
    docs = load_heldout({k: [str(v)] for k, v in heldout.items()}, max_chars=20_000, errors="strict")
    report = run_parity(ext_dir, parity_texts(docs, 20_000), require=True)
    assert report["languages"]["bn"]["texts"] > 10
    statuses = {name: r["status"] for name, r in report["runtimes"].items() if name != "tokenizers"}
    assert report["passed"] and set(statuses.values()) == {"identical"} and len(statuses) == 5, statuses


@pytest.mark.slow
def test_sharded_weights_are_resized_and_load_in_transformers(bases, corpus, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    base = tmp_path / "sharded"
    model = transformers.AutoModelForCausalLM.from_pretrained(str(bases["smollm2"]))
    model.save_pretrained(str(base), max_shard_size="100KB")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (base / name).write_bytes((bases["smollm2"] / name).read_bytes())
    (base / "pytorch_model.bin").write_bytes(b"stale")  # another format of the base's weights: left out
    index = json.loads((base / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    record = extend(
        ExtendConfig(base=str(base), out=str(tmp_path / "ext"), inputs={"bn": [str(corpus["bn"])]}, new_tokens=60)
    )
    ext = tmp_path / "ext"
    assert not (ext / "pytorch_model.bin").exists()
    assert set(record["model"]["shards"]) == set(index["weight_map"].values())
    assert len(record["model"]["files"]) == 1  # tied: only the shard holding embed_tokens is rewritten
    new_index = json.loads((ext / "model.safetensors.index.json").read_text())
    grown = 60 * model.config.hidden_size * 4  # float32 rows
    assert new_index["metadata"]["total_size"] == index["metadata"]["total_size"] + grown
    m_e = transformers.AutoModelForCausalLM.from_pretrained(str(ext)).eval()
    ids = torch.arange(3, 40).unsqueeze(0)
    with torch.no_grad():
        lb, le = model.eval()(ids).logits, m_e(ids).logits
    n = lb.shape[-1]
    assert le.shape[-1] == n + 60 and torch.equal(lb, le[..., :n])


def test_audit_of_a_base_beside_another_tokenizer(bases, extended, tok_dir, heldout, tmp_path):
    """`prodip tokenizer audit` on a base's tokenizer.json, the prodip tokenizer beside it (--compare-dir);
    fertility.json goes where --report says, the base folder is left as it was."""
    from prodip.summary import _fertility_rows
    from prodip.tokenizer.audit import format_table, load_heldout, measure_languages

    base_dir = bases["llama32"]
    before = sorted(p.name for p in base_dir.iterdir())
    report = run_audit(
        AuditConfig(
            tokenizer_dir=str(base_dir),
            report=str(tmp_path / "fert.json"),
            heldout={k: [str(v)] for k, v in heldout.items()},
            min_chars_per_token={"bn": 1.0},
            compare_dir=str(tok_dir),
            parity="off",
        )
    )
    assert sorted(p.name for p in base_dir.iterdir()) == before and (tmp_path / "fert.json").is_file()
    assert report.baseline is not None
    assert report.baseline.kind == "compare" and report.baseline.tokenizer_dir == str(tok_dir)
    docs = load_heldout({k: [str(v)] for k, v in heldout.items()}, max_chars=3_000_000, errors="strict")
    ours = measure_languages(Tokenizer.from_file(str(tok_dir / "tokenizer.json")), docs)
    assert report.baseline.languages["bn"].chars_per_token == ours["bn"]["chars_per_token"]
    assert report.languages["bn"].chars_per_token < 0.5 < report.baseline.languages["bn"].chars_per_token
    assert not report.gate.passed and "prodip tokenizer extend" in report.gate.failures[0]
    table = format_table(report)
    assert f"other: {tok_dir}" in table and "other c/t" in table
    # the run summary's baseline column is the naive baseline's only
    assert all(row[4] == "" for row in _fertility_rows(report.model_dump()))


def test_a_byte_fallback_tokenizer_is_refused_in_one_line(bases, corpus, tmp_path):
    """TinyLlama's SentencePiece-style BPE (byte fallback) has no byte-level alphabet to append merges to."""
    cfg = ExtendConfig(base=str(bases["tinyllama"]), out=str(tmp_path / "x"), inputs={"bn": [str(corpus["bn"])]})
    with pytest.raises(InvalidInput, match=r"tinyllama/tokenizer.json: .*byte_fallback True.*only a byte-level BPE"):
        extend(cfg)
    assert not (tmp_path / "x").exists()


def _base_copy(bases, kind: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for f in bases[kind].iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


def test_the_bases_records_are_not_copied_stale(bases, corpus, heldout, tmp_path):
    """A base audited in place (its fertility.json), with slow-tokenizer files and an export-style manifest:
    the extended folder holds its own audit (what `prodip train` checks), vocab.json/merges.txt of the
    extended BPE, and no record naming the base's tokenizer sha256."""
    from transformers import GPT2Tokenizer

    from prodip.base.files import file_sha256
    from prodip.tokenizer.audit import check_gate, read_fertility

    base = _base_copy(bases, "smollm2", tmp_path / "base")
    hv = {k: [str(v)] for k, v in heldout.items()}
    run_audit(AuditConfig(tokenizer_dir=str(base), heldout=hv, parity="off"))
    base_sha = file_sha256(base / "tokenizer.json")
    assert read_fertility(base).tokenizer_sha256 == base_sha
    Tokenizer.from_file(str(base / "tokenizer.json")).model.save(str(base))  # vocab.json + merges.txt
    manifest = {"files": {"tokenizer.json": {"sha256": base_sha}}}
    (base / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    (base / "README.md").write_text("the base's card\n", encoding="utf-8")
    ext = tmp_path / "ext"
    cfg = ExtendConfig(
        base=str(base),
        out=str(ext),
        inputs={"bn": [str(corpus["bn"])]},
        new_tokens=120,
        heldout=hv,
        min_chars_per_token={"bn": 1.0},
        parity="off",
    )
    record = extend(cfg)
    assert record["left_out"] == ["manifest.json"] and (ext / "README.md").read_text() == "the base's card\n"
    # the extended tokenizer's own audit, which the train stage's gate check accepts
    report = check_gate(ext)
    assert report is not None and report.tokenizer_sha256 == file_sha256(ext / "tokenizer.json") != base_sha
    assert report.gate.passed and report.gate.min_chars_per_token == {"bn": 1.0}
    assert report.vocab_size == 1024 + 120 and report.baseline is not None and report.baseline.vocab_size == 1024
    for lang, f in record["fertility"].items():
        assert report.languages[lang].chars_per_token == f["chars_per_token_after"]
        assert report.baseline.languages[lang].chars_per_token == f["chars_per_token_before"]
    assert report.languages["bn"].chars_per_token > 2 * report.baseline.languages["bn"].chars_per_token
    # its config is the `prodip tokenizer audit` that measures the same figures
    again = run_audit(AuditConfig(**{**(report.config or {}), "report": str(tmp_path / "again.json")}))
    assert again.languages == report.languages and again.baseline == report.baseline
    # vocab.json + merges.txt of the extended BPE: transformers reads them alone (no tokenizer.json) to the same ids
    slow = tmp_path / "slow"
    slow.mkdir()
    for name in ("vocab.json", "merges.txt"):
        (slow / name).write_bytes((ext / name).read_bytes())
    text = heldout["bn"].read_text(encoding="utf-8")[:2000]
    ids = Tokenizer.from_file(str(ext / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert GPT2Tokenizer.from_pretrained(str(slow)).encode(text, add_special_tokens=False) == ids
    assert max(ids) >= 1024 and len(json.loads((ext / "vocab.json").read_text(encoding="utf-8"))) == 1024 + 120
    # without held-out text there is no audit: the base's is left out, not copied
    bare = dataclasses.replace(cfg, out=str(tmp_path / "bare"), heldout={}, min_chars_per_token={})
    extend(bare)
    assert not (tmp_path / "bare" / "fertility.json").exists() and check_gate(tmp_path / "bare") is None


def test_an_out_that_would_replace_the_base_is_refused_before_any_work(bases, corpus, tmp_path, capsys):
    base = _base_copy(bases, "smollm2", tmp_path / "runs" / "base")
    (base / "notes.txt").write_text("mine\n", encoding="utf-8")
    before = {p.name: p.read_bytes() for p in base.iterdir()}
    (tmp_path / "link").symlink_to(base)
    args = ["tokenizer", "extend", str(base), "--inputs", f"bn={corpus['bn']}", "--new-tokens", "20", "--out"]
    cases = {
        str(base): "is the base folder",
        str(base) + "/": "is the base folder",
        str(tmp_path / "link"): "is the base folder",
        str(base / ".." / "base"): "is the base folder",
        str(tmp_path / "runs"): "contains the base folder",
        str(tmp_path): "contains the base folder",
    }
    for out, words in cases.items():
        assert prodip_main([*args, out, "--overwrite", "true"]) == 2, out
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0] and "would delete the base" in err[0], (out, err)
        assert {p.name: p.read_bytes() for p in base.iterdir()} == before
    # the build folder OUT.tmp is deleted first: a base named so is refused too
    tmp_base = _base_copy(bases, "smollm2", tmp_path / "b.tmp")
    cfg = ExtendConfig(base=str(tmp_base), out=str(tmp_path / "b"), inputs={"bn": [str(corpus["bn"])]})
    with pytest.raises(InvalidInput, match=r"its build folder .*b\.tmp is the base folder"):
        extend(cfg)
    assert (tmp_base / "tokenizer.json").is_file()
    # a gate minimum without held-out text to measure it on is refused, not passed unchecked
    with pytest.raises(InvalidInput, match=r"min_chars_per_token: bn has a minimum but no held-out text"):
        extend(dataclasses.replace(cfg, base=str(base), out=str(tmp_path / "g"), min_chars_per_token={"bn": 2.0}))
    assert not (tmp_path / "g").exists()
    # as `prodip export --force`: --overwrite replaces an earlier extension only, never a link or other folder
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x", encoding="utf-8")
    with pytest.raises(
        OutputExists, match=r"is not a tokenizer extension \(no extension.json\); --overwrite true never"
    ):
        extend(dataclasses.replace(cfg, base=str(base), out=str(other), overwrite=True))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "outlink").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OutputExists, match="symbolic link"):
        extend(dataclasses.replace(cfg, base=str(base), out=str(tmp_path / "outlink"), overwrite=True))
    (tmp_path / "empty").mkdir()  # an empty folder is filled, an earlier extension replaced
    first = extend(dataclasses.replace(cfg, base=str(base), out=str(tmp_path / "empty"), new_tokens=20))
    again = extend(dataclasses.replace(cfg, base=str(base), out=str(tmp_path / "empty"), new_tokens=30, overwrite=True))
    assert (first["added_tokens"], again["added_tokens"]) == (20, 30)
    assert json.loads((tmp_path / "empty" / "extension.json").read_text())["added_tokens"] == 30
