"""The card's "How to use": generated from the manifest (each runtime's files, the chat format and end of
turn), one snippet per runtime that runs as written against a tiny chat export (a runtime that is not
installed is skipped, named), the same snippets in docs/devices.md, and conformance checks the section.

python -m pytest tests/export/test_usage.py -q
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prodip.export.usage import USER, snippets

REPO = Path(__file__).resolve().parents[2]
NODE_MODULES = REPO / "node" / "node_modules"
#: what each snippet needs, and how to tell it is there
NEEDS = {
    "transformers": lambda: importlib.util.find_spec("transformers") is not None,
    "transformers.js": lambda: shutil.which("node") is not None and (NODE_MODULES / "@huggingface").is_dir(),
    "onnxruntime-genai": lambda: importlib.util.find_spec("onnxruntime_genai") is not None,
    "llama.cpp": lambda: shutil.which("node") is not None and (NODE_MODULES / "node-llama-cpp").is_dir(),
    "executorch": lambda: importlib.util.find_spec("executorch") is not None,
    "prodip serve": lambda: importlib.util.find_spec("openai") is not None,
}


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory):
    """A tiny chat model exported with every runtime's variant, and transformers' greedy reply to USER."""
    import transformers

    from tests.fixtures import build_tiny_chat_export

    variants = ["fp32", "int4", "gguf-q8_0"] + (["pte-fp32"] if NEEDS["executorch"]() else [])
    export, _ = build_tiny_chat_export(tmp_path_factory.mktemp("usage"), variants=variants)
    tok = transformers.AutoTokenizer.from_pretrained(export)
    model = transformers.AutoModelForCausalLM.from_pretrained(export)
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": USER}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**inputs, max_new_tokens=40, do_sample=False)
    reply = tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    return export, reply


def _variants(export: Path) -> dict:
    from prodip.base.manifest import load_manifest

    return {n: v.model_dump(exclude_none=True) for n, v in load_manifest(export).variants.items()}


def test_card_says_how_to_use_the_export_and_conformance_checks_it(chat_export, tmp_path):
    from huggingface_hub import ModelCard

    from prodip.conformance.card import card_problems

    export, _ = chat_export
    text = ModelCard.load(export / "README.md").text
    section = text[text.index("## How to use") : text.index("## Data statement")]
    assert (
        "| transformers.js (Node, the browser page `index.html`) | `dtype` `fp32` → `onnx/model.onnx`, `q4` → "
        in section
    )
    assert "`onnx/model_q4_genai.onnx` (default)" in section and "`gguf/model-q8_0.gguf`" in section
    assert "This is a chat model." in section and "ends with `<|im_end|>` (id " in section
    for runtime, (lang, code) in snippets(True, "path/to/this/export", _variants(export)).items():
        assert f"```{lang}\n{code.rstrip()}\n```" in section, runtime
    assert 'systemPrompt: ""' in section  # node-llama-cpp's own default system prompt is replaced
    assert card_problems(export) == []
    edited = tmp_path / "edited"
    shutil.copytree(export, edited)
    readme = edited / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8").replace("max_new_tokens=40", "max_new_tokens=4"), "utf-8")
    assert "README.md: the How to use section differs" in " ".join(card_problems(edited))


def test_devices_page_holds_the_cards_chat_snippets():
    """docs/devices.md's "Chat with the model" is the card's snippets for the demo-devices export."""
    page = (REPO / "docs" / "devices.md").read_text(encoding="utf-8")
    section = page[page.index("## Chat with the model") :]
    for runtime, (lang, code) in snippets(True, "runs/demo-devices/export").items():
        assert f"```{lang}\n{code.rstrip()}\n```" in section, runtime


def _run(lang: str, code: str, tmp: Path) -> subprocess.CompletedProcess:
    if lang == "python":
        script = tmp / "snippet.py"
        script.write_text(code, encoding="utf-8")
        cmd = [sys.executable, str(script)]
    else:
        script = tmp / "snippet.mjs"
        script.write_text(code, encoding="utf-8")
        (tmp / "node_modules").symlink_to(NODE_MODULES)  # the repository's node/ install
        cmd = [shutil.which("node") or "node", str(script)]
    return subprocess.run(
        cmd, capture_output=True, text=True, errors="replace", timeout=600, cwd=tmp, env=os.environ.copy(), check=False
    )  # errors: a runner printing each token's bytes may print part of a character


@pytest.mark.slow
@pytest.mark.parametrize("runtime", list(NEEDS))
def test_card_snippet_runs_and_replies_as_transformers(runtime, chat_export, tmp_path):
    """Each snippet of the card, pointed at the tiny chat export, runs and prints a reply; where it reads fp32
    weights and decodes the reply as a whole (transformers, transformers.js switched to its fp32 file here,
    prodip serve's fp32 variant) the reply is the one transformers gives to the same conversation (greedy).
    The quantised files' replies differ on this random model (conformance measures those)."""
    if not NEEDS[runtime]():
        pytest.skip(f"{runtime} is not installed here")
    export, reply = chat_export
    lang, code = snippets(True, str(export), _variants(export))[runtime]
    if runtime == "transformers.js":
        code = code.replace('dtype: "q4"', 'dtype: "fp32"')
    if runtime == "prodip serve":
        from prodip import export as export_stage
        from tests.serve.conftest import make_verdict, serve_export

        export_stage.set_conformance(export, make_verdict(export, {"fp32": True, "int4": True}))
        with serve_export(export, "--variant", "fp32", "--log-level", "warning") as srv:
            proc = _run(lang, code.replace("http://127.0.0.1:8000", srv.base), tmp_path)
    else:
        proc = _run(lang, code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip(), proc.stderr[-2000:]
    # int4 / q8_0 files; ExecuTorch's runner prints each token's own bytes as it comes (this random model's
    # reply holds partial UTF-8 characters), not one decode: their ids are conformance's to compare
    if runtime not in ("onnxruntime-genai", "llama.cpp", "executorch"):
        assert reply.strip() and reply.strip() in proc.stdout, (reply, proc.stdout[-500:])


@pytest.fixture(scope="module")
def base_export(tmp_path_factory):
    """A tiny base model (no chat template) exported with every runtime's variant, and transformers' greedy
    continuation of TEXT."""
    import transformers

    from prodip.export.usage import TEXT
    from tests.fixtures import build_tiny_export

    variants = ["fp32", "int4", "gguf-q8_0"] + (["pte-fp32"] if NEEDS["executorch"]() else [])
    export = build_tiny_export(tmp_path_factory.mktemp("usage-base"), vocab_size=300, variants=variants)
    tok = transformers.AutoTokenizer.from_pretrained(export)
    model = transformers.AutoModelForCausalLM.from_pretrained(export)
    out = model.generate(**tok(TEXT, return_tensors="pt"), max_new_tokens=40, do_sample=False)
    return export, tok.decode(out[0], skip_special_tokens=True)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", list(NEEDS))
def test_base_model_card_snippet_runs(runtime, base_export, tmp_path):
    """A base model's card continues a text in each runtime; the fp32 ones print transformers' continuation."""
    if not NEEDS[runtime]():
        pytest.skip(f"{runtime} is not installed here")
    export, text = base_export
    assert "This is a base language model" in (export / "README.md").read_text(encoding="utf-8")
    lang, code = snippets(False, str(export), _variants(export))[runtime]
    if runtime == "transformers.js":
        code = code.replace('dtype: "q4"', 'dtype: "fp32"')
    if runtime == "prodip serve":
        from prodip import export as export_stage
        from tests.serve.conftest import make_verdict, serve_export

        export_stage.set_conformance(export, make_verdict(export, {"fp32": True, "int4": True}))
        with serve_export(export, "--variant", "fp32", "--log-level", "warning") as srv:
            proc = _run(lang, code.replace("http://127.0.0.1:8000", srv.base), tmp_path)
        text = text[len("বাংলাদেশের রাজধানী") :]  # the completions API returns the continuation only
    else:
        proc = _run(lang, code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip(), proc.stderr[-2000:]
    if runtime in ("transformers", "transformers.js", "prodip serve"):
        assert text.strip() and text.strip() in proc.stdout, (text, proc.stdout[-500:])
