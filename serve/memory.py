"""The server's memory in transparent huge pages (Linux): the model's weights, read by every decode step.

A decode step streams all the weights (55-440 MB for bench/serve.py's ~109 M-parameter model, int4 to fp32) through
the caches. ONNX Runtime keeps the weights it prepacks (MatMulNBits, int8 and fp32 GEMM) in ordinary heap or
anonymous memory, and under the usual kernel setting (``/sys/kernel/mm/transparent_hugepage/enabled`` = ``madvise``)
such memory gets huge pages only where a program asks for them: nobody does, so the server had none
(``AnonHugePages: 0 kB``). With the resident weights collapsed into 2 MiB pages after loading, one stream decoded
0.98-1.18x as fast as without, by variant and run (up to 1.18x for int8 at 1 thread; bench/results/
serve_onestream_2026-12-02.md). Fewer TLB misses per step is the likely reason; it was not measured with counters.

How: after the sessions are made, the private anonymous mappings and the heap are read from /proc/self/smaps, and
each whole huge-page block inside them that is mostly resident (``mincore``) is collapsed with ``MADV_COLLAPSE``
(Linux 6.1+; madvise(2)), one block per call, so an empty block does not stop the ones after it and a mostly empty one
does not become resident. Nothing is marked ``MADV_HUGEPAGE``: later allocations are left to the kernel's own
setting. Outputs are unchanged: the kernel moves pages, not their contents.

    python -c "from prodip.serve.memory import use_huge_pages; print(use_huge_pages())"
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: madvise(2) advice (Linux uapi asm-generic/mman-common.h): collapse a range into huge pages now (Linux 6.1+)
MADV_COLLAPSE = 25
_THP = Path("/sys/kernel/mm/transparent_hugepage")


@dataclass(frozen=True)
class HugePages:
    """What :func:`use_huge_pages` did.

    Attributes:
        status: "collapsed" (some blocks are huge pages now), "none collapsed" (no block was resident enough, or
            every collapse was refused or found no free huge page) or "unavailable: <why>" (nothing tried).
        blocks: huge-page blocks collapsed by this call.
        block_bytes: the huge-page size (bytes; 2 MiB on x86-64).
        refused: blocks the kernel would not collapse (EINVAL: e.g. THP disabled for this process or size).
        busy: blocks for which no free huge page was found (EAGAIN / ENOMEM).
        rss_added_bytes: resident memory added meanwhile by the whole process (bytes; a collapsed block is wholly
            resident, so partly resident ones grow).
        seconds: time taken (the kernel copies each block: ~0.1-1 s for 100-400 MB).
    """

    status: str
    blocks: int = 0
    block_bytes: int = 2 << 20
    refused: int = 0
    busy: int = 0
    rss_added_bytes: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        if self.status.startswith("unavailable"):
            return f"huge pages {self.status}"
        return (
            f"huge pages {self.status}: {self.blocks} blocks of {self.block_bytes >> 20} MiB "
            f"({self.blocks * self.block_bytes >> 20} MiB), {self.refused} refused, {self.busy} without a free "
            f"huge page, +{self.rss_added_bytes >> 20} MiB resident, {self.seconds:.2f} s"
        )


def use_huge_pages(min_resident: float = 0.75) -> HugePages:
    """Collapse this process's resident anonymous memory into transparent huge pages (see the module).

    Args:
        min_resident: the fraction of a huge-page block's base pages that must be resident for it to be collapsed
            (so at most ``1 - min_resident`` of what is collapsed becomes newly resident).
    Returns:
        :class:`HugePages`. Never raises: another OS, THP set to ``never``, a kernel before 6.1 or any error on the
        way is a status saying why nothing was done (an optional speed-up must not stop the server).
    """
    if not sys.platform.startswith("linux"):
        return HugePages(f"unavailable: not Linux ({sys.platform})")
    try:
        enabled = (_THP / "enabled").read_text().strip()
    except OSError:
        return HugePages(f"unavailable: no {_THP / 'enabled'} (a kernel without transparent huge pages)")
    if "[never]" in enabled:
        return HugePages(f"unavailable: disabled ({_THP / 'enabled'}: {enabled})")
    release = _kernel_version()
    if release < (6, 1):
        return HugePages(f"unavailable: Linux {release[0]}.{release[1]} has no MADV_COLLAPSE (6.1+)")
    try:
        return _collapse(min_resident)
    except Exception as err:  # noqa: BLE001 (reported, never raised: see Returns)
        return HugePages(f"unavailable: {type(err).__name__}: {err}")


def _collapse(min_resident: float) -> HugePages:
    try:
        block = int((_THP / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        block = 2 << 20
    base = os.sysconf("SC_PAGE_SIZE")
    start, rss_before = time.perf_counter(), _rollup("Rss")
    blocks = refused = busy = 0
    with open(f"/proc/{os.getpid()}/smaps") as smaps:
        mappings = _anonymous_mappings(smaps, block)
    for lo, hi in mappings:
        for at in range(-(-lo // block) * block, hi // block * block, block):  # the whole blocks inside
            if _resident_fraction(at, block, base) < min_resident:
                continue
            err = _madvise(at, block, MADV_COLLAPSE)
            if err == 0:
                blocks += 1
            elif err == errno.EINVAL:
                refused += 1
            elif err in (errno.EAGAIN, errno.ENOMEM):
                busy += 1
            # else (EFAULT: unmapped since smaps was read, ...): that block is left as it was
    return HugePages(
        "collapsed" if blocks else "none collapsed",
        blocks,
        block,
        refused,
        busy,
        max(0, _rollup("Rss") - rss_before),
        time.perf_counter() - start,
    )


def _anonymous_mappings(smaps: Iterable[str], min_bytes: int) -> list[tuple[int, int]]:
    """(start, end) addresses of the private writable anonymous mappings (no name) and the heap, at least
    ``min_bytes`` long and with at least ``min_bytes`` resident, from the text of /proc/PID/smaps (proc(5): a
    header line ``lo-hi perms offset dev inode [name]`` then ``Field: value kB`` lines and ``VmFlags:``). Named
    anonymous mappings (``[anon:...]``, ``[stack]``) and file mappings are left out."""
    out: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    for line in smaps:
        head = line.split()
        if not head:
            continue
        if not head[0].endswith(":") and "-" in head[0] and len(head) >= 5:
            lo_s, _, hi_s = head[0].partition("-")
            name = " ".join(head[5:])
            lo, hi = int(lo_s, 16), int(hi_s, 16)
            wanted = head[1][:2] == "rw" and head[1][3:4] == "p" and name in ("", "[heap]") and hi - lo >= min_bytes
            current = (lo, hi) if wanted else None
        elif current is not None and head[0] == "Rss:":
            if int(head[1]) * 1024 >= min_bytes:
                out.append(current)
            current = None
    return out


def _resident_fraction(address: int, length: int, page: int) -> float:
    """The fraction of the base pages of [address, address + length) that are resident (mincore(2)); 0 on error."""
    vec = (ctypes.c_ubyte * (length // page))()
    if _libc().mincore(address, length, vec) != 0:
        return 0.0
    return float((np.frombuffer(bytes(vec), np.uint8) & 1).mean())  # bit 0: resident; the other bits are reserved


def _madvise(address: int, length: int, advice: int) -> int:
    """madvise(2) on [address, address + length): 0, or the errno it failed with."""
    return 0 if _libc().madvise(address, length, advice) == 0 else ctypes.get_errno()


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    """The process's own C library (``CDLL(None)``), with madvise and mincore typed and setting errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.mincore.restype = ctypes.c_int
    return libc


def _kernel_version() -> tuple[int, int]:
    """(major, minor) of the running kernel (``os.uname().release``, e.g. "6.18.44-fc" -> (6, 18)); (0, 0) if
    unreadable."""
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def _rollup(field: str) -> int:
    """A field of /proc/self/smaps_rollup, bytes (0 when unreadable)."""
    try:
        for line in Path(f"/proc/{os.getpid()}/smaps_rollup").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
