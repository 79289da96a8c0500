"""The export's own page (``index.html``) in headless Chromium: transformers.js on onnxruntime-web's WebGPU
execution provider (``transformers.js-webgpu``) and on its WASM build (``transformers.js-browser``), greedy ids of
every ONNX variant, as a user who opens the page runs it, and the page's own timing of generation (the card's speed
table times the rows marked ``timed``: the WASM one).

The export folder is served on 127.0.0.1 and each (variant, prompt) is one page load,
``index.html?device=<webgpu|wasm>&dtype=<the variant's transformers.js dtype>&prompt_ids=...&autorun=1``, driven by
the one Chromium driver (:mod:`.browser_page`); the page generates greedily until the export's end-of-sequence
id or ``max_new_tokens``. WebGPU runs with ``--enable-unsafe-webgpu``: on a machine without a GPU Chromium offers
Dawn's SwiftShader adapter (Vulkan on the CPU), so CI runs the WebGPU kernels.

The reference is ONNX Runtime on the variant's file; for a file whose ``MatMulNBits`` nodes quantise
activations, ONNX Runtime computing in float32 (:func:`.ortweb.fp32_compute_copy`), as the browser's WASM and
WebGPU kernels do. The ids are judged by the row's rule for the variant (``greedy_margins``: identical, or
parted only at a near tie). A dtype transformers.js refuses on the device (fp16 on an adapter without the
``shader-f16`` feature, as SwiftShader) is skipped with that reason, not failed.

Timing (:meth:`PageAdapter.time_generation`): the page times itself (``export/web/app.js``: ``performance.now()``
from the generate call to the first new token, and the decode rate after it). One tab opens the page; per dtype it
picks the dtype in the page's menu and presses Generate: once to load the model and warm up (not counted), then
once per timed round, the model staying loaded. The prompt goes in as text (the page tokenises it with the
export's tokenizer).

    python -c "from prodip.conformance.runtimes.webgpu import WebGpuAdapter; print(WebGpuAdapter().available())"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote, urlencode

from prodip.base.variants import BY_NAME
from prodip.conformance.runtimes.browser_page import (
    WASM_FLAGS,
    WEBGPU_FLAGS,
    browser_missing,
    chromium_version,
    node_package_version,
    open_pages,
    serve_dir,
)
from prodip.conformance.runtimes.common import GreedyJob, GreedyOutput, RuntimeAdapter, error_text, truncate_at_eos
from prodip.conformance.runtimes.ortweb import set_fp32_compute_reference, wasm_file
from prodip.conformance.runtimes.timing import SpeedJob, Timing

#: How long one page may take to load its variant and decode one prompt (ms).
PAGE_TIMEOUT_MS = 300_000
#: Timing: how long the one tab may take for every dtype's warm-up and rounds (ms), and the whole Chromium run (s).
TIMING_PAGE_TIMEOUT_MS = 600_000
TIMING_CHROMIUM_TIMEOUT_S = 1800
#: transformers.js's words when the WebGPU adapter lacks shader-f16 ("The device (webgpu) does not support fp16.").
_NO_FP16 = "does not support fp16"
#: The page's actions before a run: wait until it is ready (its Generate button says so).
_READY = ["wait_text", "#go", "Generate"]


class PageAdapter(RuntimeAdapter):
    """The export's page on one transformers.js ``device`` (``"webgpu"`` or ``"wasm"``) in headless Chromium."""

    def __init__(self, name: str, device: str, flags: tuple[str, ...]) -> None:
        self.name, self.device, self.flags = name, device, flags

    def available(self) -> Optional[str]:
        return super().available() or browser_missing()

    def urls(self, base: str, dtype: str, job: GreedyJob) -> list[str]:
        """The page's URL for each of the job's prompts on ``dtype``."""
        return [
            f"{base}/index.html?"
            + urlencode(
                {
                    "device": self.device,
                    "dtype": dtype,
                    "prompt_ids": ",".join(map(str, prompt)),
                    "max_new_tokens": job.max_new_tokens,
                    "autorun": 1,
                }
            )
            for prompt in job.prompts
        ]

    def greedy(self, job: GreedyJob) -> dict[str, GreedyOutput]:
        dtypes = {c.name: BY_NAME[c.variant].transformersjs_dtype for c in job.candidates}
        out = {
            c.name: GreedyOutput(error=f"variant {c.variant} has no transformers.js dtype")
            for c in job.candidates
            if dtypes[c.name] is None
        }
        cands = [c for c in job.candidates if dtypes[c.name] is not None]
        with serve_dir(Path(job.export_dir)) as base:
            pages = [
                {"url": url, "result": "prodipResult", "timeout_ms": PAGE_TIMEOUT_MS}
                for c in cands
                for url in self.urls(base, str(dtypes[c.name]), job)
            ]
            answers = iter(open_pages(pages, self.flags))
        versions: dict[str, Any] = {"chromium": chromium_version(), "device": self.device}
        for cand in cands:
            dtype = dtypes[cand.name]
            got = [next(answers) for _ in job.prompts]
            errors = [g["error"] for g in got if g["error"]]
            adapter = next((g["result"].get("adapter") for g in got if (g["result"] or {}).get("adapter")), None)
            if adapter:
                versions["adapter"] = f"{adapter.get('vendor')} {adapter.get('architecture')}"
            if errors and _NO_FP16 in errors[0]:
                # transformers.js refuses fp16 on WebGPU before it loads the file when the adapter lacks the
                # shader-f16 feature (SwiftShader has none): the runtime cannot run the variant here, not a fault
                why = f"transformers.js on {self.device}: {errors[0]} (the WebGPU adapter lacks shader-f16)"
                out[cand.name] = GreedyOutput(skipped=why, dtype=dtype)
                continue
            if errors:
                res = GreedyOutput(error=f"{self.name} dtype {dtype}: {errors[0]}", dtype=dtype, versions=versions)
            else:
                ids = [truncate_at_eos(g["result"]["ids"], len(p), job.eos) for g, p in zip(got, job.prompts)]
                res = GreedyOutput(ids=ids, dtype=dtype, versions=dict(versions))
            # the file the page ran: q4 on WASM folded to 8-bit at load is the int4 variant's WASM graph
            # (prodipResult.q4_path "int8-folded"), every other dtype and path the variant's own file
            file = cand.path
            wasm = wasm_file(Path(job.export_dir), cand.path)
            if wasm is not None and any((g["result"] or {}).get("q4_path") == "int8-folded" for g in got):
                file = wasm[0]
            set_fp32_compute_reference(res, file, cand, job)
            out[cand.name] = res
        return out

    def time_generation(self, job: SpeedJob) -> dict[str, Timing]:
        """Every ONNX candidate by its transformers.js dtype, all in one tab (the page's dtype menu), ``job.threads``
        WASM threads (0: the page's default), the prompt as text; the figures are the page's own.

        Raises:
            FileNotFoundError: the export has no ``index.html`` (made before prodip wrote the page).
            RuntimeError: Chromium or its driver failed as a whole.
        """
        export = Path(job.export_dir)
        if not (export / "index.html").is_file():
            raise FileNotFoundError(f"{export}/index.html: the export has no web page (re-export)")
        dtypes = {c.name: BY_NAME[c.variant].transformersjs_dtype for c in job.candidates}
        order = sorted(set(dtypes.values()))
        version = (
            f"{chromium_version() or 'Chromium ?'}; transformers.js "
            f"{node_package_version('@huggingface/transformers') or '?'}, "
            f"onnxruntime-web {node_package_version('onnxruntime-web') or '?'}"
        )
        threads = f"&threads={job.threads}" if job.threads else ""
        query = (
            f"device={self.device}&prompt={quote(job.prompt_text)}&max_new_tokens={job.new_tokens}"
            f"&min_new_tokens={job.new_tokens}{threads}"
        )
        # per dtype: one press to load the model and warm up (not counted), then the timed rounds
        runs = [d for d in order for _ in range(1 + job.rounds)]
        steps = [[_READY, ["select", "#dtype", d], ["click", "#go"]] for d in runs]
        with serve_dir(export) as base:
            url = f"{base}/index.html?{query}"
            page = {"url": url, "result": "prodipResult", "timeout_ms": TIMING_PAGE_TIMEOUT_MS, "steps": steps}
            answer = open_pages([page], self.flags, timeout_s=TIMING_CHROMIUM_TIMEOUT_S)[0]
        if answer.get("error"):
            raise RuntimeError(f"the page {url}: {answer['error']} (console: {answer.get('console', [])[-3:]})")
        by_dtype: dict[str, list[dict[str, Any]]] = {d: [] for d in order}
        for d, step in zip(runs, answer["steps"]):
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


class WebGpuAdapter(PageAdapter):
    """The page on transformers.js's WebGPU device (``--enable-unsafe-webgpu``; SwiftShader without a GPU)."""

    def __init__(self) -> None:
        super().__init__("transformers.js-webgpu", "webgpu", WEBGPU_FLAGS)


class BrowserWasmAdapter(PageAdapter):
    """The page on transformers.js's WASM device (onnxruntime-web's plain WASM build, as the page loads it)."""

    def __init__(self) -> None:
        super().__init__("transformers.js-browser", "wasm", WASM_FLAGS)
