"""Audit figures against independent counts, the naive baseline's Bangla trap, the gate and check_gate."""

from __future__ import annotations

import json

import pytest

from prodip.base.files import file_sha256
from prodip.cli import main as prodip_main
from prodip.tokenizer.audit import AuditConfig, check_gate, format_table, measure, run_audit
from prodip.tokenizer.bpe import load_tokenizer, train_tokenizer_from_texts


def test_measure_known_answers(tok_dir):
    tok = load_tokenizer(tok_dir)
    docs = ["আমার সোনার বাংলা।", "Hello there, world!"]
    m = measure(tok, docs)
    n_tokens = sum(len(tok.encode(d, add_special_tokens=False).ids) for d in docs)
    assert m["tokens"] == n_tokens and m["chars"] == sum(map(len, docs)) and m["words"] == 6
    assert m["chars_per_token"] == pytest.approx(m["chars"] / n_tokens, abs=1e-4)
    assert m["bytes_per_token"] == pytest.approx(sum(len(d.encode()) for d in docs) / n_tokens, abs=1e-4)
    assert m["lossless"] and m["byte_fallback_share"] == 0.0
    assert measure(tok, ["🙂"])["byte_fallback_share"] == 1.0  # 4 byte tokens for an unseen emoji
    # a byte-level tokenizer with no merges cuts every Bangla character into 3 byte tokens:
    naive = load_tokenizer(train_tokenizer_from_texts({"x": ["ab"]}, 300, tok_dir.parent / "bytes", kind="naive"))
    m = measure(naive, ["কা"])  # 2 code points, 1 grapheme cluster, 6 bytes -> 6 tokens, 5 end inside it
    assert (m["tokens"], m["inside_cluster_share"], m["byte_fallback_share"]) == (
        6,
        pytest.approx(5 / 6, abs=1e-4),
        1.0,
    )


def test_audit_with_naive_baseline_shows_the_trap(tok_dir, heldout, tmp_path, capsys):
    cfg = AuditConfig(
        tokenizer_dir=str(tok_dir),
        heldout={k: [str(v)] for k, v in heldout.items()},
        min_chars_per_token={"bn": 0.5, "en": 0.5},
        baseline="naive",
        baseline_dir=str(tmp_path / "naive"),
    )
    report = run_audit(cfg)
    assert report.baseline is not None and report.baseline.kind == "naive"
    ours, naive = report.languages["bn"], report.baseline.languages["bn"]
    assert report.gate.passed and ours.lossless and naive.lossless
    assert naive.chars_per_token < 0.8 * ours.chars_per_token
    assert naive.inside_cluster_share > ours.inside_cluster_share
    assert naive.token_share_over_char_share > ours.token_share_over_char_share
    assert json.loads((tok_dir / "fertility.json").read_text())["tokenizer_sha256"] == report.tokenizer_sha256
    gated = check_gate(tok_dir)
    assert gated is not None and gated.gate.passed and gated.tokenizer_sha256 == report.tokenizer_sha256
    # the parity table (runtime x language) is in the report and fertility.json, and printed
    parity = json.loads((tok_dir / "fertility.json").read_text())["parity"]
    assert parity == report.parity and parity["passed"]
    assert set(parity["languages"]) == {"bn", "en", "tricky"}
    assert all(r["status"] in ("reference", "identical", "skipped") for r in parity["runtimes"].values())
    assert "tokenizer parity vs tokenizers" in format_table(report)


def test_parity_failure_fails_the_gate(tok_dir, heldout, monkeypatch):
    def differs(tokenizer_dir, texts_by_lang, require):
        row = {"texts": 3, "identical": 2, "excluded": 0}
        mismatch = {"language": "bn", "text": "কো", "position": 1, "expected": [1, 5], "got": [1, 6]}
        return {
            "passed": False,
            "languages": {},
            "reference": "tokenizers",
            "runtimes": {"llama.cpp": {"status": "differs", "languages": {"bn": row}, "first_mismatch": mismatch}},
        }

    monkeypatch.setattr("prodip.tokenizer.audit.run_parity", differs)
    monkeypatch.setattr("prodip.tokenizer.audit.format_parity", lambda report: "")
    report = run_audit(AuditConfig(tokenizer_dir=str(tok_dir), heldout={"bn": [str(heldout["bn"])]}))
    assert not report.gate.passed
    assert report.gate.failures == ["parity: llama.cpp gives different ids on 1 texts (bn 1; first: bn 'কো')"]


