"""prodip stage ``export``: checkpoint -> HF safetensors + ONNX decoder (fp32/fp16/int8/int4) + manifest.

Python entry points (imported lazily, so ``import export`` stays cheap)::

    export.ExportConfig              run config (``[export]`` TOML table, ``prodip export`` flags)
    export.export_checkpoint(cfg)    checkpoint dir -> export dir (what ``prodip run`` calls)
    export.export_model(model, cfg, tokenizer_dir=..., source_checkpoint=..., tokenizer_sha256=...)

    prodip export runs/demo/train --out runs/demo/export
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ExportConfig": "prodip.export.config",
    "VARIANTS": "prodip.export.config",
    "export_checkpoint": "prodip.export.core",
    "export_model": "prodip.export.core",
    "size_table": "prodip.export.records",
    "load_manifest": "prodip.base.manifest",
    "verify_files": "prodip.base.manifest",
    "set_conformance": "prodip.base.manifest",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'export' has no attribute {name!r}")
