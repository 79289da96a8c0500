"""prodip.serve.memory.use_huge_pages: a large resident anonymous buffer ends up in transparent huge pages with its
contents unchanged, a mostly empty mapping is left alone (it does not become resident), and a machine without
transparent huge pages gets a status that says why nothing was done."""

from __future__ import annotations

import errno
import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from prodip.serve import memory
from prodip.serve.config import ServeConfig
from prodip.serve.memory import use_huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not THP.is_file() or "[never]" in THP.read_text(),
    reason="needs Linux with transparent huge pages not set to never",
)
MIB = 1 << 20


def _mapping(address: int) -> dict[str, int]:
    """The smaps fields (kB) of the mapping holding ``address``."""
    fields: dict[str, int] = {}
    inside = False
    for line in Path(f"/proc/{os.getpid()}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            lo, _, hi = head[0].partition("-")
            inside = int(lo, 16) <= address < int(hi, 16)
        elif inside and len(head) >= 2 and head[0].endswith(":") and head[1].isdigit():
            fields[head[0][:-1]] = int(head[1])
    return fields


@needs_thp
def test_resident_buffer_moves_to_huge_pages_unchanged():
    region = mmap.mmap(-1, 24 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # a mapping of its own
    try:
        data = np.frombuffer(region, np.float32)
        data[:] = np.arange(data.size, dtype=np.float32)  # every page written: resident
        before = _mapping(data.ctypes.data)
        assert before["AnonHugePages"] == 0, before  # nobody asked for huge pages: madvise mode gives none
        report = use_huge_pages(min_bytes=16 * MIB, min_resident=0.5)
        after = _mapping(data.ctypes.data)
        if report.status == "advised":
            pytest.skip(f"kernel without MADV_COLLAPSE: {report}")
        assert report.status == "collapsed", report
        # the whole 2 MiB blocks inside the 24 MiB (at least 22 MiB, whatever the alignment) are huge pages now
        assert after["AnonHugePages"] * 1024 >= 22 * MIB, (before, after, report)
        assert report.huge_bytes >= after["AnonHugePages"] * 1024 and report.regions >= 1
        np.testing.assert_array_equal(data, np.arange(data.size, dtype=np.float32))
        assert "MiB in huge pages" in str(report)
        del data
    finally:
        region.close()


@needs_thp
def test_mostly_empty_mapping_is_left_alone():
    region = mmap.mmap(-1, 64 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region[:4096] = b"x" * 4096  # one page resident of 16384
        address = np.frombuffer(region, np.uint8).ctypes.data
        use_huge_pages(min_bytes=16 * MIB)
        after = _mapping(address)
        assert after["AnonHugePages"] == 0 and after["Rss"] < 4096, after
        assert region[:4] == b"xxxx"
    finally:
        region.close()


def test_thp_disabled_or_missing_is_a_status(tmp_path, monkeypatch):
    if not sys.platform.startswith("linux"):
        assert use_huge_pages().status.startswith("unavailable: not Linux")
        return
    (tmp_path / "enabled").write_text("always madvise [never]\n")
    monkeypatch.setattr(memory, "_THP", tmp_path)
    report = use_huge_pages()
    assert report.status == "unavailable: disabled (" + str(tmp_path / "enabled") + ": always madvise [never])"
    assert report.regions == 0 and str(report).startswith("huge pages unavailable")
    monkeypatch.setattr(memory, "_THP", tmp_path / "absent")
    assert use_huge_pages().status.startswith("unavailable: no ")


def test_serve_moves_weights_by_default_and_can_be_told_not_to():
    assert ServeConfig().huge_pages is True
    assert ServeConfig(huge_pages=False).huge_pages is False


@needs_thp
@pytest.mark.parametrize(
    ("collapse_errno", "status"),
    [(0, "collapsed"), (errno.EINVAL, "advised"), (errno.EAGAIN, "none collapsed")],
)
def test_status_follows_what_the_kernel_answered(monkeypatch, collapse_errno, status):
    """EINVAL from every MADV_COLLAPSE is a kernel before 6.1 (marked only); EAGAIN is no free huge page."""
    region = mmap.mmap(-1, 24 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.write(b"y" * (24 * MIB))
        calls: list[tuple[int, int]] = []

        def fake(address: int, length: int, advice: int) -> int:
            calls.append((advice, length))
            return collapse_errno if advice == memory.MADV_COLLAPSE else 0

        monkeypatch.setattr(memory, "_madvise", fake)
        report = use_huge_pages(min_bytes=16 * MIB)
        assert report.status == status and report.regions >= 1, report
        # each marked mapping is asked to collapse once, in whole 2 MiB blocks
        assert [a for a, _ in calls].count(memory.MADV_HUGEPAGE) == report.regions
        assert all(length % (2 * MIB) == 0 for _, length in calls)
    finally:
        region.close()


@pytest.mark.parametrize("huge_pages", [True, False])
def test_loading_server_moves_its_memory_unless_told_not_to(tiny_export, monkeypatch, caplog, huge_pages):
    """Service.load calls use_huge_pages after the sessions exist (the weights are prepacked then) and logs what it
    did; ``--huge-pages false`` skips it."""
    from fastapi.testclient import TestClient

    from prodip.serve import service
    from prodip.serve.app import create_app
    from tests.serve.conftest import wait_ready

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
        with TestClient(create_app(tiny_export[0], "fp32", huge_pages=huge_pages)) as c:
            wait_ready(c)
            assert (
                c.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2, "temperature": 0}).status_code == 200
            )
    assert order == (["decoder", "huge pages"] if huge_pages else ["decoder"])
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("huge pages")]
    assert len(logged) == order.count("huge pages"), logged