def test_gate_failure_names_language_figure_threshold(tok_dir, heldout, capsys):
    args = [
        "tokenizer",
        "audit",
        "--tokenizer-dir",
        str(tok_dir),
        "--heldout",
        f"bn={heldout['bn']}",
        "--min-chars-per-token",
        "bn=50",
        "--parity",
        "off",
    ]
    assert prodip_main(args) == 2  # a failed gate: one line, exit 2 (docs/pipeline.md)
    captured = capsys.readouterr()
    assert "chars/tok" in captured.out and "gate: FAILED" in captured.out
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("prodip tokenizer: error: fertility gate failed: bn: "), err
    assert "below the minimum 50" in err[0]
    assert "below the minimum" not in captured.out  # the failure is printed once, on stderr
    with pytest.raises(ValueError, match=r"bn: \d+\.\d+ chars/token is below the minimum 50") as err:
        check_gate(tok_dir)
    assert str(err.value).endswith("(retrain the tokenizer, or pass --force ([train] force = true) to train anyway)")
    forced = check_gate(tok_dir, force=True)
    assert forced is not None and forced.gate.passed is False
    assert forced.gate.min_chars_per_token == {"bn": 50} and forced.gate.failures[0].startswith("bn: ")
    # a re-audit that passes lifts the refusal; a changed tokenizer.json makes the audit stale
    args = [
        "tokenizer",
        "audit",
        "--tokenizer-dir",
        str(tok_dir),
        "--heldout",
        f"bn={heldout['bn']}",
        "--parity",
        "off",
    ]
    assert prodip_main(args) == 0


def test_check_gate_stale_and_unaudited(tmp_path):
    d = train_tokenizer_from_texts({"en": ["hello world"] * 3}, 300, tmp_path / "t")
    assert check_gate(d) is None
    with pytest.raises(ValueError, match="never audited"):
        check_gate(d, require_audit=True)
    (d / "fertility.json").write_text(
        json.dumps(
            {
                "format_version": 1,
                "tokenizer_sha256": "0" * 64,
                "vocab_size": 300,
                "languages": {},
                "gate": {"passed": True},
            }
        )
    )
    with pytest.raises(ValueError, match="stale"):
        check_gate(d)


def test_heldout_must_not_be_training_text(tok_dir, corpus):
    with pytest.raises(ValueError, match="was used to train this tokenizer"):
        run_audit(AuditConfig(tokenizer_dir=str(tok_dir), heldout={"bn": [str(corpus["bn"])]}))


def test_gate_failure_says_what_to_change_with_figures(tok_dir, heldout):
    """The gate's message names the figures a user changes: the language's sample, the vocabulary, the minimum."""
    info = json.loads((tok_dir / "train_info.json").read_text())
    report = run_audit(
        AuditConfig(
            tokenizer_dir=str(tok_dir),
            heldout={"bn": [str(heldout["bn"])]},
            min_chars_per_token={"bn": 50, "xx": 2},
            parity="off",
        )
    )
    bn, xx = report.gate.failures
    measured = report.languages["bn"].chars_per_token
    sample = report.sample["bn"]
    assert (
        sample["sample_chars"] == info["sample_chars"]["bn"]
        and sample["available_chars"] == info["available_chars"]["bn"]
    )
    assert sample["sample_share"] == pytest.approx(
        info["sample_chars"]["bn"] / sum(info["sample_chars"].values()), abs=1e-4
    )
    assert f"it held {sample['sample_chars']:,} bn characters" in bn and "[tokenizer] proportions" in bn
    assert f"a larger [tokenizer] vocab_size (now {report.vocab_size})" in bn
    assert f"[audit] min_chars_per_token.bn (measured {measured:.3f})" in bn
    assert "add xx files to [audit] heldout" in xx


