"""The export's web page (``index.html``: transformers.js on onnxruntime-web's WASM build) in headless Chromium:
served from 127.0.0.1 with cross-origin isolation, opened by puppeteer-core, and timed as a row of the card's speed
table (:class:`PageWasmTimer`). ``bench/browser.py`` serves and opens its pages with the same functions.

The page times itself (``export/web/app.js``: ``performance.now()`` from the generate call to the first new token,
and the decode rate after it); ``page_rounds.mjs`` opens it once, and per dtype picks it in the page's menu and presses
Generate: once to load the model and warm up (not counted), then once per timed round, the model staying loaded.

Needs ``node``, ``puppeteer-core`` in the Node folder (``npm install --ignore-scripts --prefix node``) and Chromium
(Debian's ``chromium`` package; puppeteer downloads none).

    python -c "from prodip.conformance.web_page import PageWasmTimer; print(PageWasmTimer().available())"
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

from prodip.base.variants import BY_NAME
from prodip.conformance.runtimes.common import error_text, node_root
from prodip.conformance.runtimes.timing import SpeedJob, Timing

#: The Node drivers (beside this module): any pages' result objects, and the page's timed rounds.
PAGES_SCRIPT = Path(__file__).with_name("browser_pages.mjs")
ROUNDS_SCRIPT = Path(__file__).with_name("page_rounds.mjs")
#: Timeout of one Chromium run (s) and of one page (ms).
CHROMIUM_TIMEOUT_S = 1800
PAGE_TIMEOUT_MS = 600_000
#: The speed table's name of the page on the WASM device.
PAGE_WASM = "web page (WASM)"


class IsolatedHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with COOP/COEP headers (cross-origin isolated: SharedArrayBuffer, so WASM threads are possible),
    no caching, no request log; URL prefixes in ``routes`` are served from other folders."""

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

    def log_message(self, *args: Any) -> None:
        pass


def serve_folder(
    folder: Path, routes: Optional[Mapping[str, Path]] = None
) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``folder`` (and each ``routes`` prefix from its folder) on 127.0.0.1, a free port, in a daemon thread.

    Returns:
        ``(server, base URL)``; call ``server.shutdown()`` when done.
    """
    handler = type("Handler", (IsolatedHandler,), {"routes": dict(routes or {})})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def chromium_path() -> str:
    """Chromium's executable (``chromium`` on PATH, else Debian's ``/usr/bin/chromium``)."""
    return shutil.which("chromium") or "/usr/bin/chromium"


def missing_browser(root: Optional[Path] = None) -> Optional[str]:
    """Why pages cannot be opened here (no ``node``, no puppeteer-core under the Node folder ``root``, no
    Chromium), with how to install it; None when everything is present."""
    root = root or node_root()
    if shutil.which("node") is None:
        return "node is not on PATH (Node >= 20)"
    if not (root / "node_modules" / "puppeteer-core").is_dir():
        return f"puppeteer-core is not installed under {root} (npm install --ignore-scripts --prefix node)"
    if not Path(chromium_path()).is_file():
        return "Chromium is not installed (apt-get install -y chromium)"
    return None


def run_chromium(
    script: Path, request: dict[str, Any], args: Sequence[str], root: Optional[Path] = None
) -> list[dict[str, Any]]:
    """Run a puppeteer-core driver (``browser_pages.mjs``, ``page_rounds.mjs``) with ``request`` in one Chromium.

    Args:
        script: the driver; request: its job (``{"jobs": [...]}``, ``{"url", "dtypes", ...}``); args: extra
            Chromium flags (``--disable-gpu``); root: the Node folder (default
            :func:`prodip.conformance.runtimes.node_root`).
    Returns:
        The driver's JSON lines, in order.
    Raises:
        RuntimeError: the driver exited non-zero (its stderr tail in the message).
    """
    root = root or node_root()
    request = {**request, "node_root": str(root), "chromium": chromium_path(), "args": list(args)}
    proc = subprocess.run(
        [shutil.which("node") or "node", str(script)],
        input=json.dumps(request), capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"node {script.name} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def open_pages(
    jobs: Sequence[dict[str, Any]], args: Sequence[str], root: Optional[Path] = None
) -> list[dict[str, Any]]:
    """Open each job's page (``{"url", "result": window variable, "timeout_ms"}``) in one Chromium, in order, and
    return each one's ``{"url", "result", "error", "console"}`` (``browser_pages.mjs``)."""
    return run_chromium(PAGES_SCRIPT, {"jobs": list(jobs)}, args, root)


