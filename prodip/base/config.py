"""Stage configs: dataclasses filled from TOML files and command-line flags.

Every stage has one run-config dataclass whose fields are declared with :func:`opt`, which
records a help text (with units). This module turns such a dataclass into ``--kebab-case``
argparse flags, reads a TOML table into it (unknown keys and wrong types are errors naming the
key), lets flags given on the command line override the file, and writes the resolved config
back as TOML next to the stage's output.

    python -c "from prodip.base.config import dump_toml; print(dump_toml({'train': {'lr': 3e-4}}))"
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

import difflib

import tomli_w

from prodip.base.errors import ConfigError, InvalidInput
from prodip.base.files import raise_for_room
from prodip.base.jsontypes import TOMLTable
from prodip.base.layout import COMMAND_TABLES, DEFAULT_OUT_DIR, TABLES, TOP_LEVEL_TABLE_KEYS, has_sft, stage_defaults

T = TypeVar("T", bound="DataclassInstance")  # a config dataclass


def opt(
    default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None, choices: tuple[Any, ...] | None = None
) -> Any:
    """Declare a config field with its help text (state units in the text).

    Args:
        default: the default value (immutable); use ``factory`` for dicts and lists.
        help: one line shown by ``--help``; say the unit (tokens, seconds, bytes, ...).
        factory: zero-argument callable making a mutable default.
        choices: allowed values, checked on load.
    """
    meta = {"help": help, "choices": choices}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def usable_cpus() -> int:
    """Logical CPUs this process may run on (its affinity mask where the OS has one, else ``os.cpu_count``)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def check_threads(where: str, value: int) -> None:
    """A thread-count option: 0 (the library's default) up to :func:`usable_cpus`.

    ONNX Runtime and torch take any count and start that many threads: 100000 intra-op threads made
    ``prodip serve`` allocate 16 GB and never answer. More threads than usable CPUs only contend.

    Raises:
        InvalidInput: ``value`` < 0 or > the usable CPUs (``where`` names the option).
    """
    cpus = usable_cpus()
    if not 0 <= value <= cpus:
        raise InvalidInput(
            f"{where} must be in [0, {cpus}] (0 = the library's default; this machine lets the process use "
            f"{cpus} CPUs), got {value}"
        )


