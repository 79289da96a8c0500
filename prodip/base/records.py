"""Typed artifact records: one pattern for every JSON artifact one stage writes and another reads.

Each JSON artifact (shards ``meta.json``, ``fertility.json``, a checkpoint's ``trainer_state.json`` and
``manifest.json``, ``eval.json``, ``sft_eval.json``, the export's ``manifest.json`` and its conformance
verdict, conformance's ``report.json`` and ``speed.json``, the tokenizer's ``train_info.json``, ``prodip run``'s
``stage_times.json``, ``completions.json``, ``prodip_run.json``, ``corpus_inputs.json`` and ``summary.json``)
is a subclass of :class:`Record` defined in the module CONTRACTS.md names as its owner. The class holds:

- the fields, declared in the order the file has them (so a record written back is byte for byte what
  the writer wrote before records existed: the export manifest's hash and the conformance verdict
  depend on it), typed as far as any reader relies on them; parts read only by their owner stay
  ``dict[str, Any]``;
- ``FORMAT_VERSION`` (what :meth:`Record.write` writes), ``READS`` (the versions :meth:`Record.read`
  accepts: an old layout still read is listed here), ``MAKER`` (the command that makes the file, for
  the error message), ``REFUSED`` (old versions no longer read, and why) and the JSON layout (``INDENT``,
  ``ENSURE_ASCII``, ``SORT_KEYS``, ``TRAILING_NEWLINE``);
- exactly one writer, :meth:`Record.write` (temporary file + fsync + rename, a full disk named by
  :func:`prodip.base.files.writing`), and one reader, :meth:`Record.read` (and :meth:`Record.read_or_none`
  for done-checks, where a missing or damaged artifact means "not done").

Keys a newer writer added that this code does not declare are kept (``extra="allow"``), in their
order after the declared ones, so a read-modify-write (the verdict written into the export manifest)
never drops them; a nested part derives from :class:`RecordPart`, which keeps them the same way. A nested part whose writers order its keys in more than one way (the export card's
source entries) derives from :class:`AsWritten`, which writes the keys back in the order they were read.

Why pydantic v2 models rather than dataclasses or TypedDicts: pydantic is a core dependency already
(``prodip serve``'s FastAPI), it validates nested types with the failing field's path (``languages.bn.
train.0.n_tokens``), which is what the error must name, keeps unknown keys, and mypy understands its
models (``dataclass_transform``) so attribute access is type-checked. A dataclass would need a
hand-written validator per field and a TypedDict checks nothing at run time. Numbers a file holds as
either int or float are typed ``int | float`` (pydantic's smart union keeps ``3`` as ``3``, where a
``float`` field would write ``3.0`` and change the file's bytes).

A reader raises :class:`RecordError` (an :class:`~prodip.base.errors.InvalidInput`, so a
:class:`~prodip.base.errors.UserError`) naming the file and the field, or, for a ``format_version`` it
cannot read, the version found and the versions it reads (:class:`NewerFormat` when it is newer than all
of them: a newer prodip wrote it, and nothing may replace it as if it were damaged); a missing file is
:class:`~prodip.base.errors.MissingInput` naming the command that makes it.

    python -c "from prodip.base.records import Record; help(Record.read)"
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    StrictInt,
    ValidationError,
    model_serializer,
    model_validator,
)
from typing_extensions import Self

from prodip.base.errors import InvalidInput, MissingInput, OutputExists
from prodip.base.files import writing
from prodip.base.jsontypes import JSONObject

R = TypeVar("R", bound="Record")

#: A JSON number that may be written as an int or a float (kept as written; see the module docstring).
Number = int | float


class RecordError(InvalidInput):
    """An artifact file that is not the record it should be: not JSON, a ``format_version`` this prodip does
    not read, or a field missing or of the wrong type. The message names the file and the field."""


class NewerFormat(RecordError):
    """An artifact whose ``format_version`` is newer than every version this prodip reads: written by a newer
    prodip. Not damage: code that replaces artifacts (``--force``, ``--overwrite``) must leave it alone.

    Attributes:
        found: the ``format_version`` the file holds.
        reads: the versions this prodip reads.
    """

    def __init__(self, message: str, found: int, reads: tuple[int, ...]) -> None:
        super().__init__(message)
        self.found = found
        self.reads = reads


class Record(BaseModel):
    """Base of every typed artifact record (see the module docstring for the pattern).

    Subclasses set the class variables below and declare their fields after ``format_version``.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    #: the artifact's file name, for messages (``meta.json``)
    FILE: ClassVar[str] = ""
    #: the format_version :meth:`write` writes
    FORMAT_VERSION: ClassVar[int] = 1
    #: every format_version :meth:`read` accepts (the current one and the old layouts still read)
    READS: ClassVar[tuple[int, ...]] = (1,)
    #: the command that makes the file, named when it is missing, unreadable or of another version
    MAKER: ClassVar[str] = ""
    #: old versions no longer read -> why (said when one is found)
    REFUSED: ClassVar[dict[int, str]] = {}
    #: JSON layout of the file (kept as the writer wrote it before records existed)
    INDENT: ClassVar[int | None] = 2
    ENSURE_ASCII: ClassVar[bool] = False
    SORT_KEYS: ClassVar[bool] = False
    #: False: NaN and infinities are refused on writing (strict JSON)
    ALLOW_NAN: ClassVar[bool] = True
    TRAILING_NEWLINE: ClassVar[bool] = True

    format_version: StrictInt

    # ---- reading ---------------------------------------------------------------------------------

    @classmethod
    def _fix(cls) -> str:
        return f"; re-run {cls.MAKER}" if cls.MAKER else ""

    @classmethod
    def from_dict(cls: type[R], data: Any, source: str | os.PathLike[str] | None = None) -> R:
        """Validate ``data`` (a parsed JSON value) as this record.

        Args:
            data: the parsed file.
            source: the file it came from, named in errors (default: the class's ``FILE``).
        Raises:
            NewerFormat: a ``format_version`` above every one in ``READS`` (a :class:`RecordError`).
            RecordError: not an object, a ``format_version`` not in ``READS`` (the version found and the
                versions read are named), or a field missing or mistyped (the field's dotted path named).
        """
        where = str(source) if source is not None else cls.FILE
        if not isinstance(data, dict):
            raise RecordError(f"{where}: holds {type(data).__name__}, not a JSON object{cls._fix()}")
        version = data.get("format_version")
        if type(version) is not int or version not in cls.READS:
            reads = ", ".join(str(v) for v in cls.READS)
            if type(version) is int and version > max(cls.READS):
                made = f" (made by {cls.MAKER})" if cls.MAKER else ""
                raise NewerFormat(
                    f"{where}: format_version {version} is not one this prodip reads (reads {reads}; "
                    f"writes {cls.FORMAT_VERSION}): it is newer, written by a newer prodip{made}; upgrade prodip "
                    "to read it",
                    found=version,
                    reads=cls.READS,
                )
            why = cls.REFUSED.get(version) if type(version) is int else None
            raise RecordError(
                f"{where}: format_version {version!r} is not one this prodip reads (reads {reads}; "
                f"writes {cls.FORMAT_VERSION}){f': {why}' if why else ''}{cls._fix()}"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise RecordError(f"{where}: {describe_errors(err)}{cls._fix()}") from None

    @classmethod
    def read(cls: type[R], path: str | os.PathLike[str]) -> R:
        """Read and validate ``path`` (see :meth:`from_dict`).

        Raises:
            MissingInput: no such file (the command that makes it named).
            RecordError: not UTF-8 JSON, or not this record (file and field named).
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            made = f" (made by {cls.MAKER})" if cls.MAKER else ""
            raise MissingInput(f"{path}: not found{made}") from None
        except UnicodeDecodeError as err:
            raise RecordError(f"{path}: not UTF-8 text ({err}){cls._fix()}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise RecordError(f"{path}: not valid JSON ({err}){cls._fix()}") from None
        return cls.from_dict(data, path)

    @classmethod
    def read_or_none(cls: type[R], path: str | os.PathLike[str]) -> R | None:
        """:meth:`read`, or None when the file is missing, damaged or not this record (for done-checks,
        where such an artifact means "not done"; the reason is not logged)."""
        try:
            return cls.read(path)
        except (MissingInput, RecordError, OSError):
            return None

    # ---- writing ---------------------------------------------------------------------------------

    def to_dict(self) -> JSONObject:
        """The record as the JSON object the file holds: declared fields in order (those never set, and
        left at their default, are left out as the writer left them out), then extra keys."""
        out: JSONObject = self.model_dump(mode="python", exclude_unset=True)
        out.setdefault("format_version", self.format_version)
        return out

    def to_json(self) -> str:
        """The file's text (layout: the class's ``INDENT``, ``ENSURE_ASCII``, ``SORT_KEYS``, ``TRAILING_NEWLINE``)."""
        text = json.dumps(
            self.to_dict(),
            indent=self.INDENT,
            ensure_ascii=self.ENSURE_ASCII,
            sort_keys=self.SORT_KEYS,
            allow_nan=self.ALLOW_NAN,
        )
        return text + "\n" if self.TRAILING_NEWLINE else text

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the record to ``path`` atomically: a temporary file beside it, fsync, rename.

        Returns:
            ``path`` as a Path.
        Raises:
            WriteFailed: no room (disk full, ``ulimit -f``, quota, read-only), naming the file; the earlier
                file at ``path``, if any, is unchanged.
        """
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
        text = self.to_json()
        with writing(tmp, shown_as=path, remove_on_error=True):
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        return path


