"""The server's memory in transparent huge pages (Linux): the model's weights read by every decode step.

A decode step streams all the weights (55-440 MB for bench/serve.py's ~109 M-parameter model, int4 to fp32) through
the caches; in 4 KiB pages that is one TLB entry per 4 KiB, most of them misses, in 2 MiB pages one per 2 MiB. ONNX
Runtime keeps the weights it prepacks (MatMulNBits, int8 and fp32 GEMM) in ordinary heap or anonymous memory, and with
the usual kernel setting (``/sys/kernel/mm/transparent_hugepage/enabled`` = ``madvise``) such memory gets huge pages
only where a program asked for them: nobody does, so none did (``AnonHugePages: 0 kB``). Measured at one stream,
collapsing the server's resident anonymous memory into huge pages after the model is loaded made the engine's decode
1.05-1.18x faster (int8 and fp32; less for int4, whose weights are smallest): bench/results/serve_onestream_2026-12-02.md.

How: after the sessions are made, each private anonymous mapping (or the heap) of at least ``min_bytes`` that is
mostly resident is marked ``MADV_HUGEPAGE`` (later growth of it gets huge pages too, and the kernel's khugepaged may
collapse what is left) and collapsed now with ``MADV_COLLAPSE`` (Linux 6.1+; madvise(2)). Only the whole 2 MiB
blocks inside a mapping are touched. Mostly-empty mappings (thread stacks, reserved arenas) are left alone, so the
resident memory grows little (each collapsed block is fully resident). The numbers computed do not change: this
moves pages, not data.

    python -c "from prodip.serve.memory import use_huge_pages; print(use_huge_pages())"
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: madvise(2) advice values (Linux uapi asm-generic/mman-common.h)
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
_THP = Path("/sys/kernel/mm/transparent_hugepage")


@dataclass(frozen=True)
class HugePages:
    """What :func:`use_huge_pages` did.

    Attributes:
        status: "collapsed" (regions are in huge pages now), "advised" (marked only: a kernel before 6.1 has no
            MADV_COLLAPSE; khugepaged collapses them over time), "none collapsed" (no mapping large and resident
            enough, or no free huge page) or "unavailable: <why>" (nothing done).
        regions: mappings marked.
        huge_bytes: anonymous memory in huge pages after the call (``AnonHugePages`` of /proc/self/smaps_rollup),
            bytes.
        rss_added_bytes: resident memory added by the collapse (bytes; blocks that were partly resident).
        seconds: time taken (the collapse copies pages: ~0.1-1 s for 100-400 MB).
    """

    status: str
    regions: int = 0
    huge_bytes: int = 0
    rss_added_bytes: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        if self.status.startswith("unavailable"):
            return f"huge pages {self.status}"
        return (
            f"huge pages {self.status}: {self.regions} regions, {self.huge_bytes >> 20} MiB in huge pages, "
            f"+{self.rss_added_bytes >> 20} MiB resident, {self.seconds:.2f} s"
        )


def use_huge_pages(min_bytes: int = 4 << 20, min_resident: float = 0.75) -> HugePages:
    """Back this process's large, mostly resident anonymous memory with transparent huge pages (see the module).

    Args:
        min_bytes: smallest mapping considered (bytes).
        min_resident: the fraction of a mapping that must be resident for it to be collapsed (so a mostly empty
            mapping does not become resident).
    Returns:
        :class:`HugePages`; never raises for want of support (non-Linux, THP disabled, madvise refused): the status
        says why nothing was done.
    """
    if not sys.platform.startswith("linux"):
        return HugePages(f"unavailable: not Linux ({sys.platform})")
    try:
        enabled = (_THP / "enabled").read_text()
    except OSError:
        return HugePages(f"unavailable: no {_THP / 'enabled'} (kernel without transparent huge pages)")
    if "[never]" in enabled:
        return HugePages(f"unavailable: disabled ({_THP / 'enabled'}: {enabled.strip()})")
    try:
        page = int((_THP / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        page = 2 << 20
    start = time.perf_counter()
    rss_before = _rollup("Rss")
    regions = collapsed = refused = 0
    for lo, hi in _candidates(min_bytes, min_resident):
        lo, hi = -(-lo // page) * page, hi // page * page  # the whole huge pages inside the mapping
        if hi - lo < page:
            continue
        if _madvise(lo, hi - lo, MADV_HUGEPAGE) != 0:
            continue  # e.g. a mapping that went away since it was read, or one the kernel will not advise
        regions += 1
        err = _madvise(lo, hi - lo, MADV_COLLAPSE)
        if err == 0:
            collapsed += 1
        elif err == errno.EINVAL:
            refused += 1  # a kernel before 6.1 (no MADV_COLLAPSE), or a mapping it cannot collapse
        # EAGAIN / ENOMEM: no free huge page at the moment; that mapping stays as it was
    if collapsed:
        status = "collapsed"
    elif refused:  # every collapse refused: a kernel without MADV_COLLAPSE; the marks still let khugepaged do it
        status = "advised"
    else:  # no mapping large and resident enough, or no free huge page
        status = "none collapsed"
    return HugePages(
        status,
        regions,
        _rollup("AnonHugePages"),
        max(0, _rollup("Rss") - rss_before),
        time.perf_counter() - start,
    )


def _madvise(address: int, length: int, advice: int) -> int:
    """madvise(2) on [address, address + length): 0, or the errno it failed with."""
    madvise = _libc_madvise()
    return 0 if madvise(address, length, advice) == 0 else ctypes.get_errno()


@functools.lru_cache(maxsize=1)
def _libc_madvise() -> Any:
    """The C library's madvise, setting errno (the process's own libc: ``CDLL(None)``)."""
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def _candidates(min_bytes: int, min_resident: float) -> list[tuple[int, int]]:
    """(start, end) addresses of the private writable anonymous mappings and the heap of at least ``min_bytes``
    with at least ``min_resident`` of them resident (/proc/self/smaps; proc(5))."""
    out: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    with open(f"/proc/{os.getpid()}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                # a mapping's first line: "lo-hi perms offset dev inode [path]"
                current = None
                lo_s, _, hi_s = head[0].partition("-")
                path = head[5] if len(head) > 5 else ""
                lo, hi = int(lo_s, 16), int(hi_s, 16)
                if (
                    head[1].startswith("rw")
                    and head[1].endswith("p")
                    and path in ("", "[heap]")
                    and hi - lo >= min_bytes
                ):
                    current = (lo, hi)
            elif current is not None and head[:1] == ["Rss:"]:
                if int(head[1]) * 1024 >= min_resident * (current[1] - current[0]):
                    out.append(current)
                current = None
    return out


def _rollup(field: str) -> int:
    """A field of /proc/self/smaps_rollup, bytes (0 when unreadable)."""
    try:
        for line in Path(f"/proc/{os.getpid()}/smaps_rollup").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
