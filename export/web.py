"""The export's browser page: ``index.html`` + ``web/`` (the page's script, transformers.js and the WASM build).

The page (:data:`PAGE_FILES`, beside this module) loads the model from the export folder with
transformers.js's browser build and onnxruntime-web's WASM backend (its plain build; the asyncify build
for ``?device=webgpu``), every file from the folder itself
(``env.allowRemoteModels = false``, ``wasmPaths`` = ``web/``): no CDN, no Hub. The library files come
from the Node packages prodip pins (``node/``, ``npm install --ignore-scripts --prefix node``; or
``$PRODIP_NODE_ROOT``): :data:`LIBRARY_FILES`. Without them the page is still written and says so.

    python -c "from prodip.export.web import library_sources; print(library_sources())"
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from prodip.base.page import render_page

#: Page files (source beside this module -> path in the export). The HTML page gets the head every
#: prodip page shares (:func:`prodip.base.page.render_page`); the others are copied as they are.
PAGE_FILES = {"index.html": "index.html", "app.js": "web/app.js"}
#: Library files (path under node_modules -> path in the export): transformers.js's browser bundle
#: (onnxruntime-web's JS inside); onnxruntime-web's plain WASM build, which the page loads for the
#: ``wasm`` device (about half the bytes of the asyncify build and faster: bench/browser.py); and the
#: asyncify build, which WebGPU needs (transformers.js's own choice for both). A browser downloads one.
LIBRARY_FILES = {
    "@huggingface/transformers/dist/transformers.min.js": "web/transformers.min.js",
    "onnxruntime-web/dist/ort-wasm-simd-threaded.mjs": "web/ort-wasm-simd-threaded.mjs",
    "onnxruntime-web/dist/ort-wasm-simd-threaded.wasm": "web/ort-wasm-simd-threaded.wasm",
    "onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.mjs": "web/ort-wasm-simd-threaded.asyncify.mjs",
    "onnxruntime-web/dist/ort-wasm-simd-threaded.asyncify.wasm": "web/ort-wasm-simd-threaded.asyncify.wasm",
}


def node_modules() -> Path:
    """``$PRODIP_NODE_ROOT/node_modules``, else the repository's ``node/node_modules``."""
    env = os.environ.get("PRODIP_NODE_ROOT")
    return (Path(env) if env else Path(__file__).resolve().parents[1] / "node") / "node_modules"


def library_sources() -> Optional[dict[Path, str]]:
    """Installed library files (absolute source -> export path), or None when any is missing."""
    root = node_modules()
    found = {root / src: dst for src, dst in LIBRARY_FILES.items()}
    return found if all(p.is_file() for p in found) else None


def write_web_page(out_dir: str | os.PathLike) -> list[Path]:
    """Write the page and, when installed, the library files into the export folder ``out_dir``.

    Returns:
        Paths written (the page always; the library files only when :func:`library_sources` finds them).
    """
    out, here = Path(out_dir), Path(__file__).with_name("web")
    written = []
    sources = {here / src: dst for src, dst in PAGE_FILES.items()}
    sources.update(library_sources() or {})
    for src, dst in sources.items():
        path = out / dst
        path.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix == ".html":
            path.write_text(render_page(src.read_text(encoding="utf-8")), encoding="utf-8")
        else:
            shutil.copyfile(src, path)
        written.append(path)
    return written
