""".ci/mypy_gate.py: errors are counted per file and held to the baseline; base and serve allow none."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("mypy_gate", Path(__file__).resolve().parents[2] / ".ci/mypy_gate.py")
gate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gate)

LINES = [
    'prodip/export/core.py:227: error: Argument "x" to "run" has incompatible type "float"  [arg-type]',
    "prodip/export/core.py:229: error: Argument 2  [arg-type]",
    "prodip/export/core.py:229: note: Possible overload variants:",
    "prodip/train/model.py:3: error: Need type annotation  [var-annotated]",
    "Found 3 errors in 2 files (checked 116 source files)",
]


def test_errors_are_counted_per_file_and_notes_are_not():
    assert gate.count(LINES) == {"prodip/export/core.py": 2, "prodip/train/model.py": 1}


def test_more_errors_than_the_baseline_fail_and_fewer_are_reported():
    now = gate.count(LINES)
    assert gate.compare(now, {"prodip/export/core.py": 2, "prodip/train/model.py": 1}) == ([], [])
    assert gate.compare(now, {"prodip/export/core.py": 1, "prodip/train/model.py": 1}) == (
        ["prodip/export/core.py"],
        [],
    )
    assert gate.compare(now, {"prodip/export/core.py": 2}) == (["prodip/train/model.py"], [])  # a new file
    assert gate.compare(now, {"prodip/export/core.py": 5, "prodip/train/model.py": 1}) == (
        [],
        ["prodip/export/core.py"],
    )


def test_prodip_base_allows_no_error_whatever_the_baseline_says():
    now = {"prodip/base/files.py": 1}
    assert gate.compare(now, {"prodip/base/files.py": 1}) == (["prodip/base/files.py"], [])


def test_prodip_serve_is_strict_too():
    now = {"prodip/serve/app.py": 1}
    assert gate.compare(now, {"prodip/serve/app.py": 1}) == (["prodip/serve/app.py"], [])


def test_docs_name_the_strict_packages_of_pyproject_and_the_gate():
    """docs/development.md says which packages mypy is strict on: those of pyproject's strict override, which
    are the gate's STRICT folders."""
    import re

    from prodip.base.config import tomllib  # tomli on Python 3.10

    root = Path(__file__).resolve().parents[2]
    overrides = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]["overrides"]
    strict = next(o for o in overrides if o.get("disallow_untyped_defs"))
    packages = sorted(m for m in strict["module"] if not m.endswith(".*"))
    assert sorted(p.rstrip("/").replace("/", ".") for p in gate.STRICT) == packages
    doc = " ".join((root / "docs" / "development.md").read_text(encoding="utf-8").split())
    said = re.search(r"mypy is strict on (.*?) \(", doc)
    assert said and sorted(re.findall(r"`([\w.]+)`", said.group(1))) == packages, said
