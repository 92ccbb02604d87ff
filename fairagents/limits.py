"""Bounds on the shape of a request, checked before it is queued or charged.

A request's cost to others is not all in its tokens. vLLM checks every stop string
against every new token inside the engine step, which every model in the process
waits for; an output constraint is compiled into a grammar on one thread per engine,
in the order requests came, and an xgrammar compile can be neither cancelled nor
timed out. :class:`RequestLimits` bounds what drives those costs, so that any
constraint accepted compiles in well under a second: a request past a bound is
refused with an :class:`~fairagents.InvalidParameterError` naming the bound and the
field, before anything is queued or charged.

The schema walk is linear in the constraint's size, which is bounded first; regular
expressions are measured with Python's own regex parser (a stand-in for xgrammar's:
what it cannot parse is left to the engine to judge).

Examples:
    >>> from fairagents.limits import RequestLimits
    >>> limits = RequestLimits()
    >>> limits.check_sampling(stop=["\\n", "END"], logit_bias={})
    >>> limits.check_constraint({"json": {"enum": list(range(5000))}}, param="rf")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fairagents.errors.InvalidParameterError: rf: the constraint has 5000 enum and const values; the limit is 2000 ...
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fairagents.errors import InvalidParameterError

try:
    import re._parser as _sre  # Python ≥ 3.11
except ImportError:  # pragma: no cover
    import sre_parse as _sre  # type: ignore[no-redef]

__all__ = ["DEFAULT_LIMITS", "MAX_TOP_LOGPROBS", "RequestLimits"]

#: Most alternatives per output token a request may ask for (``top_logprobs``), as in OpenAI's API.
MAX_TOP_LOGPROBS = 20

# Keys whose value maps names to subschemas: entering them is not a level of nesting.
_NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The bounds a request's shape must keep. Defaults keep any accepted grammar compile ≲ 0.4 s.

    Counts are per request unless a field says otherwise; a constraint is measured as
    compact JSON. Pass them to :class:`~fairagents.Arbiter` (``limits=``); the server
    takes them from ``[server.limits]``.

    Example:
        >>> import fairagents as fa
        >>> arbiter = fa.Arbiter(limits=fa.RequestLimits(max_stop=8))
        >>> arbiter.limits.max_stop, arbiter.limits.max_logit_bias
        (8, 300)
    """

    max_stop: int = 4
    """Most stop strings (OpenAI's API allows 4)."""
    max_stop_chars: int = 256
    """Longest stop string, in characters."""
    max_logit_bias: int = 300
    """Most ``logit_bias`` entries (OpenAI's bound)."""
    max_tools: int = 128
    """Most tools."""
    max_constraint_bytes: int = 65_536
    """Largest output constraint (the schema, regex or grammar; with tools, all their parameters), in bytes."""
    max_enum_values: int = 2_000
    """Most ``enum`` and ``const`` values (and ``choice`` items), in all."""
    max_branches: int = 256
    """Most ``anyOf`` and ``oneOf`` branches, in all."""
    max_properties: int = 1_000
    """Most object properties, in all."""
    max_optional_properties: int = 128
    """Most properties of one object that are not ``required``."""
    max_depth: int = 20
    """Deepest nesting of subschemas."""
    max_pattern_chars: int = 1_000
    """Longest regular expression (a ``pattern``, a property-name pattern or a ``regex`` constraint), in characters."""
    max_total_pattern_chars: int = 4_000
    """Most characters of regular expressions, in all."""
    max_pattern_alternatives: int = 256
    """Most ``|`` alternatives in one regular expression."""
    max_repeat_product: int = 2_500
    """Largest product of the bounds of nested repeats (``(a{1,50}b?){1,50}``: 2,500) in one regular expression."""

    def check_sampling(self, *, stop: Sequence[str] | str | None, logit_bias: Any) -> None:
        """Refuse too many or too long stop strings, or too many ``logit_bias`` entries."""
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        if len(stops) > self.max_stop:
            _refuse("stop", f"{len(stops)} stop strings", self.max_stop, "max_stop")
        for s in stops:
            if isinstance(s, str) and len(s) > self.max_stop_chars:
                _refuse("stop", f"a stop string of {len(s)} characters ({_clip(s)})", self.max_stop_chars,
                        "max_stop_chars")
        if logit_bias is not None and hasattr(logit_bias, "__len__") and len(logit_bias) > self.max_logit_bias:
            _refuse("logit_bias", f"{len(logit_bias)} entries", self.max_logit_bias, "max_logit_bias")

    def check_tools(self, tools: Sequence[Any] | None) -> None:
        """Refuse too many tools, or parameters that together break a schema bound."""
        tools = list(tools or ())
        if len(tools) > self.max_tools:
            _refuse("tools", f"{len(tools)} tools", self.max_tools, "max_tools")
        functions = [t.get("function") for t in tools if isinstance(t, Mapping)]
        parameters = [f.get("parameters") for f in functions if isinstance(f, Mapping)]
        self._check_schema([p for p in parameters if p is not None], "tools", "the tools' parameters")

    def check_constraint(self, structured: Mapping[str, Any] | None, *, param: str) -> None:
        """Refuse an output constraint (vLLM's ``StructuredOutputsParams`` fields) past a bound.

        ``param`` names the request field it came from, for the error.
        """
        if not structured:
            return
        walk = self._check_schema(None, param, "the constraint", size_of=dict(structured))
        for key, value in structured.items():
            if key in ("json", "structural_tag"):
                if isinstance(value, str):
                    try:
                        value = json.loads(value)
                    except ValueError:
                        continue  # the engine refuses it
                walk.run(value)
            elif key == "regex" and isinstance(value, str):
                walk.pattern(value)
            elif key == "choice" and isinstance(value, list):
                walk.run(value, key="choice")
            # a grammar is bounded by its size alone

    def _check_schema(self, schema: Any, param: str, what: str, *, size_of: Any = None) -> _Walk:
        """Check the compact JSON size of ``size_of`` (default: ``schema``), then walk ``schema``."""
        walk = _Walk(self, param, what)
        try:
            text = json.dumps(schema if size_of is None else size_of, separators=(",", ":"), ensure_ascii=False)
        except RecursionError:
            _refuse(param, f"{what} is nested too deeply to measure", self.max_depth, "max_depth")
        except (TypeError, ValueError):
            return walk  # not JSON: the spec's own checks refuse it
        size = len(text.encode())
        if size > self.max_constraint_bytes:
            _refuse(param, f"{what} is {size} bytes", self.max_constraint_bytes, "max_constraint_bytes")
        if schema is not None:
            walk.run(schema)
        return walk


