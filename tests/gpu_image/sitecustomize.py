"""Make this Python look like the GPU image's (``bench/gpu/bench.py``'s target): on PYTHONPATH,
a top-level module found in site-packages imports only when a distribution that provides it is
on the image's package list, ``bench/gpu/image-packages.txt`` (a committed copy of the list the
device library gives). Any other module must come from outside site-packages: the bench's
in-place ``prodip`` folder, or the wheels it carries (``bench.CARRIED``) unpacked into its work
folder. Otherwise the import fails with "not in the GPU image".

Only the imports the project makes are checked: the bench path's own modules, the carried
wheels and command lines. An import made by code in site-packages is that package's business
(transformers probes optional packages such as torchao; huggingface-hub 2.x here needs httpx2,
the image's older one does not): on the image its own version decides what it imports.

Nothing here is a hand-written list of what the image lacks: the set is derived from the
committed file and from the installed distributions' own records
(``importlib.metadata.packages_distributions``), so a new dependency that the image lacks fails
the dry run (tests/bench/test_gpu_bench.py) unless the bench carries it.
"""

import importlib.machinery
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE_LIST = ROOT / "bench" / "gpu" / "image-packages.txt"
#: The project itself: the image does not have it installed (the bench maps the checkout in place).
PROJECT = "prodip"


def normalise(name: str) -> str:
    """A distribution name in PEP 503 normal form (``typing_extensions`` -> ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def image_distributions(path: Path = IMAGE_LIST) -> set[str]:
    """The normalised distribution names of the image's list (``#`` comments and blank lines skipped)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return {normalise(ln.strip()) for ln in lines if ln.strip() and not ln.lstrip().startswith("#")}


def project_distributions(pyproject: Path = ROOT / "pyproject.toml") -> set[str]:
    """The normalised names of pyproject.toml's ``dependencies`` and ``train`` extra (the bench path's)."""
    import tomllib  # noqa: PLC0415 (Python >= 3.11, as on the image)

    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["train"]
    return {normalise(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in reqs}


IMAGE = image_distributions()
_SITE_MARKS = ("site-packages", "dist-packages")
_providers = None


def _in_site(spec) -> bool:
    where = spec.origin or next(iter(spec.submodule_search_locations or []), "")
    return any(m in str(where) for m in _SITE_MARKS)


def _importer_in_site() -> bool:
    """True when the module being imported is imported by code in site-packages (the first frame
    outside importlib's machinery and the standard library)."""
    stdlib = os.path.dirname(os.__file__)
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if any(m in name for m in _SITE_MARKS):
            return True
        if not (name.startswith("<frozen") or name.startswith(stdlib) or name == __file__):
            return False
        frame = frame.f_back
    return False


def _at_site_root(spec) -> bool:
    where = Path(spec.origin or next(iter(spec.submodule_search_locations or []), ""))
    parent = where.parent.parent if where.name == "__init__.py" else where.parent
    return parent.name in _SITE_MARKS


def _distributions_of(name: str) -> list:
    global _providers
    if _providers is None:
        import importlib.metadata  # noqa: PLC0415 (stdlib; imported on the first site-packages module)

        _providers = importlib.metadata.packages_distributions()
    return _providers.get(name, [])


class _ImageFinder:
    """Refuses a top-level site-packages module whose distribution is not on the image's list."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if path is not None or name in sys.builtin_module_names or name in sys.stdlib_module_names:
            return None  # a submodule follows its package; the standard library is on every image
        spec = importlib.machinery.PathFinder.find_spec(name)
        if name != PROJECT and (spec is None or not _in_site(spec)):
            return None  # not found at all (the normal error), or found outside site-packages
        dists = [] if name == PROJECT else _distributions_of(name)
        if not dists and name != PROJECT and not _at_site_root(spec):
            return spec  # a folder an installed package put on sys.path (onnxruntime/transformers)
        if any(normalise(d) in IMAGE for d in dists) or _importer_in_site():
            return spec
        outside = [p for p in sys.path if not any(m in p for m in _SITE_MARKS)]
        spec = importlib.machinery.PathFinder.find_spec(name, outside)
        if spec is None:
            provider = ", ".join(dists) or name
            raise ModuleNotFoundError(
                f"No module named {name!r} (not in the GPU image: {provider} is not on "
                f"bench/gpu/image-packages.txt, and bench/gpu/bench.py does not carry it)",
                name=name,
            )
        return spec


sys.meta_path.insert(0, _ImageFinder)
