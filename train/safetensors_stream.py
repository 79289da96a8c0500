"""A safetensors writer that hashes the file in the same pass (for checkpoints written in the background).

    python -c "import torch; from prodip.train.safetensors_stream import write_safetensors as w; \
from pathlib import Path; print(w(Path('/tmp/x.safetensors'), {'a': torch.ones(3)}))"
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Optional

import torch

from prodip.base.errors import InvalidInput
from prodip.base.jsontypes import JSONObject

#: torch dtype -> safetensors dtype name (https://github.com/huggingface/safetensors#format)
_ST_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors(
    path: Path, tensors: dict[str, torch.Tensor], metadata: Optional[dict[str, str]] = None
) -> tuple[int, str]:
    """Write a safetensors file and hash it in the same pass; fsync it.

    The format (https://github.com/huggingface/safetensors#format): an 8-byte little-endian header
    length, a JSON header ``{name: {dtype, shape, data_offsets}, "__metadata__": {...}}`` padded
    with spaces to a multiple of 8 bytes, then the raw little-endian tensor bytes. Written here
    rather than with ``safetensors.torch.save_file`` so that each tensor's bytes are hashed while
    they are written (no second read of a multi-GB file, no in-memory copy of it) and the GIL is
    released during the hashing and the writes (``hashlib`` and file writes of large buffers
    release it), which matters when a background thread saves while the training loop runs.
    ``safetensors.torch.load_file``/``safe_open`` read the result (tests/train/test_checkpoint.py).

    Args:
        path: file to create.
        tensors: name -> contiguous CPU tensor (any dtype in ``_ST_DTYPES``).
        metadata: str -> str, stored as ``__metadata__``.
    Returns:
        (bytes written, hex sha256 of the file).
    Raises:
        ValueError: a tensor dtype safetensors cannot store.
    """
    header: JSONObject = {"__metadata__": {k: v for k, v in metadata.items()}} if metadata else {}
    offset, names = 0, sorted(tensors)
    for name in names:
        t = tensors[name]
        if t.dtype not in _ST_DTYPES:
            raise InvalidInput(f"{path}: tensor {name} has dtype {t.dtype}, which safetensors cannot store")
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": [*t.shape], "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    digest = hashlib.sha256()
    with open(path, "wb") as fh:
        for chunk in (struct.pack("<Q", len(blob)), blob):
            digest.update(chunk)
            fh.write(chunk)
        for name in names:
            t = tensors[name]
            if t.numel():
                raw = memoryview(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
                digest.update(raw)
                fh.write(raw)
        fh.flush()
        os.fsync(fh.fileno())
    return 8 + len(blob) + offset, digest.hexdigest()
