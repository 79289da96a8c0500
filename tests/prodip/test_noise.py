"""A run that works prints nothing that is not about the user's data or settings: no library noise (torchao's
CUDA kernels and triton, torch's _pytree deprecation, gguf-py's per-file notes, ExecuTorch's tokenizer's C++
log lines) and no blank lines from progress bars drawn off a terminal. ``--verbose`` still shows the library
lines.

python -m pytest tests/prodip/test_noise.py -q
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import write_sources

REPO = Path(__file__).resolve().parents[2]

#: The lines the demo printed on a healthy run (one pattern each).
NOISE = [
    r"Failed to load .*_C_(mxfp8|cutlass)",
    r"Detected no triton",
    r"_pytree",
    r"Little Endian only",
    r"vocab\.gguf\.tmp",
    r"Writing the following files",
    r"Registering override fallback regex",
]


def _noise(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(re.search(p, line) for p in NOISE)]


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO)


def test_library_noise_only_with_verbose():
    """Importing torchao (ExecuTorch imports it, transformers probes it) and writing a GGUF log their lines
    under plain logging; under prodip's logging they are gone, and ``--verbose`` (DEBUG) shows them."""
    pytest.importorskip("torchao")
    pytest.importorskip("gguf")
    code = """
import logging, sys, tempfile
{setup}
import torchao  # noqa
import gguf
w = gguf.GGUFWriter(tempfile.mktemp(suffix=".gguf"), "llama")
w.add_name("x"); w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
logging.getLogger("prodip.test").warning("about the user's data")
"""
    plain = _python(code.format(setup="logging.basicConfig(level=logging.INFO)"))
    assert plain.returncode == 0, plain.stderr
    found = _noise(plain.stderr)
    for pattern in (r"Failed to load", r"Detected no triton", r"Little Endian only"):
        assert any(re.search(pattern, line) for line in found), (pattern, plain.stderr)  # the noise is real
    quiet = _python(code.format(setup="from prodip.base.cli import setup_logging; setup_logging()"))
    assert quiet.returncode == 0 and _noise(quiet.stderr) == [], quiet.stderr
    assert "about the user's data" in quiet.stderr  # prodip's own warnings still show
    verbose = _python(code.format(setup="from prodip.base.cli import setup_logging; setup_logging(verbose=True)"))
    assert any("Detected no triton" in line for line in _noise(verbose.stderr)), verbose.stderr


@pytest.mark.slow
def test_tokenizer_stage_output_is_only_about_the_run(tmp_path):
    """`prodip run --stages tokenizer` on a tiny corpus (training, audit, and the parity check that runs every
    tokenizer runtime, llama.cpp's vocabulary GGUF and ExecuTorch's C++ tokenizer included): none of the
    noise lines, and the stage's header is followed by its report, not by blank lines."""
    from tests.test_pipeline import TINY_TOML, _cut_corpus

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _cut_corpus(corpus, "bn", 40_000, 8_000)
    _cut_corpus(corpus, "en", 40_000, 8_000)
    write_sources(corpus, {"bn_*.txt": "bn", "en_*.txt": "en"}, license="LicenseRef-PublicDomain")
    config = tmp_path / "tiny.toml"
    config.write_text(TINY_TOML.format(out=tmp_path / "run", corpus=corpus, repo=REPO), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "prodip", "run", str(config), "--stages", "tokenizer"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _noise(proc.stdout) == [] and _noise(proc.stderr) == [], proc.stderr
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("[1/1] tokenizer: train"))
    assert lines[header + 1].strip(), lines[header : header + 5]  # no empty progress-bar lines
    assert "parity: PASSED" in proc.stdout
