"""File helpers every stage shares (no torch, no onnx: ``prodip serve`` imports this too)."""

from __future__ import annotations

import hashlib
import os


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks.

    Raises:
        OSError: the file cannot be read (FileNotFoundError when it is missing).
    """
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
