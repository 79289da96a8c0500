"""prodip stage: conformance. Prove every exported artifact computes what the training model computes.

Public entry points (imported on first use, so ``prodip.conformance.config`` can be read, e.g. by a
``--config`` check in an install without torch, without importing the suite): :class:`ConformanceConfig`,
:func:`run_conformance` (writes the report and the manifest verdict) and :func:`evaluate` (the report dict
only). Heavy imports (torch, onnxruntime, transformers) happen when the suite is imported.

    prodip conformance runs/demo/export --checkpoint runs/demo/train
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prodip.conformance.config import ConformanceConfig
    from prodip.conformance.suite import evaluate, run_conformance

_LAZY = {
    "ConformanceConfig": "prodip.conformance.config",
    "evaluate": "prodip.conformance.suite",
    "run_conformance": "prodip.conformance.suite",
}

__all__ = ["ConformanceConfig", "evaluate", "run_conformance"]


def __getattr__(name: str) -> Any:
    """The public entry points as module attributes, imported on first use (PEP 562)."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'prodip.conformance' has no attribute {name!r}")