# ---- replacing artifacts ---------------------------------------------------------------------


def refuse_newer(record: type[Record], path: str | os.PathLike[str], *, action: str, instead: str) -> None:
    """Refuse to replace or delete ``path`` when it holds ``record`` written by a newer prodip.

    Code that deletes or rewrites an existing artifact (``--overwrite``, ``--force``, a stage rerun) calls
    this first: a file of a newer ``format_version`` is not damage, and an older prodip must leave it alone.
    A missing file, an older version, or a damaged one passes (the caller's own rules decide those).

    Args:
        record: the artifact's record class (its ``read`` decides the version).
        path: the artifact file.
        action: what would replace it, for the message (``"--overwrite"``, ``"prodip tokenizer audit"``).
        instead: what the user can do instead (``"choose another out_dir"``).
    Raises:
        OutputExists: ``path`` has a ``format_version`` newer than every one ``record`` reads; the message (one
            line) names the file, the version found and the versions read. Nothing is deleted.
    """
    try:
        record.read(path)
    except NewerFormat as err:
        raise OutputExists(
            f"{path}: written by a newer prodip (format_version {err.found}; this prodip reads "
            f"{', '.join(map(str, err.reads))}); {action} does not replace it, nothing was removed. "
            f"Upgrade prodip, or {instead}"
        ) from None
    except (MissingInput, RecordError, OSError):
        return


