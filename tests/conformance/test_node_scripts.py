"""The conformance package's Node scripts: the modules they import beside them are shipped with the Python
package, and the shared package-version reader reads the installed versions.

python -m pytest tests/conformance/test_node_scripts.py -q
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prodip.conformance.runtimes.common import SCRIPTS_DIR

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / "node"
#: A relative ES module import: ``import { x } from './name.mjs'``.
LOCAL_IMPORT = re.compile(r"""^import\s[^'"]*from\s+['"]\./([^'"]+)['"]""", re.M)


def _shipped(name: str) -> bool:
    """Whether pyproject's package-data for ``prodip.conformance`` ships the file ``name`` of the package dir."""
    globs = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    return any(fnmatch.fnmatch(name, g) for g in globs["prodip.conformance"])


def test_every_module_a_script_imports_is_shipped_beside_it():
    imports = {
        script.name: LOCAL_IMPORT.findall(script.read_text(encoding="utf-8")) for script in SCRIPTS_DIR.glob("*.mjs")
    }
    for script in ("transformersjs_greedy.mjs", "transformersjs_speed.mjs", "chat_template.mjs", "ortweb_greedy.mjs"):
        assert imports[script] == ["package_versions.mjs"], script
    for script, names in imports.items():
        for name in names:
            assert (SCRIPTS_DIR / name).is_file() and _shipped(name), (script, name)


def test_package_versions_are_the_installed_ones(tmp_path):
    if shutil.which("node") is None or not (NODE_DIR / "node_modules" / "@huggingface" / "transformers").is_dir():
        if os.environ.get("PRODIP_REQUIRE_RUNTIMES") == "1":
            pytest.fail("node and @huggingface/transformers are needed (PRODIP_REQUIRE_RUNTIMES=1)")
        pytest.skip("needs node and @huggingface/transformers (npm install --ignore-scripts --prefix node)")
    module = (SCRIPTS_DIR / "package_versions.mjs").as_uri()
    code = (
        f"import {{ packageVersion, transformersjsVersions }} from '{module}';"
        "const root = process.argv[1];"
        "console.log(JSON.stringify({tjs: transformersjsVersions(root), none: packageVersion(root, 'no-such-package')}));"
    )
    proc = subprocess.run(
        [shutil.which("node") or "node", "--input-type=module", "-e", code, str(NODE_DIR)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    got = json.loads(proc.stdout)
    pinned = json.loads((NODE_DIR / "package.json").read_text(encoding="utf-8"))["dependencies"]
    ort = json.loads((NODE_DIR / "node_modules/onnxruntime-node/package.json").read_text(encoding="utf-8"))
    node_version = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True).stdout.strip()
    assert got["tjs"] == {
        "@huggingface/transformers": pinned["@huggingface/transformers"],
        "onnxruntime-node": ort["version"],
        "node": node_version,
    }
    assert got["none"] is None
