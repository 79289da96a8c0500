"""prodip.serve.memory.use_huge_pages: resident anonymous memory ends up in transparent huge pages with its contents
unchanged, block by block (an empty block does not stop the ones after it, a mostly empty one stays as it was), the
smaps parser keeps only private anonymous mappings and the heap, and a machine or kernel that cannot do it, or an error
on the way, is a status that says why nothing was done."""

from __future__ import annotations

import errno
import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from prodip.serve import memory
from prodip.serve.memory import use_huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage")
_ENABLED = (THP / "enabled").read_text() if (THP / "enabled").is_file() else ""
LINUX = sys.platform.startswith("linux")
needs_thp = pytest.mark.skipif(
    not LINUX or not _ENABLED or "[never]" in _ENABLED or memory._kernel_version() < (6, 1),
    reason="needs Linux 6.1+ (MADV_COLLAPSE) with transparent huge pages not set to never",
)
# with THP "always" the kernel gives huge pages on the first write already: "nothing before, only these after" needs
# the usual "madvise" setting
needs_madvise_mode = pytest.mark.skipif("[madvise]" not in _ENABLED, reason="needs THP enabled = madvise")
BLOCK = int((THP / "hpage_pmd_size").read_text()) if (THP / "hpage_pmd_size").is_file() else 2 << 20
PAGE = os.sysconf("SC_PAGE_SIZE") if LINUX else 4096


def _smaps_sum(lo: int, hi: int) -> dict[str, int]:
    """The smaps fields (bytes) summed over the mappings that overlap [lo, hi)."""
    total: dict[str, int] = {}
    inside = False
    for line in Path(f"/proc/{os.getpid()}/smaps").read_text().splitlines():
        head = line.split()
        if head and not head[0].endswith(":") and "-" in head[0]:
            a, _, b = head[0].partition("-")
            inside = int(a, 16) < hi and lo < int(b, 16)
        elif inside and len(head) >= 3 and head[0].endswith(":") and head[2] == "kB":
            total[head[0][:-1]] = total.get(head[0][:-1], 0) + int(head[1]) * 1024
    return total


