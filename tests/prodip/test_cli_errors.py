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
        PermissionError(13, "Permission denied", "runs/locked"),
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


def _parsers(parser: argparse.ArgumentParser):
    """``parser`` and every subcommand parser under it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


@pytest.mark.parametrize("stage", ["tokenizer", "data", "train", "eval", "export", "conformance", "serve", "run"])
def test_every_help_renders(stage):
    """`prodip export --help` crashed on a "%" in an option's help (argparse %-formats help texts)."""
    from prodip.cli import build_parser

    seen = 0
    for parser in _parsers(build_parser([stage])):
        assert parser.format_help().startswith("usage: ")
        seen += 1
    assert seen > 1


@pytest.mark.parametrize(
    "module, args",
    [
        ("prodip.tokenizer.portable", ["{missing}"]),
        ("prodip.tokenizer.gguf", ["{missing}", "{tmp}/out.gguf"]),
        ("prodip.tokenizer.shards", ["{missing}"]),
        ("prodip.tokenizer.corpus", ["{missing}/a.txt"]),
        ("prodip.tokenizer.parity", ["{missing}", "--runtimes", "transformers"]),
    ],
)
def test_module_tools_report_a_missing_input_in_one_line(module, args, tmp_path):
    """`python -m prodip.tokenizer.portable DIR` printed a traceback (exit 1) for a missing DIR."""
    argv = [a.format(missing=tmp_path / "nope", tmp=tmp_path) for a in args]
    r = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1 and "nope" in r.stderr, r.stderr
