"""Small readers of ONNX protos shared by the graph rewrites of :mod:`prodip.export.graph`."""

from __future__ import annotations

from typing import Any

import onnx


def onnx_opset(model: onnx.ModelProto) -> int:
    """The model's opset of the default ONNX domain (``""`` or ``"ai.onnx"``); StopIteration if it imports none."""
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """Attribute ``name`` of ``node`` as a Python value, or ``default`` when absent (pass the spec's default)."""
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)
