"""Cut the bundled demo corpus (this folder) out of the project's shared data (see README.md here).

Only files that ../shared/data/PROVENANCE.md allows shipping are used, and only works that are public
domain everywhere (first published before 1930). Records/texts are copied verbatim, gzip'd with mtime 0
so the output is byte-reproducible.

    python data/make_demo_corpus.py ../shared/data data
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

BN_WORKS = {  # file -> works (the "work" field) kept whole
    "bn_pd_literature_majantali_site.jsonl": ["গল্পগুচ্ছ – প্রথম খণ্ড", "পাগলা দাশু", "আবোল তাবোল", "হ য ব র ল"],
    "bn_pd_literature_majantali_wip.jsonl": ["শেষের কবিতা", "আধুনিক সাহিত্য"],
}
# poems: every poet in the dataset except Tagore (plenty above) and Sukanta Bhattacharya (published 1948+)
POEMS_SKIP_POETS = {"রবীন্দ্রনাথ ঠাকুর", "সুকান্ত ভট্টাচার্য"}
EN_FILES = ["gutenberg/pg1342_Pride-and-Prejudice.txt", "gutenberg/pg11_Alice-s-Adventures-in-Wonderland.txt",
            "gutenberg/pg84_Frankenstein.txt", "gutenberg/pg35_The-Time-Machine.txt", "tinyshakespeare.txt"]
HELDOUT = {"udhr/ben.txt": "udhr_ben.txt", "udhr/eng.txt": "udhr_eng.txt"}


def _gzip_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as fh:
        fh.write(data)


def main(shared: str, out: str) -> int:
    src, dst = Path(shared), Path(out)
    for sub in ("bn", "en", "heldout"):
        (dst / sub).mkdir(parents=True, exist_ok=True)
    for name, works in BN_WORKS.items():
        lines = [l for l in (src / "bn" / name).read_text(encoding="utf-8").splitlines()
                 if json.loads(l)["work"] in works]
        _gzip_write(dst / "bn" / (name + ".gz"), ("\n".join(lines) + "\n").encode("utf-8"))
    name = "bn_pd_poems_bengali_poem_dataset.jsonl"
    lines = [l for l in (src / "bn" / name).read_text(encoding="utf-8").splitlines()
             if json.loads(l)["poet"] not in POEMS_SKIP_POETS]
    _gzip_write(dst / "bn" / (name + ".gz"), ("\n".join(lines) + "\n").encode("utf-8"))
    for rel in EN_FILES:
        _gzip_write(dst / "en" / (Path(rel).name + ".gz"), (src / "en" / rel).read_bytes())
    for rel, name in HELDOUT.items():
        shutil.copyfile(src / "parallel" / rel, dst / "heldout" / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
