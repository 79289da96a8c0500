"""A write refused for lack of room (full disk, ``ulimit -f``, quota, read-only) is one line naming the file and the
free space, exit 2, and the earlier artifact stays whole: for every artifact writer.

The limit is the process's file-size limit (RLIMIT_FSIZE, ``ulimit -f``; Python ignores SIGXFSZ, so a write past it
is EFBIG), lowered around one call in this process, or set for a ``prodip`` subprocess.

python -m pytest tests/prodip/test_write_room.py -q
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import resource
import signal
import subprocess
import sys

import numpy as np
import pytest

from prodip.base.cli import run_command
from prodip.base.config import write_text_atomic
from prodip.base.errors import WriteFailed
from prodip.base.files import file_sha256, room_errno, writing

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="POSIX file-size limit")


@contextlib.contextmanager
def file_size_limit(n_bytes: int):
    """RLIMIT_FSIZE lowered to ``n_bytes`` for the block (soft limit only: it can be raised back)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


def _one_line_exit_2(func, capsys, command="x") -> str:
    assert run_command(lambda _a: func(), argparse.Namespace(verbose=False), command) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_safetensors_own_error_is_a_room_error(capsys):
    """safetensors raises SafetensorError (not OSError) for a full disk: before, a traceback and exit 1."""
    from safetensors import SafetensorError

    err = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert room_errno(err) == errno.ENOSPC
    assert room_errno(SafetensorError("Error while deserializing header: HeaderTooLarge")) is None

    def fail():
        raise err

    line = _one_line_exit_2(fail, capsys, "export")
    assert line.startswith("prodip export: error: ") and "No space left on device" in line and " free on " in line


def test_safetensors_write_past_the_limit_names_the_file(tmp_path):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    with pytest.raises(WriteFailed) as info, file_size_limit(4096), writing(path):
        save_file({"w": torch.zeros(4096)}, str(path))
    assert info.value.errno == errno.EFBIG and str(path) in str(info.value)
    assert "file-size limit (ulimit -f) 4.0 KiB" in str(info.value) and " free on " in str(info.value)


def test_text_artifact_keeps_the_old_file(tmp_path, capsys):
    """write_text_atomic: conformance report, eval result, pipeline summary/times, run config."""
    path = tmp_path / "report.json"
    path.write_text("old\n")
    with file_size_limit(1024):
        line = _one_line_exit_2(lambda: write_text_atomic(path, "x" * 5000), capsys)
    assert f"{path}: cannot write: File too large" in line and "the earlier" in line
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_conformance_report(tmp_path):
    from prodip.conformance.report import write_report

    with pytest.raises(WriteFailed) as info, file_size_limit(256):
        report = {"format_version": 1, "passed": True, "variants": {}, "export_files_sha256": "0" * 64}
        write_report({**report, "rows": ["x" * 64] * 20}, tmp_path)
    assert str(tmp_path / "report.json") in str(info.value)


def test_shard_and_its_meta(tmp_path):
    from prodip.tokenizer import shards

    path = tmp_path / "train_000.bin"
    with pytest.raises(WriteFailed) as info, file_size_limit(4096):
        shards.write_shard(path, np.arange(10_000) % 300, "uint16")
    assert str(path) in str(info.value) and not path.exists()


def test_tokenizer_dir_keeps_the_old_one(tmp_path):
    from prodip.tokenizer.bpe import load_tokenizer, save_tokenizer_dir, train_tokenizer_from_texts

    old = train_tokenizer_from_texts({"bn": ["আমি বাংলায় গান গাই"] * 50, "en": ["hello world"] * 50}, 300, tmp_path / "tok")
    before = file_sha256(old / "tokenizer.json")
    tok = load_tokenizer(old)
    with pytest.raises(WriteFailed) as info, file_size_limit(2048):
        save_tokenizer_dir(tok, old, overwrite=True)
    assert f"{old}/tokenizer.json: cannot write" in str(info.value) and "the earlier" in str(info.value)
    assert file_sha256(old / "tokenizer.json") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]


