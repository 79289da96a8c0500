"""The export's page in a real browser: Debian's Chromium (headless), driven by puppeteer-core pointed at
the system browser (no browser download), loading the page from a 127.0.0.1 static server on a tiny export.

For the default dtype (config.json ``transformers.js_config.device_config.wasm.dtype``) and every other transformers.js dtype
of the variant table (fp32, fp16, q8, q4), the ids the page generates
(transformers.js + onnxruntime-web's WASM backend) equal ONNX Runtime's greedy ids on the same file (for
MatMulNBits files: with the fp32 arithmetic the WASM kernel does, see
:func:`prodip.conformance.runtimes.fp32_compute_copy`; q4: the WASM q4 file the page loads on the WASM device,
``onnx/model_wasm_q4.onnx``); every request stays on the 127.0.0.1 server (no
CDN, no Hub); the page reports load time, tokens/s and bytes downloaded. A failing page leaves a
screenshot in ``$PRODIP_BROWSER_ARTIFACTS`` (default ``build/browser-artifacts``).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from prodip.base.variants import VARIANTS
from prodip.conformance.runners import OrtRunner
from prodip.conformance.runtimes import fp32_compute_copy, runner_greedy, truncate_at_eos
from tests.tokenizer.conftest import skip_or_fail

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "node" / "browser_page.mjs"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: transformers.js dtype -> its file, from the variant table (a new dtype is picked up here by itself)
FILES = {v.transformersjs_dtype: v.path for v in VARIANTS if v.transformersjs_dtype}
#: the file the page loads for q4 on the WASM device (the int4 variant's manifest ``wasm_path``; it reads the q4
#: file's weights, ``onnx/model_q4.onnx_data``)
WASM_Q4 = "onnx/model_wasm_q4.onnx"
NEW_TOKENS = 12
PROMPT = "আমার সোনার বাংলা"

pytestmark = pytest.mark.slow


def node_root() -> Path:
    env = os.environ.get("PRODIP_NODE_ROOT")
    return Path(env) if env else REPO / "node"


def artifacts_dir() -> Path:
    path = Path(os.environ.get("PRODIP_BROWSER_ARTIFACTS", REPO / "build" / "browser-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def browser_ready():
    if not Path(CHROMIUM).is_file():
        skip_or_fail("chromium is not installed (apt-get install -y chromium)")
    if shutil.which("node") is None or not (node_root() / "node_modules" / "puppeteer-core").is_dir():
        skip_or_fail(
            f"puppeteer-core is not installed under {node_root()} (npm install --ignore-scripts --prefix node)"
        )


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # noqa: D401 (keep pytest's output clean)
        pass


@pytest.fixture(scope="module")
def served_export(tmp_path_factory, browser_ready):
    """A tiny export (vocab 512, hidden 64, 2 layers, GQA 4/2) served on 127.0.0.1 by http.server."""
    from tests.fixtures import build_tiny_export

    export = build_tiny_export(tmp_path_factory.mktemp("page"), vocab_size=512, hidden_size=64, seed=5)
    assert (export / "index.html").is_file() and (export / "web" / "ort-wasm-simd-threaded.wasm").is_file()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(export)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield export, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def open_page(url: str, result: str, name: str, actions=(), timeout_ms: int = 180_000) -> dict:
    """The driver's answer for one page; a failed page leaves ``<name>.png`` in :func:`artifacts_dir`."""
    job = {
        "url": url,
        "result": result,
        "chromium": CHROMIUM,
        "timeout_ms": timeout_ms,
        "screenshot": str(artifacts_dir() / f"{name}.png"),
        "node_root": str(node_root()),
        "actions": [list(a) for a in actions],
    }
    proc = subprocess.run(["node", str(DRIVER)], input=json.dumps(job), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ort_greedy(export: Path, rel: str, prompt: list[int], eos: bool = True, step_logits=None) -> list[int]:
    """ONNX Runtime's greedy ids (prompt + :data:`NEW_TOKENS`) on ``rel`` (MatMulNBits files: their
    fp32-compute copy); ``eos=False``: no stop at end-of-sequence; ``step_logits``: gets each step's logits."""
    cfg = json.loads((export / "config.json").read_text(encoding="utf-8"))
    copy = fp32_compute_copy(export / rel)
    path = export / rel
    stop = cfg["eos_token_id"] if eos else None
    with copy if copy is not None else _Same(path) as path:
        runner = OrtRunner(
            path, rel, num_layers=cfg["num_hidden_layers"], num_kv_heads=cfg["num_key_value_heads"],
            head_dim=cfg["head_dim"], threads=1,
        )  # fmt: skip
        ids = runner_greedy(runner, prompt, NEW_TOKENS, stop, step_logits=step_logits)
    return truncate_at_eos(ids, len(prompt), stop) if eos else ids


class _Same:
    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return self.path

    def __exit__(self, *exc):
        return None


def test_page_generates_onnx_runtimes_ids(served_export):
    from tokenizers import Tokenizer

    export, base = served_export
    tjs = json.loads((export / "config.json").read_text(encoding="utf-8"))["transformers.js_config"]
    default = tjs["device_config"]["wasm"]["dtype"]  # the WASM device's default, which the page picks
    prompt = Tokenizer.from_file(str(export / "tokenizer.json")).encode(PROMPT).ids
    for dtype in dict.fromkeys([default, *FILES]):  # the default first, then every dtype the export offers
        from urllib.parse import quote

        chosen = "" if dtype == default else f"dtype={dtype}&"  # no dtype: the page picks its default
        url = f"{base}/?{chosen}prompt={quote(PROMPT)}&max_new_tokens={NEW_TOKENS}&autorun=1"
        got = open_page(url, "prodipResult", f"page_{dtype}")
        assert got["error"] is None, (dtype, got["error"], got["console"][-10:])
        res = got["result"]
        assert res["dtype"] == dtype and res["ids"][: len(prompt)] == prompt  # transformers.js's tokenizer
        page_file = WASM_Q4 if dtype == "q4" else FILES[dtype]
        assert res["ids"] == ort_greedy(export, page_file, prompt), dtype
        assert res["load_ms"] > 0 and res["tokens_per_s"] > 0
        # every byte from the 127.0.0.1 server: the library, the WASM build, the model files (transformers.js
        # imports the WASM build's script as a blob: URL of that origin, made from the bytes it fetched)
        local = (base + "/", f"blob:{base}/")
        assert all(u.startswith(local) for u in got["requests"]), [
            u for u in got["requests"] if not u.startswith(local)
        ]
        assert any(u.endswith("/" + page_file) for u in got["requests"])
        # the plain WASM build on the WASM device (the asyncify one is for WebGPU)
        assert any(u.endswith("/web/ort-wasm-simd-threaded.wasm") for u in got["requests"])
        assert not any("asyncify" in u for u in got["requests"])
        weights = (export / (FILES[dtype] + "_data")).stat().st_size
        assert res["bytes"] >= weights  # the page counts what it downloaded
        # q4 on WASM: the WASM q4 file, its int4 weights requantised to 8-bit at load
        assert res["q4_path"] == ("int8-folded" if dtype == "q4" else None), dtype


def test_page_q4_paths(served_export):
    """The page's q4 on the WASM device, every path: the WASM q4 file, 8-bit weights made at load (the default
    when the export has it), ``?q4=fp32``: the q4 file dequantised to fp32 at load, ``?q4=fused``: onnxruntime-web's
    fused 4-bit kernel; each gives ONNX Runtime's greedy ids on the file it loads (fp32 arithmetic for the q4 file)
    and the stats line names the path it took."""
    from urllib.parse import quote

    from tokenizers import Tokenizer

    export, base = served_export
    prompt = Tokenizer.from_file(str(export / "tokenizer.json")).encode(PROMPT).ids
    for extra, path, words, file in (
        ("", "int8-folded", "requantised to 8-bit at load", WASM_Q4),
        ("&q4=fp32", "fp32-folded", "dequantised to fp32 at load", FILES["q4"]),
        ("&q4=fused", "fused", "slow", FILES["q4"]),
    ):
        url = f"{base}/?dtype=q4{extra}&prompt={quote(PROMPT)}&max_new_tokens={NEW_TOKENS}&autorun=1"
        got = open_page(url, "prodipResult", f"page_q4_{path}")
        assert got["error"] is None, (path, got["error"], got["console"][-10:])
        res = got["result"]
        assert res["q4_path"] == path and res["ids"] == ort_greedy(export, file, prompt), path
        assert words in res["stats"], res["stats"]
        assert any(u.endswith("/" + file) for u in got["requests"]), path


def test_serve_playground_streams_a_completion(tmp_path_factory, browser_ready):
    """``prodip serve``'s /playground page, in Chromium: for a base model it opens in completion mode by itself;
    one streamed completion from /v1/completions at the page's temperature 0, whose text equals the same
    request's non-streamed text (greedy), in more than one chunk."""
    from urllib.parse import quote

    import httpx

    from tests.serve.conftest import build_export, serve_export

    export, _ = build_export(tmp_path_factory.mktemp("playground"), variants=("fp32",))
    with serve_export(export, "--log-level", "warning") as srv:
        base = srv.base
        model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
        want = httpx.post(f"{base}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
        got = open_page(
            f"{base}/playground?prompt={quote(PROMPT)}&max_tokens=8&temperature=0&autorun=1",
            "playgroundResult",
            "playground",
        )
        assert got["error"] is None, (got["error"], got["console"][-10:])
        res = got["result"]
        assert res["mode"] == "completion" and res["text"] == want and res["chunks"] > 1
        assert all(u.startswith(base + "/") for u in got["requests"])


def test_serve_playground_chats_with_a_chat_model(tmp_path_factory, browser_ready):
    """For a chat model the playground opens in chat mode by itself (no mode parameter), sends the temperature,
    top-p and max tokens of its controls, and its streamed reply equals the non-streamed chat reply; the
    server's root address leads to it."""
    from urllib.parse import quote

    import httpx

    from prodip import export as export_stage
    from tests.fixtures import CHAT_PROMPT, build_tiny_chat_export
    from tests.serve.conftest import make_verdict, serve_export

    export, _ = build_tiny_chat_export(tmp_path_factory.mktemp("playground-chat"), variants=["fp32"])
    export_stage.set_conformance(export, make_verdict(export, {"fp32": True}))
    user = CHAT_PROMPT[-1]["content"]
    with serve_export(export, "--log-level", "warning") as srv:
        base = srv.base
        root = httpx.get(f"{base}/", follow_redirects=False)
        assert root.status_code == 307 and root.headers["location"] == "/playground"
        model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": user}], "max_tokens": 6, "temperature": 0}
        want = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]
        got = open_page(
            f"{base}/?prompt={quote(user)}&max_tokens=6&temperature=0&top_p=0.5&autorun=1", "playgroundResult", "chat"
        )
        assert got["error"] is None, (got["error"], got["console"][-10:])
        res = got["result"]
        assert res["mode"] == "chat" and res["text"] == want["content"]
        sent = res["body"]
        assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (0, 0.5, 6)
        assert sent["messages"] == [{"role": "user", "content": user}]
        assert all(u.startswith(base + "/") for u in got["requests"])


def test_page_opened_as_a_file_says_to_serve_the_folder(served_export):
    """Double-clicked (file://), the page cannot load its module or the model: instead of a grey
    "loading…" button it says so in plain words, with the one-line command that serves this folder."""
    export, _ = served_export
    got = open_page((export / "index.html").resolve().as_uri(), "prodipResult", "page_file")
    res = got["result"]
    assert res["error"] == "opened from file://"
    assert res["command"] == f'python3 -m http.server -d "{export.resolve()}" 8000'
    assert res["command"] in res["message"] and "http://127.0.0.1:8000/" in res["message"]
    # the command works as written (its port changed to a free one): the folder answers with the page
    import shlex
    import socket
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = shlex.split(res["command"])
    argv[-1] = str(port)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/index.html", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert page.content == (export / "index.html").read_bytes()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


#: q4 on WebGPU against ONNX Runtime's fp32-compute q4: the ids may part only where ONNX Runtime's top pick led the
#: page's pick by at most this many logits (a near tie: the two sum the 4-bit products in different orders)
Q4_MARGIN = 0.02


def test_webgpu_page_matches_onnx_runtime(served_export):
    """The page on transformers.js's WebGPU device, in headless Chromium with ``--enable-unsafe-webgpu``
    (SwiftShader's Vulkan-on-CPU adapter on a machine without a GPU): fp32 and q8 give exactly ONNX
    Runtime's greedy ids on the same file; q4 gives them up to a near tie (:data:`Q4_MARGIN`)."""
    from tokenizers import Tokenizer

    from prodip.conformance.browser import margin_agrees, webgpu_greedy

    export, _ = served_export
    prompt = Tokenizer.from_file(str(export / "tokenizer.json")).encode(PROMPT).ids
    got = webgpu_greedy(export, ["fp32", "q8", "q4"], PROMPT, NEW_TOKENS)
    for dtype, res in got.items():
        assert res["error"] is None, (dtype, res)
        assert res["device"] == "webgpu" and res["adapter"]["vendor"], res  # a WebGPU adapter ran it
        assert res["ids"][: len(prompt)] == prompt and len(res["ids"]) == len(prompt) + NEW_TOKENS
        steps: list = []
        want = ort_greedy(export, FILES[dtype], prompt, eos=False, step_logits=steps)
        if dtype == "q4":
            ok, why = margin_agrees(want, res["ids"], steps, len(prompt), Q4_MARGIN)
            assert ok, why
        else:
            assert res["ids"] == want, dtype
