"""JSON text read as JSON means it: every number one Python holds, and nothing JSON lacks.

Python's :func:`json.loads` reads ``NaN``, ``Infinity`` and ``-Infinity``, which are not
JSON; reads a literal past the doubles (``1e999``) as an infinity; and raises a bare
:class:`ValueError` for an integer of more digits than Python converts from text
(``sys.get_int_max_str_digits()``, 4,300 by default). :func:`loads` refuses the three
with a :class:`NumberError` that says where in the document the number is, so that a
client's error can name the field. Only a document that holds such a number is read a
second time, to find it; any other costs what :func:`json.loads` costs.

Examples:
    >>> from fairagents._json import NumberError, loads
    >>> loads('{"a": [1, 2.5, 1e-400]}')
    {'a': [1, 2.5, 0.0]}
    >>> try:
    ...     loads('{"a": [{"seed": 1}, {"seed": ' + "9" * 4301 + '}]}')
    ... except NumberError as err:
    ...     print(err.loc, err)
    ('a', 1, 'seed') an integer of 4301 digits is longer than the 4300 digits a number may have
    >>> loads('{"t": NaN}')
    Traceback (most recent call last):
    ...
    fairagents._json.NumberError: NaN is not valid JSON (JSON has no NaN or Infinity)
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from fairagents.errors import InvalidParameterError

__all__ = ["NumberError", "loads"]

_CONSTANTS = frozenset({"NaN", "Infinity", "-Infinity"})


class NumberError(InvalidParameterError):
    """A number in JSON text that JSON or Python cannot take; :attr:`loc` is where it is."""

    def __init__(self, literal: str, loc: tuple[str | int, ...]) -> None:
        super().__init__(_why(literal))
        self.literal = literal
        """The number as written."""
        self.loc = loc
        """The keys and indices that lead to it from the top of the document (``()``: the document itself)."""


def loads(text: str | bytes) -> Any:
    """Decode JSON text; a number JSON or Python cannot take is a :class:`NumberError`.

    Raises :class:`json.JSONDecodeError` for text that is not JSON, :class:`UnicodeError`
    for text that is not valid Unicode (bytes in no UTF, or a lone surrogate such as
    ``"\\ud800"``), and :class:`RecursionError` for nesting too deep to read.
    """
    try:
        data = json.loads(text, parse_constant=_not_json)
    except (json.JSONDecodeError, UnicodeError):
        raise
    except ValueError:  # a constant, or an integer past the digits Python converts
        data = _located(text)
    try:
        json.dumps(data, ensure_ascii=False, allow_nan=False).encode()  # raises for an infinity and a lone surrogate
    except UnicodeError:
        raise
    except ValueError:  # an infinity: a literal past the doubles
        data = _located(text)
    return data


class _Unread:
    """What the second reading puts in place of a number it cannot take."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _not_json(literal: str) -> Any:
    raise ValueError(f"{literal} is not JSON")


def _located(text: str | bytes) -> Any:
    """Read ``text`` again, numbers it cannot take marked; raise for the first in document order.

    A marked number that a later duplicate key replaced is gone from the document, as it
    would be had it been readable; a constant is refused wherever it was.
    """
    made: list[_Unread] = []

    def mark(literal: str) -> _Unread:
        made.append(_Unread(literal))
        return made[-1]

    def integer(literal: str) -> int | _Unread:
        try:
            return int(literal)
        except ValueError:
            return mark(literal)

    def double(literal: str) -> float | _Unread:
        value = float(literal)
        return mark(literal) if math.isinf(value) else value

    data = json.loads(text, parse_int=integer, parse_float=double, parse_constant=mark)
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while made and stack:
        node, loc = stack.pop()
        if isinstance(node, _Unread):
            raise NumberError(node.literal, loc)
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack.extend((value, (*loc, key)) for key, value in reversed(list(items)))  # first in the document first
    constants = [m.literal for m in made if m.literal in _CONSTANTS]
    if constants:
        raise NumberError(constants[0], ())
    return data


def _why(literal: str) -> str:
    if literal in _CONSTANTS:
        return f"{literal} is not valid JSON (JSON has no NaN or Infinity)"
    digits = literal.removeprefix("-")
    if digits.isdigit():
        return (f"an integer of {len(digits)} digits is longer than the {sys.get_int_max_str_digits()} digits "
                "a number may have")
    shown = literal if len(literal) <= 24 else f"{literal[:12]}…{literal[-8:]} ({len(literal)} characters)"
    return f"{shown} is past the range of a number (±1.8e308)"
