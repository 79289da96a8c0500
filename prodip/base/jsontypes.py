"""Types for values that are genuinely arbitrary JSON or TOML, and the narrowing helpers that read them.

A value with a known shape is a record (``prodip.base.records``), a config dataclass or a TypedDict;
these types are for the rest: a file another tool wrote and prodip only passes on or reads a few keys of
(``tokenizer.json``, a model's ``config.json``, a JSON schema, an HTTP body from another server), and a
pipeline file's tables before their config class has checked them. Unlike a dict of ``Any``, mypy makes
a reader narrow such a value before using it: :func:`obj`, :func:`arr` and :func:`text` narrow one value
and raise ``ValueError`` naming where it was read when it is not the kind expected.

    python -c "from prodip.base.jsontypes import obj; print(obj({'a': 1}, where='x'))"
"""

from __future__ import annotations

import datetime
from typing import Union

from pydantic import JsonValue

#: any JSON value: null, true/false, a number, a string, an array or an object of JSON values
#: (pydantic's recursive ``JsonValue``: mypy checks it, and a pydantic field of this type validates it)
JSONValue = JsonValue

#: a JSON object
JSONObject = dict[str, JSONValue]

#: any TOML value as ``tomllib`` reads it (TOML has no null; dates and times are ``datetime`` values)
TOMLValue = Union[
    str, int, float, bool, datetime.datetime, datetime.date, datetime.time, list["TOMLValue"], dict[str, "TOMLValue"]
]

#: a TOML table (or a whole TOML document) as ``tomllib`` reads it
TOMLTable = dict[str, TOMLValue]


def obj(value: object, *, where: str) -> JSONObject:
    """``value`` as a JSON object.

    Raises:
        ValueError: ``value`` is not a dict (``where`` names the file and key it was read from).
    """
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a JSON object, found {type(value).__name__}")
    return value


def arr(value: object, *, where: str) -> list[JSONValue]:
    """``value`` as a JSON array.

    Raises:
        ValueError: ``value`` is not a list (``where`` names the file and key it was read from).
    """
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a JSON array, found {type(value).__name__}")
    return value


def text(value: object, *, where: str) -> str:
    """``value`` as a JSON string.

    Raises:
        ValueError: ``value`` is not a str (``where`` names the file and key it was read from).
    """
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a JSON string, found {type(value).__name__}")
    return value


def integer(value: object, *, where: str) -> int:
    """``value`` as a JSON integer (``true``/``false`` are not integers).

    Raises:
        ValueError: ``value`` is not an int (``where`` names the file and key it was read from).
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{where}: expected an integer, found {type(value).__name__} {value!r}")
    return value
