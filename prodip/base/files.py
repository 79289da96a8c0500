"""File helpers every stage shares (no torch, no onnx: ``prodip serve`` imports this too).

python -c "from prodip.base.files import file_sha256; print(file_sha256('README.md'))"
    python -c "from prodip.base.files import room_left; print(room_left('.'))"
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from prodip.base.errors import InvalidInput, WriteFailed
from prodip.base.jsontypes import JSONObject

# The write errors a user fixes by making room, raising a limit or choosing another folder.
ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS})


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks.

    Raises:
        OSError: the file cannot be read (FileNotFoundError when it is missing).
    """
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256_cached(path: str | os.PathLike[str]) -> str:
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


def read_json_or_none(path: str | os.PathLike[str]) -> JSONObject | None:
    """A JSON object from ``path``, or None when the file is missing, not JSON or not an object.

    For done-checks, where a missing or damaged artifact simply means "not done".
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def check_safetensors_size(path: str | os.PathLike[str]) -> None:
    """Refuse a ``.safetensors`` file whose size differs from what its own header describes.

    A file with no manifest (a Hugging Face folder's weights) is checked against itself: the format
    (https://github.com/huggingface/safetensors, "Format") is an 8-byte little-endian header length N,
    N bytes of JSON whose tensors' ``data_offsets`` [begin, end) index the data that follows, so a whole
    file is ``8 + N + max(end)`` bytes. Only the header is read. Without this, safetensors' loader fails
    with "incomplete metadata, file not fully covered", which names no file.

    Raises:
        InvalidInput: the file is shorter or longer than its header says (truncated or tampered), or its
            header is not a safetensors header; naming the file and both sizes.
        OSError: the file cannot be read (FileNotFoundError when it is missing).
    """
    size = os.stat(path).st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        raw = fh.read(n) if 0 < n <= size - 8 else b""
    try:
        header = json.loads(raw) if raw else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict):
        raise InvalidInput(f"{path}: {size} bytes, not a safetensors file (no readable header; truncated or damaged)")
    offsets = [v.get("data_offsets") if isinstance(v, dict) else None for k, v in header.items() if k != "__metadata__"]
    if not all(isinstance(o, list) and len(o) == 2 and isinstance(o[1], int) for o in offsets):
        raise InvalidInput(f"{path}: {size} bytes, a safetensors header without a tensor's data_offsets (damaged)")
    ends = [o[1] for o in offsets if isinstance(o, list)]
    want = 8 + n + max(ends, default=0)
    if size != want:
        raise InvalidInput(f"{path}: {size} bytes, its safetensors header says {want} (truncated or tampered)")


def room_errno(err: BaseException) -> int | None:
    """The errno of a write refused for lack of room (:data:`ROOM_ERRNOS`), else None.

    Looks at ``err`` and its causes/contexts: an ``OSError``'s ``errno``, or the ``(os error N)`` that
    safetensors' ``SafetensorError`` (Rust I/O errors: "I/O error: No space left on device (os error 28)")
    and other wrapped errors carry only in their text.
    """
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in ROOM_ERRNOS:
            return cur.errno
        match = re.search(r"\(os error (\d+)\)", str(cur))
        if match and int(match.group(1)) in ROOM_ERRNOS:
            return int(match.group(1))
        cur = cur.__cause__ or cur.__context__
    return None


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def room_left(path: str | os.PathLike[str], code: int | None = None) -> str:
    """Free space on the file system holding ``path`` (named by its mount point), and for EFBIG the
    process's file-size limit (``ulimit -f``, RLIMIT_FSIZE), as words, e.g.
    ``"12.0 MiB free on /tmp; file-size limit (ulimit -f) 300.0 KiB"``."""
    where = Path(os.path.abspath(path))
    while not where.exists() and where != where.parent:
        where = where.parent
    mount = where
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        words = f"{_size(shutil.disk_usage(where).free)} free on {mount}"
    except OSError:
        words = f"free space on {mount} unknown"
    if code == errno.EFBIG:
        try:
            import resource  # noqa: PLC0415 (POSIX only)

            soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
            if soft != resource.RLIM_INFINITY:
                words += f"; file-size limit (ulimit -f) {_size(soft)}"
        except (ImportError, OSError, ValueError):
            pass
    return words


def _newest_file(folder: Path) -> Path | None:
    """The most recently modified file under ``folder`` (the one being written when a write failed)."""
    best, best_t = None, -1
    for p in folder.rglob("*"):
        try:
            t = p.stat().st_mtime_ns
        except OSError:
            continue
        if t >= best_t and p.is_file():
            best, best_t = p, t
    return best


def room_message(target: str | os.PathLike[str], code: int, shown_as: str | os.PathLike[str] | None = None) -> str:
    """One line: the file that could not be written, why, and the room left.

    Args:
        target: the file being written, or the private folder an artifact is being written into (the
            newest file under it is named: the one the failed write was extending).
        code: the errno (one of :data:`ROOM_ERRNOS`).
        shown_as: the artifact's final path, named in place of the temporary ``target`` folder.
    """
    target = Path(target)
    name = target
    if target.is_dir():
        newest = _newest_file(target)
        if newest is not None:
            name = Path(shown_as or target) / newest.relative_to(target)
        else:
            name = Path(shown_as or target)
    elif shown_as is not None:
        name = Path(shown_as)
    fix = {
        errno.EROFS: "choose a writable folder",
        errno.EFBIG: "raise the file-size limit or write elsewhere",
    }.get(code, "free space or write elsewhere")
    where = Path(shown_as).parent if shown_as is not None else target  # an existing folder, not the temp one
    return f"{name}: cannot write: {os.strerror(code)} ({room_left(where, code)}); {fix}"


@contextlib.contextmanager
def writing(
    target: str | os.PathLike[str], shown_as: str | os.PathLike[str] | None = None, *, remove_on_error: bool = False
) -> Iterator[None]:
    """Turn a write refused for lack of room inside the block into one :class:`WriteFailed` naming the file.

    Every artifact writer wraps its writes in this (the private folder it fills, or the file), so
    ``prodip`` reports a full disk, ``ulimit -f``, a quota or a read-only folder as one line naming the
    file and the free space, exit 2, wherever it happens (see :func:`room_message`). Other errors pass
    through unchanged, as does a :class:`WriteFailed` from an inner block.

    Args:
        target: the file, or the private folder the artifact is written into.
        shown_as: the artifact's final path, named instead of the temporary ``target``.
        remove_on_error: delete ``target`` (file or folder) when the block raises anything, after naming it.
    Raises:
        WriteFailed: the block raised an error whose :func:`room_errno` is set.
    """
    try:
        yield
    except Exception as err:
        try:
            raise_for_room(err, target, shown_as)
        finally:
            if remove_on_error:
                _remove(Path(target))
        raise


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def raise_for_room(
    err: Exception, target: str | os.PathLike[str], shown_as: str | os.PathLike[str] | None = None
) -> None:
    """:func:`writing` for an ``except`` clause: raise ``err`` as a :class:`WriteFailed` naming the file if it is
    a write refused for lack of room; return (the caller re-raises ``err``) otherwise.

    Raises:
        WriteFailed: as :func:`writing`.
    """
    if isinstance(err, WriteFailed):  # named by an inner block: only show the final path for the temporary one
        if shown_as is None or str(target) not in err.message:
            return
        message = err.message.replace(str(target), str(shown_as)) + _unchanged(shown_as)
        raise WriteFailed(err.errno, message, err.filename.replace(str(target), str(shown_as))) from err.__cause__
    code = room_errno(err)
    if code is not None:
        message = room_message(target, code, shown_as) + _unchanged(shown_as)
        raise WriteFailed(code, message, str(shown_as or target)) from err


def _unchanged(shown_as: str | os.PathLike[str] | None) -> str:
    """The reassurance that an earlier artifact at the final path is still there, whole."""
    return f"; the earlier {shown_as} is unchanged" if shown_as is not None and Path(shown_as).exists() else ""


@contextlib.contextmanager
def native_stderr_to_log(logger: logging.Logger, level: int = logging.DEBUG) -> Iterator[None]:
    """Send what native code writes to the process's standard error (file descriptor 2) inside the block to
    ``logger`` at ``level``, one record per line, instead of the terminal.

    For libraries that print expected, harmless diagnostics from C++ where Python's ``sys.stderr``
    redirection cannot reach: ExecuTorch's ``HFTokenizer`` logs "E0000 ... re2.cc ... Error parsing ...
    invalid perl operator" and "Re2 failed to compile regex" for every pre-tokenizer with a lookahead, then
    compiles it with PCRE2 and tokenizes correctly (tokenizer/parity.py checks the ids), which reads as an
    error in a user's run. Keep the block short: anything else written to fd 2 meanwhile (another thread's
    log line) is logged at ``level`` too.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode("utf-8", "replace").splitlines():
                if line.strip():
                    logger.log(level, "%s", line)
