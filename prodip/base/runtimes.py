"""The runtimes: one table read by conformance, the tokenizer parity check and the model card.

A runtime is a program that loads an export (or its tokenizer) the way an app on a device would: ONNX
Runtime and onnxruntime-genai (Python), transformers.js and onnxruntime-web (Node), llama.cpp (node-llama-cpp),
ExecuTorch, and the references it is compared with (``tokenizers``, transformers, prodip's own PyTorch model).
Each row says which package brings it, which variant formats it runs, and which checks it takes part in:

- ``greedy_metric``: conformance decodes every ONNX variant greedily in it and gates that its ids equal ONNX
  Runtime's on the same file (``--runtimes`` chooses among these rows; :data:`ON_DEVICE`), or, for a variant
  its ``greedy_margins`` name, that they part from them only at a near tie (the rule of
  ``prodip.conformance.runtimes.agreement``);
- ``logits_metric``: its logits at every greedy step are also held to the variant's tolerance;
- ``chat``: it renders the fixed chat conversations with its own template engine (``prodip.conformance.chat``);
- ``tokenizer``: the tokenizer parity check compares its ids with ``tokenizers``' (``prodip.tokenizer.parity``);
- ``candidate_kind``: conformance runs a variant in it as a candidate of that kind (its own checks);
- ``timed``: the card's speed table (``prodip.conformance.speed``) times greedy generation of every variant of its
  ``formats`` in it (its adapter's ``time_generation``): an on-device row when ``--runtimes`` chose it or its
  ``timed_with`` row, any other row whenever it is installed.

Code that loops over runtimes reads this table at call time (:func:`runtime_names`), so a test that adds a row
to :data:`RUNTIMES` sees it everywhere; the work of each runtime is its adapter in
``prodip.conformance.runtimes`` (and, for tokenizer ids, its encoder in ``prodip.tokenizer.parity``).

    python -c "from prodip.base.runtimes import RUNTIMES; print([r.name for r in RUNTIMES])"
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

#: The ``pip install`` hint for the runtimes extra, and the ``npm`` one for the Node runtimes.
PIP_HINT = "pip install 'prodip[runtimes]'"
NPM_HINT = "npm install --ignore-scripts --prefix node"


@dataclass(frozen=True)
class Runtime:
    """One runtime.

    Attributes:
        name: the name in reports, ``--runtimes`` and the parity check (``"onnxruntime-genai"``).
        package: what installs it: a pip distribution, or ``npm:<package>`` for a Node one.
        formats: the variant formats it runs (``"onnx"``, ``"gguf"``, ``"pte"``, ``"safetensors"``); () for
            a tokenizer-only or template-only runtime.
        modules: Python modules it needs importable (checked by :func:`missing_reason`).
        npm: Node packages it needs under the node folder (``node_modules/<name>/package.json``); needs ``node``.
        greedy_metric: the gated metric of its greedy ids on every ONNX variant ("" = no such check).
        greedy_margins: ``(variant, margin)`` pairs: that variant's greedy ids may part from the reference's at
            the first step where the reference's logit of its own pick exceeds its logit of the runtime's pick by
            at most ``margin`` (logits), and anywhere after it; a variant not named must give the same ids.
            For kernels that sum the same products in another order (a GPU's 4-bit or fp16 matmuls).
        logits_metric: the gated metric of its logits vs ONNX Runtime's on the same file ("" = none).
        chat: it renders the chat conversations (or, with ``formats`` empty, states the stop ids) in
            conformance's chat checks.
        tokenizer: the tokenizer parity check runs it.
        candidate_kind: the conformance candidate kind it runs (``"onnx"``, ``"gguf"``, ...; "" = none).
        label: the name the model card gives it (default: ``name``).
        default: run when ``--runtimes`` is not given (rows with a ``greedy_metric``).
        timed: the speed table times it, on the variants of its ``formats`` (:meth:`timing_choosers` says when).
        timed_with: another on-device row whose choice in ``--runtimes`` also times this one ("" = none): the
            page on WASM runs onnxruntime-web's WASM build, so a run that checks that build times the page too.
    """

    name: str
    package: str
    formats: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    npm: tuple[str, ...] = ()
    greedy_metric: str = ""
    greedy_margins: tuple[tuple[str, float], ...] = ()
    logits_metric: str = ""
    chat: bool = False
    tokenizer: bool = False
    candidate_kind: str = ""
    label: str = ""
    default: bool = True
    timed: bool = False
    timed_with: str = ""

    @property
    def card_label(self) -> str:
        return self.label or self.name

    def timing_choosers(self) -> tuple[str, ...]:
        """The ``--runtimes`` names any of which, chosen, lets the speed table time this row: its own name and
        ``timed_with`` for an on-device row (one with a ``greedy_metric``); () for any other row, timed whenever it
        is installed (no ``--runtimes`` choice applies to it)."""
        if not self.greedy_metric:
            return ()
        return (self.name, self.timed_with) if self.timed_with else (self.name,)

    def greedy_margin(self, variant: str) -> Optional[float]:
        """The margin (logits) its greedy ids on ``variant`` are judged with, or None: they must be identical."""
        return dict(self.greedy_margins).get(variant)


#: Every runtime, in the order reports list them.
RUNTIMES: tuple[Runtime, ...] = (
    Runtime("tokenizers", "tokenizers", modules=("tokenizers",), tokenizer=True),
    Runtime(
        "transformers",
        "transformers",
        ("safetensors",),
        modules=("transformers",),
        chat=True,
        tokenizer=True,
        candidate_kind="transformers",
    ),
    Runtime("prodip serve", "prodip", ("onnx",), chat=True),
    Runtime(
        "onnxruntime",
        "onnxruntime",
        ("onnx",),
        modules=("onnxruntime",),
        candidate_kind="onnx",
        label="ONNX Runtime",
        timed=True,
    ),
    Runtime(
        "pytorch", "torch", ("safetensors",), modules=("torch",), candidate_kind="prodip", label="PyTorch (prodip)"
    ),
    Runtime(
        "onnxruntime-genai",
        "onnxruntime-genai",
        ("onnx",),
        modules=("onnxruntime_genai",),
        greedy_metric="genai_greedy_identical",
        chat=True,
        tokenizer=True,
        timed=True,
    ),
    Runtime(
        "transformers.js",
        "npm:@huggingface/transformers",
        ("onnx",),
        npm=("@huggingface/transformers",),
        greedy_metric="transformersjs_greedy_identical",
        chat=True,
        tokenizer=True,
        label="transformers.js (Node)",
        timed=True,
    ),
    Runtime(
        "onnxruntime-web",
        "npm:onnxruntime-web",
        ("onnx",),
        npm=("onnxruntime-web",),
        greedy_metric="ortweb_wasm_greedy_identical",
        logits_metric="ortweb_wasm_logits",
    ),
    # the export's own page (index.html) in headless Chromium (Debian's package, driven by puppeteer-core):
    # transformers.js on onnxruntime-web's WebGPU execution provider, then on its WASM build, as a user opens it
    Runtime(
        "transformers.js-webgpu",
        "npm:@huggingface/transformers",
        ("onnx",),
        npm=("puppeteer-core",),
        greedy_metric="webgpu_greedy_identical",
        # a GPU's 4-bit and fp16 kernels sum in another order than ONNX Runtime's CPU ones: ids may part at a
        # near tie (measured on SwiftShader, int4, a tiny export: parted where ONNX Runtime's pick led the page's
        # by 0.016 logits; the 32-token prefill fault below parts them at gaps of 0.15-3.8): ~3x the gap seen. fp16: not measured (SwiftShader has no
        # shader-f16, so transformers.js refuses fp16 there and the check is skipped)
        greedy_margins=(("int4", 0.05), ("fp16", 0.05)),
        label="transformers.js (Chromium, WebGPU)",
        # opt-in (--runtimes): on a contrib graph (GroupQueryAttention, RotaryEmbedding) a prefill of 32 or more
        # tokens gives other logits on SwiftShader (fp32 too), so conformance's prompts (48-123 tokens) fail it
        # there (a standard graph passes); and a page load per variant and prompt costs ~10 s (a tiny export's
        # 4 variants, 2 prompts: 76-88 s on 2 shared, loaded cores)
        default=False,
    ),
    Runtime(
        "transformers.js-browser",
        "npm:@huggingface/transformers",
        ("onnx",),
        npm=("puppeteer-core",),
        greedy_metric="browser_wasm_greedy_identical",
        label="transformers.js (Chromium, WASM)",
        # opt-in (--runtimes): the page offers only the files config.json lists in use_external_data_format, so
        # an export whose ONNX weights are inline (a standard graph) has nothing it loads; a tiny export's 4
        # variants, 2 prompts: 21 s
        default=False,
        # but timed by default: the page on WASM is the figure a browser user gets, and a default run chooses
        # onnxruntime-web, the WASM build it loads (demo-size export: 17 s of a 30 s speed table)
        timed=True,
        timed_with="onnxruntime-web",
    ),
    Runtime(
        "llama.cpp",
        "npm:node-llama-cpp",
        ("gguf",),
        modules=("gguf",),
        npm=("node-llama-cpp",),
        chat=True,
        tokenizer=True,
        candidate_kind="gguf",
        timed=True,
    ),
    Runtime(
        "executorch",
        "executorch",
        ("pte",),
        modules=("pytorch_tokenizers",),
        chat=True,
        tokenizer=True,
        candidate_kind="pte",
        label="ExecuTorch",
        timed=True,
    ),
)


def _rows() -> tuple[Runtime, ...]:
    # looked up at call time (not bound at import), so a test that replaces the table is seen everywhere
    return RUNTIMES


def by_name(name: str) -> Runtime:
    """The row named ``name``.

    Raises:
        KeyError: no such runtime (the known names in the message).
    """
    for r in _rows():
        if r.name == name:
            return r
    raise KeyError(f"unknown runtime {name!r}; known: {', '.join(r.name for r in _rows())}")


def runtime_names(
    *,
    greedy: Optional[bool] = None,
    chat: Optional[bool] = None,
    tokenizer: Optional[bool] = None,
    timed: Optional[bool] = None,
) -> tuple[str, ...]:
    """Names of the rows of :data:`RUNTIMES` (at call time) with the given flags (``None`` = any), in order.

    >>> runtime_names(greedy=True)
    ('onnxruntime-genai', 'transformers.js', 'onnxruntime-web', 'transformers.js-webgpu', 'transformers.js-browser')
    >>> runtime_names(timed=True)
    ('onnxruntime', 'onnxruntime-genai', 'transformers.js', 'transformers.js-browser', 'llama.cpp', 'executorch')
    """
    return tuple(
        r.name
        for r in _rows()
        if (greedy is None or bool(r.greedy_metric) == greedy)
        and (chat is None or r.chat == chat)
        and (tokenizer is None or r.tokenizer == tokenizer)
        and (timed is None or r.timed == timed)
    )


def on_device() -> tuple[str, ...]:
    """The runtimes conformance decodes every ONNX variant in (``--runtimes`` chooses among them)."""
    return runtime_names(greedy=True)


def default_on_device() -> list[str]:
    """``--runtimes`` when not given: every on-device row marked ``default``."""
    return [r.name for r in _rows() if r.greedy_metric and r.default]


def greedy_metrics() -> dict[str, str]:
    """On-device runtime name -> the metric of its greedy ids check."""
    return {r.name: r.greedy_metric for r in _rows() if r.greedy_metric}


def card_label(kind: str) -> str:
    """The card's name of the runtime that runs candidates of ``kind`` (the kind itself if none does)."""
    return next((r.card_label for r in _rows() if r.candidate_kind == kind), kind)


def missing_reason(runtime: Runtime, node_dir: Path) -> Optional[str]:
    """Why ``runtime`` cannot run here (a module not importable, ``node`` not on PATH, a Node package not
    under ``node_dir``), with the command that installs it; None when everything it needs is present."""
    for module in runtime.modules:
        if importlib.util.find_spec(module) is None:
            return f"Python package {module} not installed ({PIP_HINT})"
    if runtime.npm and shutil.which("node") is None:
        return "node not found on PATH (Node.js >= 20)"
    for package in runtime.npm:
        if not (node_dir / "node_modules" / package / "package.json").is_file():
            return f"{package} not installed in {node_dir} ({NPM_HINT})"
    return None