def test_loss_plot(tmp_path):
    from prodip.train.observe import plot_loss

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss": 5.0 - s / 10}) + "\n" for s in range(20)))
    with pytest.raises(WriteFailed) as info, file_size_limit(1024):
        plot_loss(metrics, tmp_path / "loss.png")
    assert str(tmp_path / "loss.png") in str(info.value)


def test_checkpoint_keeps_latest(tmp_path):
    from prodip.train.checkpoint import save_checkpoint
    from tests.fixtures import build_tiny_checkpoint, tiny_model, tiny_model_config

    run = build_tiny_checkpoint(tmp_path, step=10)
    ckpts = run / "checkpoints"
    config = tiny_model_config(vocab_size=512)
    with pytest.raises(WriteFailed) as info, file_size_limit(64 * 1024):
        save_checkpoint(
            ckpts, step=20, model=tiny_model(config), model_config=config, tokenizer_dir=tmp_path / "tokenizer"
        )
    assert f"{ckpts}/step_0000020/model.safetensors: cannot write: File too large" in str(info.value)
    assert (ckpts / "latest").read_text().strip() == "step_0000010"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_0000010"]


def _limited(n_kib: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (n_kib * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return preexec


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from tests.fixtures import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("room")
    run = build_tiny_checkpoint(root)
    prodip = [sys.executable, "-m", "prodip"]
    subprocess.run(
        [*prodip, "export", str(run), "--out", str(root / "exp"), "--variants", "fp32"], check=True, capture_output=True
    )
    return root, run


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kib", "file"),
    [(300, "model.safetensors"), (600, "onnx/model.onnx")],  # safetensors' own error; onnx's OSError
)
def test_export_cli_one_line_exit_2_old_export_intact(exported, kib, file):
    """The reported case (N1, N2): ``prodip export`` under ``ulimit -f``."""
    root, run = exported
    exp = root / "exp"
    before = file_sha256(exp / "manifest.json")
    proc = subprocess.run(
        [sys.executable, "-m", "prodip", "export", str(run), "--out", str(exp), "--variants", "fp32", "--force"],
        capture_output=True,
        text=True,
        preexec_fn=_limited(kib),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"prodip export: error: {exp / file}: cannot write: File too large")
    assert f"file-size limit (ulimit -f) {kib}.0 KiB" in proc.stderr and " free on " in proc.stderr
    assert file_sha256(exp / "manifest.json") == before
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []  # no temp folder left


def test_manifest_rewrite_keeps_the_old_one(tmp_path):
    """The export manifest's verdict rewrite (conformance): the old manifest stays, no temp file is left."""
    from prodip.base.manifest import ExportManifest

    path = tmp_path / "manifest.json"
    path.write_text('{"files": {}}\n')
    big = {f"f{i}": {"bytes": 1, "sha256": "x" * 64} for i in range(64)}
    record = ExportManifest(format_version=1, source_checkpoint={}, files=big, variants={})
    with pytest.raises(WriteFailed) as info, file_size_limit(1024):
        record.write(path)
    assert f"{path}: cannot write" in str(info.value)
    assert path.read_text() == '{"files": {}}\n' and [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 64 KiB tmpfs (a real full disk: ENOSPC), where this process may mount one (root); else skipped."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_full_disk_names_file_and_mount(small_tmpfs):
    from prodip.tokenizer import shards

    path = small_tmpfs / "report.json"
    path.write_text("old\n")
    with pytest.raises(WriteFailed) as info:
        write_text_atomic(path, "x" * 200_000)
    assert info.value.errno == errno.ENOSPC and str(path) in str(info.value)
    assert f"free on {small_tmpfs})" in str(info.value) and "No space left on device" in str(info.value)
    assert path.read_text() == "old\n" and sorted(p.name for p in small_tmpfs.iterdir()) == ["report.json"]
    with pytest.raises(WriteFailed, match="train_000.bin: cannot write: No space left on device"):
        shards.write_shard(small_tmpfs / "train_000.bin", np.arange(100_000) % 300, "uint16")
