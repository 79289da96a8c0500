"""The adapter of each runtime row (``prodip.base.runtimes.RUNTIMES``) that conformance runs itself: its greedy
ids, chat rendering or timed generation (rows with a ``greedy_metric``, ``chat`` or ``timed``).

Rows without an adapter here are run elsewhere: ``tokenizers`` (the tokenizer parity's reference) and prodip's
PyTorch model (a candidate runner, ``prodip.conformance.runners``); ONNX Runtime's checks are the candidates' own
too, and its adapter here only times it. A new runtime adds its module beside this one and one entry below.

    python -c "from prodip.conformance.runtimes.adapters import ADAPTERS; print(sorted(ADAPTERS))"
"""

from __future__ import annotations

from prodip.conformance.runtimes.common import RuntimeAdapter
from prodip.conformance.runtimes.executorch import ExecuTorchAdapter
from prodip.conformance.runtimes.genai import GenaiAdapter
from prodip.conformance.runtimes.llamacpp import LlamaCppAdapter
from prodip.conformance.runtimes.onnxruntime import OnnxRuntimeAdapter
from prodip.conformance.runtimes.ortweb import OrtWebAdapter
from prodip.conformance.runtimes.serve import ServeAdapter
from prodip.conformance.runtimes.transformers import TransformersAdapter
from prodip.conformance.runtimes.transformersjs import TransformersJsAdapter
from prodip.conformance.runtimes.webgpu import BrowserWasmAdapter, WebGpuAdapter

#: Runtime name -> its adapter.
ADAPTERS: dict[str, RuntimeAdapter] = {
    a.name: a
    for a in (
        TransformersAdapter(),
        ServeAdapter(),
        OnnxRuntimeAdapter(),
        GenaiAdapter(),
        TransformersJsAdapter(),
        OrtWebAdapter(),
        WebGpuAdapter(),
        BrowserWasmAdapter(),
        LlamaCppAdapter(),
        ExecuTorchAdapter(),
    )
}


def adapter_for(name: str) -> RuntimeAdapter:
    """The adapter of the runtime ``name`` (looked up at call time: a test may add one).

    Raises:
        KeyError: a runtime row with no adapter (the table and this registry disagree).
    """
    try:
        return ADAPTERS[name]
    except KeyError:
        raise KeyError(f"runtime {name!r} has no conformance adapter in {__name__}.ADAPTERS") from None