DEFAULT_LIMITS = RequestLimits()
"""The bounds the arbiter and the server keep unless told others."""


class _Walk:
    """One pass over a constraint, counting what drives a grammar's compile time."""

    def __init__(self, limits: RequestLimits, param: str, what: str) -> None:
        self.limits, self.param, self.what = limits, param, what
        self.values = self.branches = self.properties = self.pattern_chars = 0

    def run(self, root: Any, key: str | None = None) -> None:
        """Walk a schema (or, with ``key="choice"``, a list of choices)."""
        limits = self.limits
        stack: list[tuple[Any, int, str | None]] = [(root, 1, key)]
        while stack:
            node, depth, key = stack.pop()
            if depth > limits.max_depth and isinstance(node, dict | list):
                self._refuse(f"subschemas nested {depth} deep", limits.max_depth, "max_depth")
            if isinstance(node, list):
                if key == "enum" or key == "choice":
                    self._count("values", len(node), limits.max_enum_values, "enum and const values", "max_enum_values")
                elif key in ("anyOf", "oneOf"):
                    self._count("branches", len(node), limits.max_branches, "anyOf and oneOf branches", "max_branches")
                if key in ("enum", "choice", "const", "required"):
                    continue  # values, not subschemas
                stack.extend((item, depth + 1, None) for item in node)
                continue
            if not isinstance(node, dict):
                if key in ("pattern", "regex") and isinstance(node, str):
                    self.pattern(node)
                continue
            if "const" in node:
                self._count("values", 1, limits.max_enum_values, "enum and const values", "max_enum_values")
            properties = node.get("properties")
            if isinstance(properties, dict) and key not in _NAME_MAPS:
                self._count("properties", len(properties), limits.max_properties, "properties", "max_properties")
                required = node.get("required")
                named = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
                optional = sum(1 for name in properties if name not in named)
                if optional > limits.max_optional_properties:
                    self._refuse(f"an object with {optional} optional properties", limits.max_optional_properties,
                                 "max_optional_properties")
            for name, value in node.items():
                if key in _NAME_MAPS:
                    if key == "patternProperties":
                        self.pattern(name)
                    stack.append((value, depth + 1, None))  # a named subschema: one level down
                elif name in _NAME_MAPS:
                    stack.append((value, depth, name))  # the map itself is no level
                elif name == "const":
                    continue
                else:  # a subschema (items, not, ...) is a level down; a list's items are, one by one
                    stack.append((value, depth + 1 if isinstance(value, dict) else depth, name))

    def pattern(self, pattern: str) -> None:
        """Count a regular expression: its length, alternatives and nested repeats."""
        limits = self.limits
        if len(pattern) > limits.max_pattern_chars:
            self._refuse(f"a regular expression of {len(pattern)} characters ({_clip(pattern)})",
                         limits.max_pattern_chars, "max_pattern_chars")
        self._count("pattern_chars", len(pattern), limits.max_total_pattern_chars, "characters of regular expressions",
                    "max_total_pattern_chars")
        alternatives, product = _regex_shape(pattern)
        if alternatives > limits.max_pattern_alternatives:
            self._refuse(f"a regular expression with {alternatives} alternatives ({_clip(pattern)})",
                         limits.max_pattern_alternatives, "max_pattern_alternatives")
        if product > limits.max_repeat_product:
            self._refuse(f"a regular expression whose nested repeats multiply to {product} ({_clip(pattern)})",
                         limits.max_repeat_product, "max_repeat_product")

    def _count(self, counter: str, n: int, limit: int, what: str, name: str) -> None:
        total = getattr(self, counter) + n
        setattr(self, counter, total)
        if total > limit:
            self._refuse(f"{total} {what}", limit, name)

    def _refuse(self, what: str, limit: int, name: str) -> None:
        _refuse(self.param, f"{self.what} has {what}", limit, name)


