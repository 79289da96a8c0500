"""``prodip serve --config FILE`` checks the whole file as ``prodip run`` does (an unknown key in any table is
an error naming it), in an install without torch: the check runs in a process where the train and runtimes
extras' modules (torch first) cannot be imported, as in the default install that serves.

python -m pytest tests/serve/test_config_check.py -q
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

from prodip.base.config import read_toml

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo.toml"

#: Runs ``prodip serve EXPORT --config FILE`` (argv[1], argv[2]) with every module in argv[3:] unimportable.
CHECK = """
import sys
for name in sys.argv[3:]:
    sys.modules[name] = None  # `import name` raises ModuleNotFoundError, as where it is not installed
try:
    import torch
except ImportError:
    pass
else:
    raise SystemExit("torch is importable")
from prodip.cli import main
code = main(["serve", sys.argv[1], "--config", sys.argv[2]])
print("torch" in sys.modules and sys.modules["torch"] is not None)
sys.exit(code)
"""


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _extras_modules() -> list[str]:
    """The top-level modules only the train and runtimes extras install (pyproject.toml), among those installed:
    modules also installed by another distribution (a shared namespace) are left importable."""
    project = read_toml(REPO / "pyproject.toml")["project"]
    extras = project["optional-dependencies"]
    names = {_norm(re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0]) for d in (*extras["train"], *extras["runtimes"])}
    modules = [
        m
        for m, dists in importlib.metadata.packages_distributions().items()
        if dists and all(_norm(d) in names for d in dists)
    ]
    return sorted(modules)


def _serve(export: Path, config: Path, blocked: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHECK, str(export), str(config), *blocked],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def blocked() -> list[str]:
    modules = _extras_modules()
    assert "torch" in modules and "pyarrow" in modules and "transformers" in modules, modules
    return modules


def test_an_unknown_key_in_another_table_is_named_without_torch(tmp_path, blocked):
    text = DEMO.read_text(encoding="utf-8")
    assert text.count("\n[train]\n") == 1
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("\n[train]\n", "\n[train]\nwarmup_step = 10\n"), encoding="utf-8")
    done = _serve(tmp_path / "no_export", bad, blocked)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{bad} [train]: unknown key 'warmup_step'; did you mean warmup_steps?" in done.stderr, done.stderr
    assert "no_export" not in done.stderr  # refused before serve looked for the export


def test_the_demo_config_passes_without_torch(tmp_path, blocked):
    """The check passes; serve then goes on to load the export dir, which here does not exist."""
    done = _serve(tmp_path / "no_export", DEMO, blocked)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip() == (
        f"prodip serve: error: {tmp_path / 'no_export'}: export dir not found; it is written by "
        "`prodip export CHECKPOINT --out EXPORT_DIR`"
    ), done.stderr
    assert done.stdout.strip() == "False"  # nothing imported torch
