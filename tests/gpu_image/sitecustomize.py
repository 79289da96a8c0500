"""Make this Python look like the GPU image's (``bench/gpu/bench.py``'s target): on PYTHONPATH,
the packages the image lacks cannot be imported from site-packages (nor prodip's editable install).

Used by tests/bench/test_gpu_bench.py so the dry run proves the bench needs nothing the image
lacks: ``prodip`` must come from the bench's in-place folder and ``tomli_w`` from its wheel.
The list is the project's dependencies minus the image's packages
(as the lending tool describes the nvidia-h200 image; issue 26 lists them).
"""

import importlib.machinery
import sys

MISSING = {
    "prodip",  # not installed there: bench.py maps the checkout in place
    "tomli_w",
    "fastapi",
    "uvicorn",
    "pydantic",
    "starlette",
    "onnxruntime_genai",
    "gguf",
    "executorch",
    "pytorch_tokenizers",
    "datasets",
    "lm_eval",
    "schemathesis",
}


class _ImageFinder:
    """Finds a MISSING top-level module only on path entries outside site-packages."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if path is not None or name not in MISSING:
            return None
        paths = [p for p in sys.path if "site-packages" not in p and "dist-packages" not in p]
        spec = importlib.machinery.PathFinder.find_spec(name, paths)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the GPU image)", name=name)
        return spec


sys.meta_path.insert(0, _ImageFinder)
