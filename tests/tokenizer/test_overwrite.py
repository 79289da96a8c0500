"""``--overwrite`` and reruns never delete what a newer prodip wrote, nor a folder prodip did not make.

Through the command line: exit code 2, one line naming the file and its format_version, every file left
byte for byte as it was (prodip.base.records.check_replaceable_dir / refuse_newer).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from prodip.cli import main as prodip_main
from tests.tokenizer.conftest import prepare_args


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _set_version(path: Path, version: int) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["format_version"] = version
    path.write_text(json.dumps(doc), encoding="utf-8")


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_data_prepare_overwrite_refuses_newer_shards_and_foreign_dirs(corpus, tok_dir, tmp_path, capsys):
    out = tmp_path / "shards"
    assert prodip_main(prepare_args(corpus, tok_dir, out)) == 0
    _set_version(out / "meta.json", 3)
    before = _snapshot(out)
    capsys.readouterr()
    assert prodip_main(prepare_args(corpus, tok_dir, out, "--overwrite", "true")) == 2
    err = _one_line_error(capsys)
    assert f"{out / 'meta.json'}: written by a newer prodip (format_version 3; this prodip reads 2)" in err
    assert "nothing was removed" in err
    assert _snapshot(out) == before and not list(tmp_path.glob(".shards.tmp*"))

    # an older prodip's shards (format_version 1, no longer read) are prodip's: --overwrite replaces them
    _set_version(out / "meta.json", 1)
    assert prodip_main(prepare_args(corpus, tok_dir, out, "--overwrite", "true")) == 0
    assert json.loads((out / "meta.json").read_text(encoding="utf-8"))["format_version"] == 2

    # a folder that holds no meta.json is not prodip's: never deleted, even with --overwrite
    other = tmp_path / "photos"
    other.mkdir()
    (other / "holiday.jpg").write_bytes(b"\xff\xd8 not shards")
    capsys.readouterr()
    assert prodip_main(prepare_args(corpus, tok_dir, other, "--overwrite", "true")) == 2
    err = _one_line_error(capsys)
    assert f"{other}: is not empty and is not a shards dir (no meta.json)" in err
    assert _snapshot(other) == {"holiday.jpg": b"\xff\xd8 not shards"}


def _train_args(out: Path, *more: str) -> list[str]:
    # refused before any input is read: the inputs need not exist
    return ["tokenizer", "train", "--inputs", "bn=/nonexistent/bn", "--out-dir", str(out), *more]


def test_tokenizer_train_overwrite_refuses_newer_tokenizer_dirs(tok_dir, tmp_path, capsys):
    for name, version in (("train_info.json", 2), ("fertility.json", 5)):
        out = tmp_path / name.split(".")[0]
        shutil.copytree(tok_dir, out)
        if not (out / name).exists():  # fertility.json: an audit of a newer prodip
            (out / name).write_text(json.dumps({"format_version": version, "gate": {"passed": True}}))
        _set_version(out / name, version)
        before = _snapshot(out)
        capsys.readouterr()
        assert prodip_main(_train_args(out, "--overwrite", "true")) == 2
        err = _one_line_error(capsys)
        assert f"{out / name}: written by a newer prodip (format_version {version}; this prodip reads 1)" in err
        assert "--overwrite true does not replace it" in err
        assert _snapshot(out) == before


def test_tokenizer_train_refuses_a_folder_that_is_not_a_tokenizer(tmp_path, capsys):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "todo.txt").write_text("keep me\n")
    for more in ([], ["--overwrite", "true"]):
        assert prodip_main(_train_args(out, *more)) == 2
        err = _one_line_error(capsys)
        assert f"{out}: is not empty and is not a tokenizer dir (no tokenizer.json)" in err
    assert _snapshot(out) == {"todo.txt": b"keep me\n"}


def test_tokenizer_audit_refuses_a_newer_fertility_json(tok_dir, heldout, tmp_path, capsys):
    tok = shutil.copytree(tok_dir, tmp_path / "tok")
    (tok / "fertility.json").write_text(json.dumps({"format_version": 4, "from": "the future"}))
    before = _snapshot(tok)
    args = ["tokenizer", "audit", "--tokenizer-dir", str(tok), "--heldout", f"bn={heldout['bn']}", "--parity", "off"]
    assert prodip_main(args) == 2
    err = _one_line_error(capsys)
    assert f"{tok / 'fertility.json'}: written by a newer prodip (format_version 4; this prodip reads 1)" in err
    assert "prodip tokenizer audit does not replace it" in err
    assert _snapshot(tok) == before
