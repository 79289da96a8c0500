"""docs/devices.md "ONNX runtimes": each snippet runs as written against a tiny export in place of runs/demo/export.

The snippets are cut from docs/devices.md (the ```python / ```js blocks of that section), the export path
rewritten, and run in their real runtime: onnxruntime-genai (Python), transformers.js (Node, the
repository's node_modules) and plain ONNX Runtime. Each must print text and exit 0.

    python -m pytest tests/test_readme_device.py -q
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEVICES = ROOT / "docs" / "devices.md"
SECTION = "## ONNX runtimes"


def _docs_text() -> str:
    """README.md and every page of docs/, joined: the text a reader follows."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n".join(p.read_text(encoding="utf-8") for p in pages)


def snippets() -> list[tuple[str, str]]:
    """(language, code) of every python/js fenced block in the ONNX section of docs/devices.md."""
    text = DEVICES.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return re.findall(r"```(python|js)\n(.*?)```", text[start:end], flags=re.S)


def _config_exports() -> dict[str, set[str]]:
    """``runs/NAME`` -> the files its pipeline config's export writes (configs/*.toml ``out_dir``)."""
    import tomllib

    from prodip.base.variants import BY_NAME

    out = {}
    for path in sorted((ROOT / "configs").glob("*.toml")):
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
        variants = doc.get("export", {}).get("variants", [])
        files = {BY_NAME[v].path for v in variants} | {"tokenizer.json", "config.json", "manifest.json"}
        if any(v.startswith("pte-") for v in variants):
            files.add("executorch/tokenizer.json")  # the runtime tokenizer beside the programs
        out[doc.get("out_dir", "runs/demo")] = files
    return out


def test_every_export_file_the_docs_name_is_written_by_the_config_they_name():
    """A snippet or command naming ``runs/NAME/export/FILE`` needs a config whose run writes that file: after
    `make demo` the device snippets named runs/demo/export/gguf/... and .pte files the demo never writes."""
    text = _docs_text()
    exports = _config_exports()
    named = re.findall(r"(runs/[\w.-]+)/export/([\w./-]+\.(?:gguf|pte|onnx|json|safetensors))", text)
    assert len(named) >= 5, named
    for run, rel in named:
        assert run in exports, f"the docs name {run}/export/{rel}: no configs/*.toml has out_dir = {run!r}"
        assert rel in exports[run], f"the docs name {run}/export/{rel}, which that run's [export] variants do not write"
    devices = DEVICES.read_text(encoding="utf-8")
    section = devices[devices.index("## llama.cpp (GGUF) and ExecuTorch") :]
    assert "CONFIG=configs/demo-devices.toml make demo" in section.split("```")[0]  # the command before the snippets


@pytest.mark.slow
def test_executorch_import_is_quiet_on_a_cpu_install():
    """torchao, imported by ExecuTorch, logged "Failed to load ..._C_mxfp8...so" per missing CUDA kernel."""
    pytest.importorskip("executorch")
    code = (
        "from prodip.conformance.device_runners import pte_metadata\n"
        "try:\n    pte_metadata('/nonexistent/model.pte')\nexcept Exception:\n    pass\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert "Failed to load" not in proc.stderr and "_pytree" not in proc.stderr, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def export_parent(tmp_path_factory) -> Path:
    """A folder holding ``export/`` (fp32 + int4 of a tiny model), as runs/demo/ holds runs/demo/export.

    The model's vocabulary is the tokenizer's (300), as in a trained export: every generated id decodes."""
    from tests.fixtures import build_tiny_export

    tmp = tmp_path_factory.mktemp("device")
    export = build_tiny_export(tmp, vocab_size=300, variants=["fp32", "int4"])
    assert export == tmp / "export"
    return tmp


@pytest.mark.slow
def test_devices_page_has_the_three_snippets():
    langs = [lang for lang, _ in snippets()]
    assert langs == ["python", "js", "python"], langs
    codes = [code for _, code in snippets()]
    assert "onnxruntime_genai" in codes[0] and "transformers" in codes[1] and "InferenceSession" in codes[2]


def _run(lang: str, code: str, parent: Path, tmp: Path) -> subprocess.CompletedProcess:
    code = code.replace("runs/demo/export", str(parent / "export")).replace('"runs/demo/"', f'"{parent}/"')
    if lang == "python":
        script = tmp / "snippet.py"
        script.write_text(code, encoding="utf-8")
        cmd = [sys.executable, str(script)]
    else:
        node = shutil.which("node")
        assert node, "node is not on PATH (docs/install.md requires Node.js >= 20)"
        script = tmp / "snippet.mjs"
        script.write_text(code, encoding="utf-8")
        (tmp / "node_modules").symlink_to(ROOT / "node" / "node_modules")  # the repository's node/ install
        cmd = [node, str(script)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp, env=os.environ.copy(), check=False)


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1, 2], ids=["onnxruntime-genai", "transformers.js", "onnxruntime"])
def test_snippet_runs(index, export_parent, tmp_path):
    lang, code = snippets()[index]
    proc = _run(lang, code, export_parent, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip(), "the snippet printed nothing"
