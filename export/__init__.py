"""prodip stage ``export``: checkpoint -> HF safetensors + ONNX decoder (fp32/fp16/int8/int4) + manifest.

Python entry points (imported lazily, so ``import export`` stays cheap)::

    export.ExportConfig              run config (``[export]`` TOML table, ``prodip export`` flags)
    export.export_checkpoint(cfg)    checkpoint dir -> export dir (what ``prodip run`` calls)
    export.export_model(model, cfg, tokenizer_dir=..., source_checkpoint=..., tokenizer_sha256=...)
    export.build_tiny_export(tmp_dir, tie=False, vocab_size=..., variants=...)  test fixtures

    prodip export runs/demo/train --out runs/demo/export
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ExportConfig": "prodip.export.config", "VARIANTS": "prodip.export.config",
    "export_checkpoint": "prodip.export.core", "export_model": "prodip.export.core", "size_table": "prodip.export.core",
    "build_tiny_export": "prodip.export.testing", "build_tiny_checkpoint": "prodip.export.testing",
    "read_manifest": "prodip.base.manifest", "verify_files": "prodip.base.manifest", "set_conformance": "prodip.base.manifest",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'export' has no attribute {name!r}")
