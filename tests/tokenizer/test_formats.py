"""Issue 12: corpus formats (Parquet, CSV, JSONL with another text field, `datasets` save_to_disk
folders), skipped files listed, repeated language keys merged, and `data prepare`'s warnings for a
language the tokenizer serves badly."""

from __future__ import annotations

import json
import logging
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prodip.cli import main as prodip_main
from prodip.tokenizer.corpus import expand_inputs, iter_documents
from prodip.tokenizer.encode import DataPrepareConfig, prepare_shards
from prodip.tokenizer.shards import load_meta
from tests.fixtures import write_sources

DOCS = ["আমার সোনার বাংলা, আমি তোমায় ভালোবাসি।", "চিরদিন তোমার আকাশ, তোমার বাতাস", "It was a bright cold day."]


def test_parquet_csv_jsonl_with_a_text_field(tmp_path):
    pq.write_table(pa.table({"id": [1, 2, 3], "content": DOCS}), tmp_path / "a.parquet")
    (tmp_path / "b.csv").write_text(
        "id,content\n" + "".join(f'{i},"{d}"\n' for i, d in enumerate(DOCS)), encoding="utf-8"
    )
    (tmp_path / "c.jsonl").write_text(
        "".join(json.dumps({"content": d}, ensure_ascii=False) + "\n" for d in DOCS), encoding="utf-8"
    )
    for name in ("a.parquet", "b.csv", "c.jsonl"):
        assert list(iter_documents(tmp_path / name, "bn", text_field="content")) == DOCS, name
        with pytest.raises(ValueError, match=rf"{name}.*'text'.*text_field"):
            list(iter_documents(tmp_path / name, "bn"))  # the default field is absent: named, with the fix
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match=r"bad\.parquet: cannot read as Parquet"):
        list(iter_documents(tmp_path / "bad.parquet", "bn", text_field="content"))


def test_datasets_save_to_disk_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"body": DOCS[:2]}),
            "test": datasets.Dataset.from_dict({"body": DOCS[2:]}),
        }
    ).save_to_disk(str(tmp_path / "dd"))
    datasets.Dataset.from_dict({"body": DOCS}).save_to_disk(str(tmp_path / "corpus" / "ds"))
    (tmp_path / "corpus" / "notes.md").write_text("not a corpus file")
    skipped = []
    files = expand_inputs({"bn": [str(tmp_path / "corpus")]}, skipped=skipped)
    assert files["bn"] == [tmp_path / "corpus" / "ds"]  # one input, its Arrow files not searched
    assert skipped == [tmp_path / "corpus" / "notes.md"]
    assert list(iter_documents(tmp_path / "corpus" / "ds", "bn", text_field="body")) == DOCS
    assert list(iter_documents(tmp_path / "dd", "bn", text_field="body")) == DOCS[2:] + DOCS[:2]  # splits by name


def test_skipped_files_are_listed_and_suffixes_any_case(tmp_path, caplog):
    """Issue 12: files with other suffixes or upper-case names inside a folder were skipped without a message."""
    folder = tmp_path / "en"
    folder.mkdir()
    (folder / "A.TXT").write_text("upper case name\n")
    (folder / "b.txt").write_text("lower\n")
    (folder / "c.docx").write_text("x")
    (folder / "d.json").write_text("{}")
    with caplog.at_level(logging.WARNING):
        files = expand_inputs({"en": [str(folder)]})
    assert [f.name for f in files["en"]] == ["A.TXT", "b.txt"]
    warning = next(r.getMessage() for r in caplog.records if "skipped 2 file(s)" in r.getMessage())
    assert str(folder / "c.docx") in warning and str(folder / "d.json") in warning


