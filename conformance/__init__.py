"""prodip stage: conformance. Prove every exported artifact computes what the training model computes.

Public entry points: :class:`ConformanceConfig`, :func:`run_conformance` (writes the report and
the manifest verdict) and :func:`evaluate` (the report dict only). Heavy imports (torch,
onnxruntime, transformers) happen when a check runs, not here.

    prodip conformance runs/demo/export --checkpoint runs/demo/train
"""

from prodip.conformance.config import ConformanceConfig
from prodip.conformance.suite import evaluate, run_conformance

__all__ = ["ConformanceConfig", "evaluate", "run_conformance"]
