"""The command line tells a user's mistake (one line, exit 2) from a bug (traceback, exit 1).

python -m pytest tests/prodip/test_cli_errors.py -q
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from prodip.base.cli import BUG_HINT, run_command
from prodip.base.errors import ConfigError, InvalidInput, MissingInput, StageFailed


@pytest.mark.parametrize(
    "err",
    [
        InvalidInput("shards/meta.json: vocab_size 9 exceeds 8"),
        MissingInput("x/tokenizer.json: not found"),
        ConfigError("a.toml [train] lr: must be > 0"),
        StageFailed("conformance failed: see r.md"),
        PermissionError(13, "Permission denied", "/root/out"),
    ],
)
def test_user_errors_are_one_line_exit_2(err, capsys):
    def fail(args):
        raise err

    assert run_command(fail, argparse.Namespace(verbose=False), "train") == 2
    out = capsys.readouterr().err
    assert out.startswith("prodip train: error: ") and out.count("\n") == 1 and "Traceback" not in out


@pytest.mark.parametrize(
    "err",
    [
        RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)"),
        ValueError("a bug's ValueError"),
        KeyError("layers.0"),
    ],
)
def test_bugs_show_their_traceback_and_ask_for_a_report(err, capsys):
    """A shape mismatch from torch (RuntimeError) or a bare ValueError is not the user's fault."""

    def fail(args):
        raise err

    assert run_command(fail, argparse.Namespace(verbose=False), "export") == 1
    out = capsys.readouterr().err
    assert "Traceback (most recent call last)" in out and BUG_HINT.format(command="export") in out


def test_verbose_shows_the_traceback_of_a_user_error():
    def fail(args):
        raise InvalidInput("bad")

    with pytest.raises(InvalidInput):
        run_command(fail, argparse.Namespace(verbose=True), "train")


def test_a_real_command_reports_a_missing_checkpoint_in_one_line(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "prodip", "export", str(tmp_path / "nope"), "--out", str(tmp_path / "e")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("prodip export: error: ") and "Traceback" not in res.stderr
