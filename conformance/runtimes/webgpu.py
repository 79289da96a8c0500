"""The export's own page (``index.html``) in headless Chromium: transformers.js on onnxruntime-web's WebGPU
execution provider (``transformers.js-webgpu``) and on its WASM build (``transformers.js-browser``), greedy ids of
every ONNX variant, as a user who opens the page runs it.

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

    python -c "from prodip.conformance.runtimes.webgpu import WebGpuAdapter; print(WebGpuAdapter().available())"
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlencode

from prodip.base.variants import BY_NAME
from prodip.conformance.runtimes.browser_page import (
    WASM_FLAGS,
    WEBGPU_FLAGS,
    browser_missing,
    chromium_path,
    open_pages,
    serve_dir,
)
from prodip.conformance.runtimes.common import GreedyJob, GreedyOutput, RuntimeAdapter, truncate_at_eos
from prodip.conformance.runtimes.ortweb import set_fp32_compute_reference, wasm_file

#: How long one page may take to load its variant and decode one prompt (ms).
PAGE_TIMEOUT_MS = 300_000
#: transformers.js's words when the WebGPU adapter lacks shader-f16 ("The device (webgpu) does not support fp16.").
_NO_FP16 = "does not support fp16"


def _chromium_version() -> Optional[str]:
    try:
        return subprocess.run([chromium_path(), "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


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
        versions: dict[str, Any] = {"chromium": _chromium_version(), "device": self.device}
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


class WebGpuAdapter(PageAdapter):
    """The page on transformers.js's WebGPU device (``--enable-unsafe-webgpu``; SwiftShader without a GPU)."""

    def __init__(self) -> None:
        super().__init__("transformers.js-webgpu", "webgpu", WEBGPU_FLAGS)


class BrowserWasmAdapter(PageAdapter):
    """The page on transformers.js's WASM device (onnxruntime-web's plain WASM build, as the page loads it)."""

    def __init__(self) -> None:
        super().__init__("transformers.js-browser", "wasm", WASM_FLAGS)
