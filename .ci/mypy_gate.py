"""``make lint``'s type check: mypy over the installed package, held to a baseline that only goes down.

mypy runs on ``build/lint`` (the package as installed, so ``prodip.serve`` is ``prodip/serve``, not the
source tree's ``serve/``) with the ``[tool.mypy]`` settings of ``pyproject.toml``: ``prodip.base`` and ``prodip.serve`` strict.
Errors are counted per file and compared with ``.ci/mypy-baseline.json`` (file -> count): a file with more
errors than its count (or any error in ``prodip/base/``) fails; a file with fewer prints the command
that lowers the baseline. Exit 0 clean, 1 over the baseline, 2 mypy itself failed.

    python .ci/mypy_gate.py            # after `make lint` has built build/lint
    python .ci/mypy_gate.py --update   # write the current counts (only after fixing errors)
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_DIR = ROOT / "build" / "lint"
BASELINE = ROOT / ".ci" / "mypy-baseline.json"
#: modules checked strictly: no baseline, no error
STRICT = ("prodip/base/", "prodip/serve/")
ERROR = re.compile(r"^(?P<path>[^:\s]+\.py):\d+: error: ")


def run_mypy() -> tuple[list[str], int]:
    """mypy's output lines and exit code (0 clean, 1 type errors, 2 crash or bad config)."""
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    cmd += ["--cache-dir", str(ROOT / "build" / "mypy_cache"), "-p", "prodip"]
    done = subprocess.run(cmd, cwd=LINT_DIR, capture_output=True, text=True)
    return (done.stdout + done.stderr).splitlines(), done.returncode


def count(lines: list[str]) -> dict[str, int]:
    """file -> number of ``error:`` lines (notes are not counted)."""
    return dict(collections.Counter(m["path"] for m in map(ERROR.match, lines) if m))


def compare(now: dict[str, int], baseline: dict[str, int]) -> tuple[list[str], list[str]]:
    """(files over their baseline or in a strict module, files under it)."""
    over = [p for p, n in sorted(now.items()) if p.startswith(STRICT) or n > baseline.get(p, 0)]
    under = [p for p, n in sorted(baseline.items()) if now.get(p, 0) < n]
    return over, under


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="write the current counts to .ci/mypy-baseline.json")
    args = parser.parse_args(argv)
    if not (LINT_DIR / "prodip").is_dir():
        print(f"{LINT_DIR}: not built; run `make lint`", file=sys.stderr)
        return 2
    lines, code = run_mypy()
    if code not in (0, 1):
        print("\n".join(lines), file=sys.stderr)
        return 2
    now = count(lines)
    if args.update:
        BASELINE.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"{BASELINE.name}: {sum(now.values())} errors in {len(now)} files")
        return 0
    baseline = json.loads(BASELINE.read_text(encoding="utf-8"))
    over, under = compare(now, baseline)
    for path in over:
        print("\n".join(line for line in lines if line.startswith(path + ":")))
        limit = 0 if path.startswith(STRICT) else baseline.get(path, 0)
        print(f"{path}: {now[path]} mypy errors, at most {limit} allowed ({BASELINE.name})")
    if under:
        print(
            f"mypy: fewer errors than {BASELINE.name} in {', '.join(under)}; lower it: python .ci/mypy_gate.py --update"
        )
    print(f"mypy: {sum(now.values())} errors (baseline {sum(baseline.values())})")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