def _field_types(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` (from TOML or a flag string already parsed) against type ``tp``.

    Ints are accepted where floats are expected; nothing else is converted silently.

    Raises:
        ConfigError: naming ``where`` (e.g. ``"configs/demo.toml [train] lr"``) and the expected type.
    """
    tp, optional = _strip_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: a value is required (expected {_type_name(tp)})")
    origin = typing.get_origin(tp)
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp) or (str, Any)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table like {{bn = 0.6, en = 0.4}}, got {value!r}")
        return {coerce(k, key_tp, f"{where}.{k}"): coerce(v, val_tp, f"{where}.{k}") for k, v in value.items()}
    if origin in (list, tuple):
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        items = [coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int and isinstance(value, bool):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if not isinstance(value, tp):
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    return value


def from_dict(cls: type[T], data: Mapping[str, object], *, source: str) -> T:
    """Build dataclass ``cls`` from a mapping, refusing unknown keys and wrong types.

    Args:
        cls: a dataclass whose fields were declared with :func:`opt`.
        data: key -> value, e.g. one TOML table.
        source: where ``data`` came from, used in messages (``"configs/demo.toml [train]"``).

    Raises:
        ConfigError: an unknown key (with the closest known names), a wrong type, a value not
            among the field's choices, or a required field missing.
    """
    hints = _field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; known keys: {', '.join(fields)}"
            raise ConfigError(f"{source}: unknown key {key!r}{hint}")
        where = f"{source} {key}"
        kwargs[key] = coerce(value, hints[key], where)
        choices = fields[key].metadata.get("choices")
        if choices and kwargs[key] not in choices:
            raise ConfigError(f"{where}: {kwargs[key]!r} is not one of {', '.join(map(str, choices))}")
    try:
        return cls(**kwargs)
    except TypeError as err:  # a required field is missing
        raise ConfigError(f"{source}: {err}") from None
    except ValueError as err:  # __post_init__ validation
        raise ConfigError(f"{source}: {err}") from None


_DICT_ENTRY_SPLIT = re.compile(r",(?=\s*[^\s,=]+\s*=)")  # a comma that starts the next `key=`


def _parse_flag(text: str, tp: Any, flag: str) -> Any:
    """Parse one flag string: dicts as ``bn=0.6,en=0.4``, lists as ``a,b``, bools as true/false.

    A dict entry ends only at a comma followed by the next ``key=``, so a value may hold commas
    (``en=It was cold, and``) and a list value may be given inline (``bn=a.txt,b.txt,en=c.txt``).
    A key given twice merges its lists (``en=a,en=b`` is ``en=a,b``); for any other value type it
    is an error (never a silent last-one-wins).
    """
    tp, optional = _strip_optional(tp)
    if optional and text.lower() in ("none", "null", ""):
        return None
    origin = typing.get_origin(tp)
    try:
        if origin is dict:
            _, val_tp = typing.get_args(tp)
            out: dict[str, object] = {}
            for part in filter(None, (p.strip() for p in _DICT_ENTRY_SPLIT.split(text))):
                k, sep, v = part.partition("=")
                if not sep:
                    raise InvalidInput(f"{part!r} has no '='")
                k, value = k.strip(), _parse_flag(v.strip(), val_tp, flag)
                if k in out and isinstance(value, list) and isinstance(prev := out[k], list):
                    value = prev + value  # repeated language key: both lists of inputs
                elif k in out:
                    raise InvalidInput(f"key {k!r} given twice")
                out[k] = value
            return out
        if origin in (list, tuple):
            (item_tp, *_) = typing.get_args(tp) or (str,)
            return [_parse_flag(p.strip(), item_tp, flag) for p in text.split(",") if p.strip()]
        if tp is bool:
            low = text.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise InvalidInput("expected true or false")
            return low in ("true", "1", "yes")
        if tp in (int, float, str):
            return tp(text)
        return text
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{flag}: cannot read {text!r} as {_type_name(tp)} ({err})") from None


def add_arguments(
    parser: argparse.ArgumentParser, cls: type, *, skip: tuple[str, ...] = (), section: str | None = None
) -> None:
    """Add one ``--kebab-case`` flag per field of dataclass ``cls`` to ``parser``.

    Flags default to "not given" (``argparse.SUPPRESS``) so that :func:`resolve` can tell a
    flag from a file value. Dicts are written ``key=value,key=value``, lists ``a,b``. With
    ``section`` (the table :func:`resolve` reads), the defaults shown are the ones it applies: the
    run layout's paths (``runs/demo/tokenizer``), not the dataclass's.
    """
    hints = _field_types(cls)
    layout = _layout_paths(cls, section, None) if section else {}
    group = parser.add_argument_group(f"{cls.__name__} options (override the config file)")
    for f in _own_fields_first(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        )
        default = layout.get(f.name, default)
        help_text = f.metadata.get("help", "").replace("%", "%%")  # argparse %-formats help: "10%" crashed --help
        if isinstance(default, dict):
            shown = ",".join(f"{k}={v}" for k, v in default.items()) or "none"
        elif isinstance(default, (list, tuple)):
            shown = ",".join(map(str, default)) or "none"
        else:
            shown = str(default)
        shown = shown.replace("%", "%%")
        parse = functools.partial(_parse_flag, tp=hints[f.name], flag=flag)
        if _strip_optional(hints[f.name])[0] is bool:  # `--force` alone means true; `--force false` too
            group.add_argument(
                flag,
                dest=f.name,
                default=argparse.SUPPRESS,
                nargs="?",
                const=True,
                metavar="BOOL",
                type=parse,
                help=f"{help_text} (default: {shown})",
            )
            continue
        group.add_argument(
            flag,
            dest=f.name,
            default=argparse.SUPPRESS,
            metavar=_metavar(hints[f.name]),
            type=parse,
            help=help_text if "default" in help_text else f"{help_text} (default: {shown})",
        )


def _own_fields_first(cls: type) -> list[dataclasses.Field[Any]]:
    """Dataclass ``cls``'s fields, those it declares before those it inherits from a shared part
    (``prodip.base.sources.SourceOptions``, ...): ``--help`` lists a stage's own options first."""
    inherited = {f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}
    fields = dataclasses.fields(cls)
    return [f for f in fields if f.name not in inherited] + [f for f in fields if f.name in inherited]


def _metavar(tp: Any) -> str:
    tp, _ = _strip_optional(tp)
    origin = typing.get_origin(tp)
    if origin is dict:
        return "K=V,.."
    if origin in (list, tuple):
        return "A,B,.."
    return {int: "INT", float: "FLOAT", bool: "BOOL", str: "STR"}.get(tp, "VALUE")


def read_toml(path: str | os.PathLike[str]) -> TOMLTable:
    """Read a TOML file.

    Raises:
        ConfigError: the file is missing or not valid TOML (with the parser's line and column).
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data: TOMLTable = tomllib.load(fh)  # tomli on 3.10: untyped to mypy
            return data
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder; give a TOML file such as configs/demo.toml") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None


def resolve(
    cls: type[T],
    args: argparse.Namespace | None = None,
    *,
    toml_path: str | None = None,
    section: str | None = None,
    base: Mapping[str, object] | None = None,
) -> T:
    """Resolve a stage config: dataclass defaults < ``base`` < TOML table < command-line flags.

    Args:
        cls: the stage's config dataclass.
        args: parsed flags (only flags the user gave are present, see :func:`add_arguments`).
        toml_path: optional TOML file; ``section`` names its table (``None`` = the top level).
        base: values filled in by the caller before the file (e.g. paths chosen by ``prodip run``).
            Without it, the paths ``prodip run`` would use for ``section`` (``prodip.base.layout``)
            come first: under the file's top-level ``out_dir`` (a pipeline file such as
            ``configs/demo.toml``), or else under ``runs/demo`` for the path fields whose default is
            a path (not for those left empty or derived from another input).

    Raises:
        ConfigError: see :func:`from_dict`; a table that no stage reads (a misspelt ``[trian]``),
            as ``prodip run`` refuses it; a missing table ``section`` is fine (defaults).
    """
    data: dict[str, object] = dict(base or {})
    source = cls.__name__
    doc = read_toml(toml_path) if toml_path else {}
    if section and toml_path:
        known = (*TABLES, *COMMAND_TABLES)
        unknown = [k for k, v in doc.items() if isinstance(v, dict) and k not in (*known, *TOP_LEVEL_TABLE_KEYS)]
        if unknown:
            raise ConfigError(f"{toml_path}: unknown table [{unknown[0]}]; known tables: {', '.join(known)}")
    if base is None and section:
        data = {**_layout_paths(cls, section, doc.get("out_dir"), chat=has_sft(doc))}
    if toml_path:
        table = doc.get(section, {}) if section else doc
        if not isinstance(table, dict):
            raise ConfigError(f"{toml_path}: [{section}] must be a table")
        data.update(table)
        source = f"{toml_path} [{section}]" if section else str(toml_path)
    obj = from_dict(cls, data, source=source)  # validate file values first, with the file named
    if args is not None:
        names = {f.name for f in dataclasses.fields(cls)}
        flags = {k: v for k, v in vars(args).items() if k in names}
        if flags:
            obj = from_dict(cls, {**data, **flags}, source=f"{source} + command-line flags")
    return obj


def _layout_paths(cls: type, section: str, out_dir: object, chat: bool = False) -> dict[str, str]:
    """The paths ``prodip run`` gives table ``section``: under ``out_dir`` (a pipeline file's), else
    under ``runs/demo`` for the fields whose dataclass default is a non-empty path string."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if isinstance(out_dir, str):
        return {k: v for k, v in stage_defaults(Path(out_dir), chat=chat).get(section, {}).items() if k in fields}
    return {
        k: v
        for k, v in stage_defaults(DEFAULT_OUT_DIR).get(section, {}).items()
        if k in fields and isinstance(fields[k].default, str) and fields[k].default
    }


def to_dict(obj: Any) -> dict[str, object]:
    """A dataclass as a plain dict that TOML and JSON can hold (None values dropped for TOML)."""
    return dataclasses.asdict(obj)


def dump_toml(data: Mapping[str, object]) -> str:
    """Serialise a mapping to TOML with ``tomli_w``; ``None`` values are left out (TOML has no null)."""

    def clean(value: object) -> object:
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items() if v is not None}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        if isinstance(value, Path):
            return str(value)
        return value

    return tomli_w.dumps({str(k): clean(v) for k, v in data.items() if v is not None})  # clean(data), as a dict


def toml_roundtrip(data: Mapping[str, object]) -> TOMLTable:
    """``data`` as it reads back from a TOML file (tuples become lists, ``None`` values vanish)."""
    out: TOMLTable = tomllib.loads(dump_toml(data))
    return out


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` via ``path.tmp`` + fsync + rename, so readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except Exception as err:
        tmp.unlink(missing_ok=True)
        raise_for_room(err, tmp, shown_as=path)  # a full disk: one line naming the file; the old one stays
        raise