class Blocks:
    """An anonymous private mapping with ``n`` whole huge-page blocks inside it (from :attr:`start`)."""

    def __init__(self, n: int) -> None:
        self.region = mmap.mmap(-1, (n + 1) * BLOCK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.base = np.frombuffer(self.region, np.uint8).ctypes.data
        self.offset = -self.base % BLOCK
        self.start, self.n = self.base + self.offset, n

    def fill(self, i: int, nbytes: int = BLOCK) -> None:
        at = self.offset + i * BLOCK
        self.region[at : at + nbytes] = bytes([i + 1]) * nbytes

    def block(self, i: int) -> bytes:
        return self.region[self.offset + i * BLOCK : self.offset + (i + 1) * BLOCK]

    def close(self) -> None:
        self.region.close()


@needs_thp
def test_resident_blocks_move_to_huge_pages_unchanged():
    b = Blocks(8)
    try:
        for i in range(8):
            b.fill(i)
        report = use_huge_pages()
        if report.status == "none collapsed" and report.busy:
            pytest.skip(f"no free huge page on this machine now: {report}")
        assert report.status == "collapsed" and report.blocks >= 8, report
        assert _smaps_sum(b.start, b.start + 8 * BLOCK)["AnonHugePages"] >= 8 * BLOCK
        assert all(b.block(i) == bytes([i + 1]) * BLOCK for i in range(8))  # contents unchanged
        assert f"blocks of {BLOCK >> 20} MiB" in str(report)
    finally:
        b.close()


@needs_thp
@needs_madvise_mode
def test_only_mostly_resident_blocks_collapse_and_an_empty_one_stops_nothing():
    """Block 0 holds one page, block 3 nothing, block 5 half: those stay in base pages (not made resident); the full
    blocks 1, 2 and 4, after the empty and the sparse ones, are collapsed."""
    b = Blocks(6)
    try:
        b.fill(0, PAGE)
        for i in (1, 2, 4):
            b.fill(i)
        b.fill(5, BLOCK // 2)
        before = _smaps_sum(b.start, b.start + 6 * BLOCK)
        assert before["AnonHugePages"] == 0, before
        report = use_huge_pages()
        if report.busy:
            pytest.skip(f"no free huge page on this machine now: {report}")
        after = _smaps_sum(b.start, b.start + 6 * BLOCK)
        assert after["AnonHugePages"] == 3 * BLOCK, after
        assert after["Rss"] == before["Rss"] == 3 * BLOCK + PAGE + BLOCK // 2, (before, after)
        assert b.block(0)[:PAGE] == b"\x01" * PAGE and b.block(4) == b"\x05" * BLOCK
    finally:
        b.close()


SMAPS = """\
55d4c0a00000-55d4c4a00000 rw-p 00000000 00:00 0                          [heap]
Size:              65536 kB
Rss:               60000 kB
AnonHugePages:         0 kB
THPeligible:           0
VmFlags: rd wr mr mw me ac
7f0000000000-7f0002000000 rw-p 00000000 00:00 0
Size:              32768 kB
Rss:               32768 kB
VmFlags: rd wr mr mw me ac
7f0002000000-7f0004000000 rw-p 00000000 00:00 0
Size:              32768 kB
Rss:                   4 kB
7f0004000000-7f0006000000 rw-s 00000000 00:01 1234                       /dev/shm/x
Size:              32768 kB
Rss:               32768 kB
7f0006000000-7f0008000000 rw-p 00000000 00:00 0                          [anon:arena]
Size:              32768 kB
Rss:               32768 kB
7f0008000000-7f000a000000 r--p 00000000 08:01 99                         /opt/my models/w.bin
Size:              32768 kB
Rss:               32768 kB
7f000a000000-7f000a100000 rw-p 00000000 00:00 0
Size:               1024 kB
Rss:                1024 kB
7ffd00000000-7ffd02000000 rw-p 00000000 00:00 0                          [stack]
Size:              32768 kB
Rss:               32768 kB
"""


def test_smaps_parser_keeps_private_anonymous_and_heap():
    """The heap and the resident unnamed private mapping; not the mostly empty one, a shared one, a named anonymous
    one, a file (its name with a space), one smaller than a block, or the stack."""
    got = memory._anonymous_mappings(SMAPS.splitlines(keepends=True), 2 << 20)
    assert got == [(0x55D4C0A00000, 0x55D4C4A00000), (0x7F0000000000, 0x7F0002000000)]


@pytest.mark.parametrize(
    ("answer", "status", "field"),
    [(0, "collapsed", "blocks"), (errno.EINVAL, "none collapsed", "refused"), (errno.EAGAIN, "none collapsed", "busy")],
)
@pytest.mark.skipif(not LINUX, reason="reads /proc/self/smaps")
def test_status_counts_what_the_kernel_answered(tmp_path, monkeypatch, answer, status, field):
    """Each resident block is asked once, a whole block at a time (madvise faked; smaps and mincore real)."""
    (tmp_path / "enabled").write_text("always [madvise] never\n")
    (tmp_path / "hpage_pmd_size").write_text(f"{BLOCK}\n")
    monkeypatch.setattr(memory, "_THP", tmp_path)
    monkeypatch.setattr(memory, "_kernel_version", lambda: (6, 1))
    b = Blocks(4)
    try:
        for i in range(4):
            b.fill(i)
        calls: list[tuple[int, int, int]] = []

        def fake(address: int, length: int, advice: int) -> int:
            calls.append((address, length, advice))
            return answer

        monkeypatch.setattr(memory, "_madvise", fake)
        report = use_huge_pages()
        assert report.status == status and getattr(report, field) == len(calls) >= 4, report
        assert {(b.start + i * BLOCK, BLOCK, memory.MADV_COLLAPSE) for i in range(4)} <= set(calls)
        assert all(length == BLOCK and address % BLOCK == 0 for address, length, _ in calls)
    finally:
        b.close()


def test_cannot_or_must_not_is_a_status(tmp_path, monkeypatch):
    if not LINUX:
        assert use_huge_pages().status.startswith("unavailable: not Linux")
        return
    (tmp_path / "enabled").write_text("always madvise [never]\n")
    monkeypatch.setattr(memory, "_THP", tmp_path)
    report = use_huge_pages()
    assert report.status == f"unavailable: disabled ({tmp_path / 'enabled'}: always madvise [never])"
    assert str(report).startswith("huge pages unavailable")
    monkeypatch.setattr(memory, "_THP", tmp_path / "absent")
    assert use_huge_pages().status.startswith("unavailable: no ")
    (tmp_path / "enabled").write_text("always [madvise] never\n")
    monkeypatch.setattr(memory, "_THP", tmp_path)
    monkeypatch.setattr(memory, "_kernel_version", lambda: (5, 15))
    assert use_huge_pages().status == "unavailable: Linux 5.15 has no MADV_COLLAPSE (6.1+)"
    monkeypatch.setattr(memory, "_kernel_version", lambda: (6, 8))

    def broken(*args: object) -> None:
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(memory, "_anonymous_mappings", broken)  # an optional speed-up never stops the server
    assert use_huge_pages().status == "unavailable: PermissionError: [Errno 13] Permission denied"


@pytest.mark.parametrize("huge_pages", [True, False])
def test_loading_server_moves_its_memory_unless_told_not_to(tiny_export, monkeypatch, caplog, huge_pages):
    """Service.load calls use_huge_pages after the sessions exist (the weights are prepacked then) and logs what it
    did; ``--huge-pages false`` skips it."""
    from fastapi.testclient import TestClient

    from prodip.serve import service
    from prodip.serve.app import create_app
    from tests.serve.conftest import LOCAL, wait_ready

    order: list[str] = []
    real_huge, real_open = service.use_huge_pages, service.open_decoder

    def spy_huge() -> memory.HugePages:
        order.append("huge pages")
        return real_huge()

    def spy_open(*args, **kwargs):  # noqa: ANN002, ANN003 (open_decoder's)
        order.append("decoder")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(service, "use_huge_pages", spy_huge)
    monkeypatch.setattr(service, "open_decoder", spy_open)
    with caplog.at_level("INFO", logger="prodip.serve.service"):
        with TestClient(create_app(tiny_export[0], "fp32", huge_pages=huge_pages), base_url=LOCAL) as c:
            wait_ready(c)
            assert (
                c.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2, "temperature": 0}).status_code == 200
            )
    assert order == (["decoder", "huge pages"] if huge_pages else ["decoder"])
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("huge pages")]
    assert len(logged) == order.count("huge pages"), logged