def _package_version(root: Path, name: str) -> str:
    try:
        return json.loads((root / "node_modules" / name / "package.json").read_text(encoding="utf-8"))["version"]
    except (OSError, ValueError, KeyError):
        return "?"


def chromium_version() -> str:
    """``Chromium 131.0.6778.139 built on Debian ...`` as ``chromium --version`` says it, or ``?``."""
    try:
        return subprocess.run([chromium_path(), "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


class PageWasmTimer:
    """The export's page on transformers.js's WASM device in headless Chromium, as a speed-table runtime: the same
    interface as a runtime adapter's timing (``name``, ``timed_formats``, ``available``, ``time_generation``)."""

    name: str = PAGE_WASM
    timed_formats: tuple[str, ...] = ("onnx",)
    #: the page's URL parameter of the device
    device = "wasm"
    #: extra Chromium flags
    chromium_args: tuple[str, ...] = ("--disable-gpu",)

    def available(self) -> Optional[str]:
        return missing_browser()

    def time_generation(self, job: SpeedJob) -> dict[str, Timing]:
        """Every ONNX candidate by its transformers.js dtype, all in one tab (its dtype menu), ``job.threads`` WASM
        threads (0: the page's default), the prompt as text (the page tokenises it with the export's tokenizer).

        Raises:
            FileNotFoundError: the export has no ``index.html`` (made before prodip wrote the page).
            RuntimeError: Chromium or its driver failed as a whole.
        """
        export = Path(job.export_dir)
        if not (export / "index.html").is_file():
            raise FileNotFoundError(f"{export}/index.html: the export has no web page (re-export)")
        dtypes = {c.name: BY_NAME[c.variant].transformersjs_dtype for c in job.candidates}
        root = node_root()
        version = (
            f"{chromium_version()}; transformers.js {_package_version(root, '@huggingface/transformers')}, "
            f"onnxruntime-web {_package_version(root, 'onnxruntime-web')}"
        )
        threads = f"&threads={job.threads}" if job.threads else ""
        query = (
            f"device={self.device}&prompt={quote(job.prompt_text)}&max_new_tokens={job.new_tokens}"
            f"&min_new_tokens={job.new_tokens}{threads}"
        )
        server, base = serve_folder(export)
        try:
            request = {
                "url": f"{base}/index.html?{query}",
                "dtypes": sorted(set(dtypes.values())),
                "rounds": job.rounds,
                "timeout_ms": PAGE_TIMEOUT_MS,
            }
            answer = run_chromium(ROUNDS_SCRIPT, request, self.chromium_args, root)[-1]
        finally:
            server.shutdown()
        if answer.get("error"):
            raise RuntimeError(
                f"the page {request['url']}: {answer['error']} (console: {answer.get('console', [])[-3:]})"
            )
        return {name: self._timing(answer["results"].get(d), d, job, version) for name, d in dtypes.items()}

    def _timing(self, got: Optional[dict[str, Any]], dtype: str, job: SpeedJob, version: str) -> Timing:
        timing = Timing(threads=job.threads, version=version)
        if got is None or got.get("error"):
            timing.error = f"page dtype {dtype}: {(got or {}).get('error', 'no answer')}"
            return timing
        try:
            for res in got["rounds"]:
                if res.get("new_tokens") != job.new_tokens:
                    raise ValueError(f"generated {res.get('new_tokens')} new tokens, asked for {job.new_tokens}")
                timing.add_figures(res["ttft_ms"] / 1e3, res["tokens_per_s"], res["new_tokens"])
        except (KeyError, TypeError, ValueError) as err:
            return Timing(threads=job.threads, version=version, error=f"page dtype {dtype}: {error_text(err)}")
        timing.threads = int(got["rounds"][0].get("threads") or job.threads)
        return timing