def check_replaceable_dir(
    out: str | os.PathLike[str],
    *,
    what: str,
    marker: str,
    records: Iterable[type[Record]],
    replace: bool,
    option: str,
    holds: str = "",
    instead: str = "choose another out_dir",
) -> bool:
    """Check, before anything is written, that the folder ``out`` may be replaced by a new ``what``.

    The folder is deleted and a new one renamed into its place only when it is one prodip made (it holds
    ``marker``), the user asked for it (``replace``), and no record in it was written by a newer prodip.

    Args:
        out: the artifact folder (a shards dir, a tokenizer dir).
        what: the artifact, for messages (``"shards dir"``).
        marker: the file whose presence makes a non-empty folder one prodip made (``meta.json``).
        records: the records kept in the folder; each at ``out / record.FILE`` is checked by :func:`refuse_newer`.
        replace: the user asked to replace an existing one (``--overwrite true``).
        option: how the user asks for that, for the message (``"--overwrite true"``).
        holds: what an earlier one is called in "already holds ..." (default: ``a {what}``).
        instead: what the user can do instead, for the messages.
    Returns:
        True when ``out`` holds an earlier ``what`` that will be replaced; False when it is absent or empty.
    Raises:
        OutputExists (one line, nothing deleted): ``out`` is a symbolic link or a file; is not empty and holds
            no ``marker`` (not a prodip ``what``: never deleted, even with ``option``); holds a record of a
            newer prodip (file and version named); or holds a ``what`` and ``replace`` is false.
    """
    out = Path(out)
    if out.is_symlink():
        raise OutputExists(f"{out}: is a symbolic link; give the real folder path ({instead})")
    if out.exists() and not out.is_dir():
        raise OutputExists(f"{out}: is a file, not a {what}; {instead}")
    if not out.is_dir() or not any(out.iterdir()):
        return False
    if not (out / marker).is_file():
        raise OutputExists(
            f"{out}: is not empty and is not a {what} (no {marker}); {option} never deletes a folder prodip did "
            f"not make. Empty it yourself, or {instead}"
        )
    for record in records:
        refuse_newer(record, out / record.FILE, action=option, instead=instead)
    if not replace:
        raise OutputExists(f"{out}: already holds {holds or 'a ' + what}; {instead} or pass {option}")
    return True