def test_proportions_that_cut_a_language_are_logged_and_recorded(corpus, heldout, tmp_path, caplog):
    """Equal proportions over a small Bangla corpus cut the English sample to the Bangla size: said, not silent."""
    from prodip.tokenizer.bpe import TokenizerTrainConfig, train_tokenizer
    from tests.fixtures import write_sources

    small = tmp_path / "bn_small.txt"
    lines = (corpus["bn"] / "part.jsonl").read_text(encoding="utf-8").splitlines()
    small.write_text("\n\n".join(json.loads(x)["text"] for x in lines)[:20000], encoding="utf-8")
    write_sources(tmp_path, {"bn_small.txt": "bn"})
    tok = train_tokenizer(
        TokenizerTrainConfig(
            inputs={"bn": [str(small)], "en": [str(corpus["en"])]},
            out_dir=str(tmp_path / "tok"),
            vocab_size=400,
            proportions={"bn": 0.5, "en": 0.5},
        )
    )
    report = run_audit(AuditConfig(tokenizer_dir=str(tok), heldout={"bn": [str(heldout["bn"])]}, parity="off"))
    en = report.sample["en"]
    assert report.sample["bn"]["used"] >= 0.99 and en["used"] < 0.5
    assert en["sample_chars"] <= 1.05 * report.sample["bn"]["sample_chars"]  # equal shares: bn's size
    (warning,) = report.sample_warnings
    assert warning.startswith(f"en: the tokenizer in {tok} was trained on {en['sample_chars']:,} of ")
    assert "proportions set the sample's size from bn's text" in warning and warning in caplog.text
    assert json.loads((tok / "fertility.json").read_text())["sample_warnings"] == [warning]


def test_missing_heldout_names_the_table(tok_dir):
    from prodip.base.errors import InvalidInput

    with pytest.raises(InvalidInput, match=r"^\[audit\] heldout \(--heldout\): no languages given"):
        run_audit(AuditConfig(tokenizer_dir=str(tok_dir), parity="off"))


def test_report_folder_is_made_or_named_in_one_line(tok_dir, heldout, tmp_path, capsys):
    """`--report` in a folder that does not exist yet is written there (as eval and export make their output's
    folder); a --report that cannot be written is one line naming it, before the audit's work."""
    report = tmp_path / "not" / "yet" / "r.json"
    args = ["tokenizer", "audit", "--tokenizer-dir", str(tok_dir), "--heldout", f"bn={heldout['bn']}"]
    assert prodip_main([*args, "--parity", "off", "--report", str(report)]) == 0
    written = json.loads(report.read_text(encoding="utf-8"))
    assert written["tokenizer_sha256"] == file_sha256(tok_dir / "tokenizer.json")
    assert sorted(p.name for p in report.parent.iterdir()) == ["r.json"]  # no temporary file left
    capsys.readouterr()
    blocker = tmp_path / "a_file"
    blocker.write_text("x", encoding="utf-8")
    for bad, words in ((blocker / "sub" / "r.json", "cannot make its folder"), (tmp_path, "is a folder")):
        assert prodip_main([*args, "--report", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"prodip tokenizer: error: --report {bad}: {words}"), err


def test_a_heldout_folder_is_one_languages_files_and_they_are_named(tok_dir, heldout, tmp_path, capsys):
    folder = tmp_path / "held"
    (folder / "sub").mkdir(parents=True)
    bn_text = heldout["bn"].read_text(encoding="utf-8")
    (folder / "a.txt").write_text(bn_text[:3000], encoding="utf-8")
    (folder / "sub" / "b.txt").write_text(bn_text[3000:6000], encoding="utf-8")
    cfg = AuditConfig(
        tokenizer_dir=str(tok_dir), report=str(tmp_path / "f.json"), heldout={"bn": [str(folder)]}, parity="off"
    )
    report = run_audit(cfg)
    assert report.heldout_files == {"bn": [str(folder / "a.txt"), str(folder / "sub" / "b.txt")]}
    assert report.languages["bn"].chars == len(bn_text[:6000])
    assert json.loads((tmp_path / "f.json").read_text())["heldout_files"] == report.heldout_files
    assert f"held-out files: bn 2 ({folder / 'a.txt'}, {folder / 'sub' / 'b.txt'})" in format_table(report)
    # a folder holding another language's file given for that language too: refused, both named
    (folder / "udhr_eng.txt").write_text(heldout["en"].read_text(encoding="utf-8"), encoding="utf-8")
    both = {"bn": [str(folder)], "en": [str(folder / "udhr_eng.txt")]}
    with pytest.raises(ValueError, match=r"udhr_eng.txt is held-out text of both bn and en \(bn = .*held; en = "):
        run_audit(AuditConfig(tokenizer_dir=str(tok_dir), report=str(tmp_path / "g.json"), heldout=both))
    assert not (tmp_path / "g.json").exists()
