"""The runtime axis of conformance: each ONNX variant run by the on-device runtimes that load an export.

The runtimes are the rows of ``prodip.base.runtimes.RUNTIMES``; each has an adapter here (one module per
runtime, registered in :mod:`.adapters`) that says whether it is installed (``available()``), decodes greedily
(``greedy()``) and renders the chat template (``chat()``), returning typed results (:mod:`.common`).
:func:`check_runtimes` (:mod:`.check`) is one loop over the runtimes ``--runtimes`` chose.

For every ONNX variant, onnxruntime-genai (its Python API, through the export's
``genai_config.json``), transformers.js (``@huggingface/transformers`` in Node, the dtype whose
file name is the variant's) and onnxruntime-web's WASM backend (the build transformers.js loads in a
browser, run under Node from the npm package: ``ortweb_greedy.mjs``) generate greedily from the fixed Bangla and
English prompts; their ids must equal ONNX Runtime's on the same file (onnxruntime-genai runs each variant's
shared-buffer graph ``onnx/<file>_genai.onnx``, as its manifest ``genai_overlay`` says, against ONNX
Runtime on the variant's own file, same weights) (:class:`prodip.conformance.runners.OrtRunner`,
batch 1, unpadded, the same stopping rule: ``max_new_tokens`` new tokens or the end-of-sequence id,
included). onnxruntime-web's logits at every greedy step must also be within the variant's
tolerance of ONNX Runtime's (``max_abs_logit`` where its table bounds it, else ``kl_mean``); a file
the WASM build cannot load fails with ONNX Runtime's error, which names the operator. For the fp32 variant ONNX
Runtime's ids must also equal the training model's. Each runtime is a gated check of the variant's candidate:
a runtime that fails, or cannot run (not installed, load error), fails that variant's verdict.

The export's own page in headless Chromium is two more rows (:mod:`.webgpu`): transformers.js on the WASM
device and on WebGPU (SwiftShader without a GPU); a row's ``greedy_margins`` judge the variants it names by the
near-tie rule of :mod:`.agreement` instead of identity.

Installing the runtimes: ``pip install 'prodip[runtimes]'`` (onnxruntime-genai) and, in the
repository's ``node/`` folder, ``npm install --ignore-scripts --prefix node`` (transformers.js and onnxruntime-node's bundled CPU
binaries; the post-install script would download CUDA binaries).

    python -m prodip.conformance runs/demo/export --shards-dir runs/demo/shards --runtimes onnxruntime-genai,transformers.js
"""

from __future__ import annotations

from prodip.base.runtimes import greedy_metrics, on_device
from prodip.conformance.runtimes.adapters import ADAPTERS, adapter_for
from prodip.conformance.runtimes.check import (
    REFERENCE_METRIC,
    CandidateRuntimes,
    RuntimeResult,
    check_runtimes,
    logits_agreement,
    planned_metrics,
)
from prodip.conformance.runtimes.common import (
    ChatJob,
    ChatOutput,
    GreedyJob,
    GreedyOutput,
    RuntimeAdapter,
    node_root,
    runner_greedy,
    stop_ids,
    truncate_at_eos,
)
from prodip.conformance.runtimes.genai import genai_greedy
from prodip.conformance.runtimes.ortweb import fp32_compute_copy, ortweb_greedy
from prodip.conformance.runtimes.transformersjs import transformersjs_greedy

GENAI, TRANSFORMERS_JS, ORT_WEB = "onnxruntime-genai", "transformers.js", "onnxruntime-web"
#: The on-device runtimes (``--runtimes`` chooses among them), as the table has them at import.
RUNTIMES = on_device()
#: Prompts (keys of ``prodip.conformance.inputs.PROMPTS``) every runtime decodes.
RUNTIME_PROMPTS = ("bn", "en")
#: Metric name of each on-device runtime's greedy check in a candidate's checks (``{equals: true}``, gated).
RUNTIME_METRICS = greedy_metrics()
#: onnxruntime-web's logits vs ONNX Runtime's on the same file, bounded by the variant's own tolerance table.
ORT_WEB_LOGITS_METRIC = "ortweb_wasm_logits"

__all__ = [
    "ADAPTERS",
    "GENAI",
    "ORT_WEB",
    "ORT_WEB_LOGITS_METRIC",
    "REFERENCE_METRIC",
    "RUNTIMES",
    "RUNTIME_METRICS",
    "RUNTIME_PROMPTS",
    "TRANSFORMERS_JS",
    "CandidateRuntimes",
    "ChatJob",
    "ChatOutput",
    "GreedyJob",
    "GreedyOutput",
    "RuntimeAdapter",
    "RuntimeResult",
    "adapter_for",
    "check_runtimes",
    "fp32_compute_copy",
    "genai_greedy",
    "logits_agreement",
    "node_root",
    "ortweb_greedy",
    "planned_metrics",
    "runner_greedy",
    "stop_ids",
    "transformersjs_greedy",
    "truncate_at_eos",
]