def test_repeated_language_key_merges_inputs(corpus, tok_dir, tmp_path, capsys):
    """Issue 12: `--inputs en=corpus/en,en=extra/en.tsv` kept only the second `en`."""
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"text": "An extra English document, never seen before."}) + "\n")
    write_sources(tmp_path, {"extra.jsonl": "en"})
    out = tmp_path / "shards"
    argv = ["data", "prepare", "--tokenizer-dir", str(tok_dir), "--out-dir", str(out), "--progress", "false"]
    argv += ["--inputs", f"en={corpus['en']},en={extra}"]
    assert prodip_main(argv) == 0
    en = load_meta(out).to_dict()["languages"]["en"]
    assert en["chars"] > 50_000  # the folder's 60k characters and the extra document
    with pytest.raises(SystemExit):  # argparse: exit 2 naming the flag
        prodip_main(["train", "--mixture", "bn=0.5,bn=0.5", "--steps", "1"])
    assert "'bn' given twice" in capsys.readouterr().err


def test_prepare_warns_for_an_unseen_script_and_low_chars_per_token(corpus, tok_dir, tmp_path, caplog):
    """Issue 12: a language the tokenizer never saw (Hindi at 0.40 chars/token) was encoded with no warning."""
    hi = tmp_path / "hi.txt"
    hi.write_text("भारत एक विशाल देश है। यहाँ अनेक भाषाएँ बोली जाती हैं। " * 200, encoding="utf-8")
    write_sources(tmp_path, {"hi.txt": "hi"})
    audited = tmp_path / "tok"
    shutil.copytree(tok_dir, audited)
    gate = {"passed": True, "failures": [], "min_chars_per_token": {"bn": 2.0, "en": 2.0}}
    audit = {"format_version": 1, "tokenizer_sha256": "0" * 64, "vocab_size": 1024, "languages": {}, "gate": gate}
    (audited / "fertility.json").write_text(json.dumps(audit))
    cfg = DataPrepareConfig(
        tokenizer_dir=str(audited),
        inputs={"en": [str(corpus["en"])], "hi": [str(hi)]},
        out_dir=str(tmp_path / "shards"),
        progress=False,
    )
    with caplog.at_level(logging.WARNING):
        prepare_shards(cfg)
    warnings = load_meta(tmp_path / "shards").to_dict()["language_warnings"]
    assert any(w.startswith("hi: ") and "chars/token, below" in w for w in warnings), warnings
    assert any(w.startswith("hi: ") and "Devanagari script" in w for w in warnings), warnings
    assert not any(w.startswith("en: ") for w in warnings)


def test_tokenizer_train_and_audit_take_the_text_field_as_data_prepare_does(tmp_path):
    """`prodip tokenizer train` had no --text-field: a JSONL corpus whose text is not under "text" could not train
    a tokenizer, though `data prepare` read it. In a pipeline file, [data]'s reader options are every stage's."""
    from prodip.pipeline import resolve_all
    from prodip.tokenizer.bpe import load_tokenizer

    docs = [d + f" {i}" for i in range(200) for d in DOCS]
    (tmp_path / "bn.jsonl").write_text(
        "".join(json.dumps({"content": d}, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8"
    )
    (tmp_path / "held.jsonl").write_text(json.dumps({"content": DOCS[0]}, ensure_ascii=False) + "\n", encoding="utf-8")
    write_sources(tmp_path, {"bn.jsonl": "bn", "held.jsonl": "bn"})
    out = tmp_path / "tok"
    args = ["tokenizer", "train", "--inputs", f"bn={tmp_path / 'bn.jsonl'}", "--out-dir", str(out)]
    assert prodip_main([*args, "--vocab-size", "300"]) == 2  # the field is named in the one-line error
    assert prodip_main([*args, "--vocab-size", "300", "--text-field", "content"]) == 0
    info = json.loads((out / "train_info.json").read_text())
    assert info["available_chars"]["bn"] == sum(map(len, docs))
    assert load_tokenizer(out).get_vocab_size() <= 300
    audit = ["tokenizer", "audit", "--tokenizer-dir", str(out), "--heldout", f"bn={tmp_path / 'held.jsonl'}"]
    assert prodip_main([*audit, "--parity", "off", "--text-field", "content"]) == 0
    tables = {"data": {"text_field": "content", "doc_chars": 500}, "audit": {"text_field": "body"}}
    plan = resolve_all("c.toml", tables, tmp_path / "run")
    assert (plan.tokenizer.text_field, plan.tokenizer.doc_chars) == ("content", 500)
    assert plan.audit.text_field == "body"  # a table's own setting wins
