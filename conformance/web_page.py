"""The export's web page (``index.html``: transformers.js on onnxruntime-web's WASM build) in headless Chromium, timed
as a row of the card's speed table (:class:`PageWasmTimer`), through the one Chromium driver
(:mod:`prodip.conformance.runtimes.browser_page`).

The page times itself (``export/web/app.js``: ``performance.now()`` from the generate call to the first new token,
and the decode rate after it); the timer opens it once and, per dtype, picks it in the page's menu and presses
Generate: once to load the model and warm up (not counted), then once per timed round, the model staying loaded.

Needs ``node``, ``puppeteer-core`` in the Node folder (``npm install --ignore-scripts --prefix node``) and Chromium
(Debian's ``chromium`` package; puppeteer downloads none).

    python -c "from prodip.conformance.web_page import PageWasmTimer; print(PageWasmTimer().available())"
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

from prodip.base.variants import BY_NAME
from prodip.conformance.runtimes.browser_page import WASM_FLAGS, browser_missing, chromium_path, open_pages, serve_dir
from prodip.conformance.runtimes.common import error_text, node_root
from prodip.conformance.runtimes.timing import SpeedJob, Timing

#: Timeout of one Chromium run (s) and of one page action (ms).
CHROMIUM_TIMEOUT_S = 1800
PAGE_TIMEOUT_MS = 600_000
#: The speed table's name of the page on the WASM device.
PAGE_WASM = "web page (WASM)"
#: The page's actions: wait until it is ready, pick a dtype in its menu, press Generate.
_READY = ["wait_text", "#go", "Generate"]


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
    chromium_args: tuple[str, ...] = WASM_FLAGS

    def available(self) -> Optional[str]:
        return browser_missing()

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
        order = sorted(set(dtypes.values()))
        # per dtype: one press to load the model and warm up (not counted), then the timed rounds
        steps = [[_READY, ["select", "#dtype", d], ["click", "#go"]] for d in order for _ in range(1 + job.rounds)]
        with serve_dir(export) as base:
            url = f"{base}/index.html?{query}"
            page = {"url": url, "result": "prodipResult", "timeout_ms": PAGE_TIMEOUT_MS, "steps": steps}
            answer = open_pages([page], self.chromium_args, root, timeout_s=CHROMIUM_TIMEOUT_S)[0]
        if answer.get("error"):
            raise RuntimeError(f"the page {url}: {answer['error']} (console: {answer.get('console', [])[-3:]})")
        by_dtype: dict[str, list[dict[str, Any]]] = {d: [] for d in order}
        for d, step in zip([d for d in order for _ in range(1 + job.rounds)], answer["steps"]):
            by_dtype[d].append(step)
        return {name: self._timing(by_dtype[d][1:], d, job, version) for name, d in dtypes.items()}

    def _timing(self, steps: list[dict[str, Any]], dtype: str, job: SpeedJob, version: str) -> Timing:
        """One dtype's timed rounds (the driver's step answers after the warm-up) as a :class:`Timing`; the first
        failed round (or a round that ran another dtype, or another length) becomes its ``error``."""
        timing = Timing(threads=job.threads, version=version)
        try:
            for step in steps:
                res = step.get("result") or {}
                if step.get("error"):
                    raise ValueError(step["error"])
                if res.get("dtype") != dtype:
                    raise ValueError(f"the page ran dtype {res.get('dtype')!r}")
                if res.get("new_tokens") != job.new_tokens:
                    raise ValueError(f"generated {res.get('new_tokens')} new tokens, asked for {job.new_tokens}")
                timing.add_figures(res["ttft_ms"] / 1e3, res["tokens_per_s"], res["new_tokens"])
        except (KeyError, TypeError, ValueError) as err:
            return Timing(threads=job.threads, version=version, error=f"page dtype {dtype}: {error_text(err)}")
        timing.threads = int((steps[0].get("result") or {}).get("threads") or job.threads)
        return timing
