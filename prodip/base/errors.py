"""What the user can fix, as exception types the command line reports in one line.

Every error prodip raises for bad input (a config value, a corpus file, a checkpoint or export
that is missing, damaged or from somewhere else, a gate that failed) is a :class:`UserError`.
``prodip`` prints those as ``prodip COMMAND: error: MESSAGE`` and exits 2; any other exception is
a bug and shows its traceback with a request to report it. Each kind also derives from the
built-in exception a caller would expect (``ValueError``, ``FileNotFoundError``, ...), so
``except ValueError`` keeps working.

    python -c "from prodip.base.errors import InvalidInput; raise InvalidInput('x: bad')"
"""

from __future__ import annotations


class UserError(Exception):
    """Base of every error a user can fix; the message names the file, table, key or tensor."""


class InvalidInput(UserError, ValueError):
    """A value, file content or artifact is wrong (bad config value, corrupt shard, mismatched hash)."""


class MissingInput(UserError, FileNotFoundError):
    """A file or folder the command reads does not exist (and the message says which command makes it)."""


class OutputExists(UserError, FileExistsError):
    """The output path holds something the command will not overwrite without ``--force``/``overwrite``."""


class StageFailed(UserError, RuntimeError):
    """A stage ran and its gate said no (fertility gate, conformance), or a server would not start."""


class ConfigError(InvalidInput):
    """An unknown, missing or ill-typed configuration key; the message names the file, table and key."""


class WriteFailed(UserError, OSError):
    """The file system refused a write for lack of room: no space (ENOSPC), over the file-size limit
    (EFBIG, ``ulimit -f``), over a quota (EDQUOT) or read-only (EROFS). ``errno`` and ``filename`` are
    set as on the ``OSError`` it replaces; the message names the file and the room left
    (:func:`prodip.base.files.writing` builds it)."""

    def __init__(self, code: int | None, message: str, filename: str) -> None:
        super().__init__(code, message, filename)
        self.message = message

    def __str__(self) -> str:
        return self.message