def _regex_shape(pattern: str) -> tuple[int, int]:
    """The ``|`` alternatives in ``pattern`` and the largest product of nested repeat bounds (≥ 2 deep; else 0).

    Examples:
        >>> from fairagents.limits import _regex_shape
        >>> _regex_shape("^(a{1,50}b?){1,200}$"), _regex_shape("[a-z]{100000}"), _regex_shape("x|y|zz")
        ((0, 10000), (0, 0), (3, 0))
    """
    try:
        tree = _sre.parse(pattern)
    except Exception:  # noqa: BLE001 - a syntax Python lacks (or deep nesting): count what can be counted
        return pattern.count("|") + 1 if "|" in pattern else 0, 0
    alternatives = 0
    worst = 0
    stack: list[tuple[Any, int, int]] = [(tree, 1, 0)]
    while stack:
        items, product, repeats = stack.pop()
        for op, arg in items:
            if op is _sre.BRANCH:
                alternatives += len(arg[1])
                stack.extend((branch, product, repeats) for branch in arg[1])
            elif op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT, getattr(_sre, "POSSESSIVE_REPEAT", None)):
                low, high, sub = arg
                bound = max(low, 1) if high is _sre.MAXREPEAT or high == _sre.MAXREPEAT else high
                if repeats + 1 >= 2:
                    worst = max(worst, product * bound)
                stack.append((sub, product * bound, repeats + 1))
            elif op is _sre.SUBPATTERN:
                stack.append((arg[-1], product, repeats))
            elif op in (_sre.ASSERT, _sre.ASSERT_NOT):
                stack.append((arg[1], product, repeats))
            elif op is _sre.GROUPREF_EXISTS:
                stack.extend((branch, product, repeats) for branch in arg[1:] if branch is not None)
    return alternatives, worst


def _clip(text: str, limit: int = 40) -> str:
    """``text``'s repr, cut to about ``limit`` characters: errors never echo a huge value."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"… ({len(text)} characters)"


def _refuse(param: str, what: str, limit: int, name: str) -> None:
    """Raise the error for a bound passed: what the request has, the limit, and the limit's name."""
    raise InvalidParameterError(f"{param}: {what}; the limit is {limit} ({name})", param=param)
