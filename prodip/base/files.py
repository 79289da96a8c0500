"""File helpers every stage shares (no torch, no onnx: ``prodip serve`` imports this too).

python -c "from prodip.base.files import file_sha256; print(file_sha256('README.md'))"
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any


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


def file_sha256_cached(path: str | os.PathLike) -> str:
    """:func:`file_sha256`, computed once per (path, mtime, size) in this process.

    The pipeline's done-checks ask for the same hashes several times per invocation (GBs at the
    0.4B scale); a file rewritten since (new mtime or size) is hashed again.

    Raises:
        OSError: the file cannot be read.
    """
    st = os.stat(path)
    return _sha256_keyed(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _sha256_keyed(path: str, mtime_ns: int, size: int) -> str:
    return file_sha256(path)


def read_json_or_none(path: str | os.PathLike) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when the file is missing, not JSON or not an object.

    For done-checks, where a missing or damaged artifact simply means "not done".
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
