"""Pages in headless Chromium: the one driver (``browser_pages.mjs``, beside the conformance package's modules)
that conformance's browser rows, the browser tests and ``bench/browser.py`` open pages with.

Chromium is the system's (Debian's ``chromium`` package), driven by ``puppeteer-core`` from the repository's
``node/`` (``npm install --ignore-scripts --prefix node``): nothing downloads a browser. :func:`serve_dir` serves a
folder (an export: its ``index.html`` loads only from its own origin) on 127.0.0.1.

    python -c "from prodip.conformance.runtimes.browser_page import browser_missing; print(browser_missing())"
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from prodip.conformance.runtimes.common import NODE_TIMEOUT_S, SCRIPTS_DIR, node_root

#: The driver script (in the conformance package).
DRIVER = SCRIPTS_DIR / "browser_pages.mjs"
#: Chromium flags for WebGPU on a machine without a GPU: Dawn's SwiftShader (Vulkan on the CPU) adapter, which
#: Chromium offers when WebGPU is unsafely enabled and no hardware adapter exists.
WEBGPU_FLAGS = ("--enable-unsafe-webgpu",)
#: Chromium flags for the WASM pages (no GPU process work).
WASM_FLAGS = ("--disable-gpu",)


def chromium_path() -> str:
    """The system Chromium's executable: ``chromium`` on PATH, else Debian's ``/usr/bin/chromium``."""
    return shutil.which("chromium") or "/usr/bin/chromium"


def browser_missing(root: Optional[Path] = None) -> Optional[str]:
    """Why pages cannot be opened here (no ``node``, no ``puppeteer-core`` under ``root`` (default
    :func:`node_root`), no Chromium), with the command that installs it; None when all are present."""
    root = root or node_root()
    if shutil.which("node") is None:
        return "node not found on PATH (Node.js >= 20)"
    if not (root / "node_modules" / "puppeteer-core" / "package.json").is_file():
        return f"puppeteer-core not installed in {root} (npm install --ignore-scripts --prefix node)"
    if not Path(chromium_path()).is_file():
        return "chromium not installed (apt-get install -y chromium)"
    return None


def chromium_version() -> Optional[str]:
    """``Chromium 131.0.6778.139 built on Debian ...`` as ``chromium --version`` says it, or None (no Chromium, or it
    did not answer within 60 s)."""
    try:
        out = subprocess.run([chromium_path(), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip() or None


def node_package_version(name: str, root: Optional[Path] = None) -> Optional[str]:
    """The ``version`` of the Node package ``name`` under ``root`` (default :func:`node_root`)'s ``node_modules``,
    or None when it is not installed or its ``package.json`` has none."""
    path = (root or node_root()) / "node_modules" / name / "package.json"
    try:
        version = json.loads(path.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError, AttributeError):  # not installed, not JSON, not an object
        return None
    return version if isinstance(version, str) else None


class IsolatedHandler(http.server.SimpleHTTPRequestHandler):
    """Static files, cross-origin isolated (COOP/COEP: ``SharedArrayBuffer``, so the page may use WASM threads), not
    cached, no request log; URL prefixes in ``routes`` are served from other folders (bench/browser.py: wllama)."""

    routes: Mapping[str, Path] = {}

    def translate_path(self, path: str) -> str:
        for prefix, folder in self.routes.items():
            if path.startswith(prefix):
                return str(folder / path[len(prefix) :].split("?")[0])
        return super().translate_path(path)

    def end_headers(self) -> None:
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, *args: Any) -> None:  # no request log on stderr
        pass


@contextlib.contextmanager
def serve_dir(folder: Path, routes: Optional[Mapping[str, Path]] = None) -> Iterator[str]:
    """Serve ``folder`` (and each ``routes`` URL prefix from its folder) on 127.0.0.1 (a free port, a thread) with
    :class:`IsolatedHandler` while the block runs; yields the base URL (``http://127.0.0.1:<port>``, no trailing
    slash)."""
    handler = type("Handler", (IsolatedHandler,), {"routes": dict(routes or {})})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def open_pages(
    jobs: Sequence[dict[str, Any]],
    args: Sequence[str] = WASM_FLAGS,
    root: Optional[Path] = None,
    timeout_s: float = NODE_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """Open each page of ``jobs`` in turn, in one headless Chromium, and return each page's answer.

    Args:
        jobs: ``{"url", "result": the window property the page sets when done, "timeout_ms", "actions"?
            ([["type"|"click"|"select"|"wait_text", selector, text?]]), "steps"? (lists of actions, each then
            waited for with ``result`` cleared first: one loaded page, several runs), "screenshot"? (a PNG path
            written when the page fails)}``.
        args: extra Chromium flags (:data:`WASM_FLAGS`, :data:`WEBGPU_FLAGS`).
        root: the folder whose ``node_modules`` holds puppeteer-core (default :func:`node_root`).
        timeout_s: for the whole run (s).
    Returns:
        per job, in order: ``{"url", "result": the page's object or None, "error": str or None (the page's
        own ``error`` too), "console": last lines, "requests": every URL the page requested, "steps"?: per step
        ``{"result", "error"}``}`` (the driver's header in ``browser_pages.mjs``).
    Raises:
        FileNotFoundError: node, puppeteer-core or Chromium is missing (:func:`browser_missing`).
        RuntimeError: the driver exited non-zero (its stderr tail in the message).
    """
    root = root or node_root()
    missing = browser_missing(root)
    if missing is not None:
        raise FileNotFoundError(missing)
    request = {"jobs": list(jobs), "node_root": str(root), "chromium": chromium_path(), "args": list(args)}
    proc = subprocess.run(
        [shutil.which("node") or "node", str(DRIVER)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"node {DRIVER.name} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    answers = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if len(answers) != len(jobs):
        raise RuntimeError(f"node {DRIVER.name} answered {len(answers)} of {len(jobs)} pages")
    return answers
