"""The house rules of the source tree: one installed package, documents that exist, no machine paths.

python -m pytest tests/prodip/test_layout.py -q
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAGES = ("tokenizer", "train", "export", "conformance", "serve")
SOURCE_DIRS = ("prodip", *STAGES, "bench", "tests", "configs", "data")


def _source_files() -> list[Path]:
    files = []
    for d in SOURCE_DIRS:
        files += [p for p in (REPO / d).rglob("*") if p.suffix in (".py", ".toml", ".md") and p.is_file()]
    return files + [REPO / "README.md", REPO / "CONTRACTS.md", REPO / "pyproject.toml", REPO / "Makefile"]


def test_only_prodip_is_importable_outside_the_checkout(tmp_path):
    """After install, `import train` (a name users' own scripts use) finds nothing; prodip.<stage> works."""
    code = (
        "import importlib.util, json; "
        f"print(json.dumps({{n: importlib.util.find_spec(n) is not None for n in {list(STAGES)!r}}})); "
        "import prodip.train.model, prodip.serve.engine, prodip.base.variants"
    )
    res = subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert (
        res.stdout.strip()
        == '{"tokenizer": false, "train": false, "export": false, "conformance": false, "serve": false}'
    )


def test_every_cited_document_exists():
    """A docstring or comment that cites a Markdown document names a file of the repository (CONTRACTS.md, ...)."""
    missing = []
    for path in _source_files():
        for name in set(re.findall(r"\b([A-Z][A-Z_]+\.md)\b", path.read_text(encoding="utf-8", errors="replace"))):
            if name in ("PROVENANCE.md",):  # ../shared/data/PROVENANCE.md, cited as the data's source
                continue
            if not any((REPO / d / name).exists() for d in ("", *SOURCE_DIRS, "serve", "conformance", "data")):
                missing.append(f"{path.relative_to(REPO)} cites {name}")
    assert not missing, missing


def test_no_machine_paths_in_code():
    """Paths are relative to the repository (or ../shared); no one machine's absolute paths in code or configs."""
    hits = []
    for path in _source_files():
        if path.suffix not in (".py", ".toml") or path == Path(__file__).resolve():
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"['\"`(]/(work|home|root|Users)/", line):
                hits.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not hits, hits