def describe_errors(err: ValidationError, limit: int = 3) -> str:
    """pydantic's errors as ``field a.b.0: message; ...`` (the first ``limit``, then how many more)."""
    items = err.errors()
    parts = []
    for e in items[:limit]:
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        got = "" if e["type"] == "missing" else f" (got {_short(e.get('input'))})"
        parts.append(f"field {loc!r}: {e['msg'].lower()}{got}")
    more = f"; and {len(items) - limit} more" if len(items) > limit else ""
    return "; ".join(parts) + more


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class RecordPart(BaseModel):
    """Base of every nested part of a record (an object inside the file: a manifest's variant entry, a shard
    entry, the verdict, ...): keys a newer writer adds that this code does not declare are kept
    (``extra="allow"``), after the declared ones, so a read-modify-write never drops them.

    A part adds its own settings to these (``model_config = ConfigDict(validate_assignment=True)`` merges).
    """

    model_config = ConfigDict(extra="allow")

    def to_dict(self) -> JSONObject:
        """The part as the JSON object the file holds (fields never set left out)."""
        out: JSONObject = self.model_dump(mode="python", exclude_unset=True)
        return out


class AsWritten(RecordPart):
    """A part of a record (a nested object) written back as it was read: its keys in the order the file had
    them, and under the names the file spells them (a field whose key is a Python keyword, ``class``, is
    declared as ``class_`` with ``alias="class"``).

    For parts whose writers put the keys in more than one order, so that no declaration order reproduces every
    file: the card's source entries, copied from whichever shards ``meta.json``, checkpoint or tokenizer
    recorded them. Made in code, a part keeps the order of the keywords it was given (``model_construct``: the
    declared order). Two parts are equal when their fields and extra keys are, whatever order they were read in.
    """

    model_config = ConfigDict(populate_by_name=True)

    _keys: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_key_order(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        part = handler(data)
        if isinstance(data, dict) and part is not data:
            part._keys = tuple(data)
        return part

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> JSONObject:
        dumped: JSONObject = handler(self)
        fields = type(self).model_fields
        out = {(fields[k].alias or k) if k in fields else k: v for k, v in dumped.items()}
        first = {k: out[k] for k in self._keys if k in out}
        return {**first, **{k: v for k, v in out.items() if k not in first}}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AsWritten):
            return NotImplemented
        return (
            type(self) is type(other)
            and self.__dict__ == other.__dict__
            and (self.__pydantic_extra__ or {}) == (other.__pydantic_extra__ or {})
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like every pydantic model
