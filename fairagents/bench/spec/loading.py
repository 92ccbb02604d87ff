"""Reading scenario files: built-in names or YAML files, validated, with errors that name the field and the line.

:func:`load_scenario` parses the YAML keeping each node's line (YAML 1.2 booleans and
floats, no duplicate keys, no alias inside itself), validates it into a
:class:`~fairagents.bench.spec.Scenario`, reports every problem as ``file:line: field.path:
message`` in one :class:`~fairagents.bench.spec.ScenarioError`, and reads the files it
names: lengths files and the trace.
The built-in scenarios are the YAML files of ``fairagents/bench/scenarios``
(:func:`builtin_scenarios`); :func:`scenario_json_schema` is the schema of the format.

Examples:
    >>> from fairagents.bench.spec import load_scenario
    >>> scenario = load_scenario("vtc-overload")
    >>> scenario.name, sorted(scenario.apps)
    ('vtc-overload', ['client'])
"""

from __future__ import annotations

import functools
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fairagents.bench.spec.base import ScenarioError, ScenarioProblem
from fairagents.bench.spec.building import _trace_rows
from fairagents.bench.spec.distributions import EmpiricalLength, MixtureLength, _resolve
from fairagents.bench.spec.models import Scenario
from fairagents.errors import InvalidParameterError

__all__ = ["builtin_scenarios", "load_scenario", "scenario_json_schema"]


def _scenarios_dir() -> Path:
    return Path(str(resources.files("fairagents.bench") / "scenarios"))


def builtin_scenarios() -> dict[str, str]:
    """The built-in scenarios: name → description, sorted by name.

    Examples:
        >>> from fairagents.bench.spec import builtin_scenarios
        >>> {"vtc-overload", "exfairs-1", "hmas-stress", "duet"} <= set(builtin_scenarios())
        True
    """
    return {path.stem: load_scenario(path).description.strip() for path in sorted(_scenarios_dir().glob("*.yaml"))}


def load_scenario(source: str | os.PathLike[str]) -> Scenario:
    """A scenario from a built-in name (:func:`builtin_scenarios`) or a YAML file.

    Raises:
        ScenarioError: a missing or unreadable file, a YAML syntax error, or a field that is
            missing, unknown, of the wrong type or out of range, with the file, the field path
            and the line (``file.yaml:7: apps.chat.agents.bot.arrival.rate: ...``); a bad row
            of a lengths file or of the trace names that file and its line too.

    Examples:
        >>> import tempfile, pathlib
        >>> from fairagents.bench.spec import load_scenario
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "tiny.yaml"
        >>> _ = path.write_text('''
        ... name: tiny
        ... duration: 10
        ... models: {chat: {}}
        ... apps:
        ...   shop:
        ...     agents:
        ...       bot: {model: chat, arrival: {process: poisson, rate: -1}, prompt: 64, output: 16}
        ... ''')
        >>> load_scenario(path)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        fairagents.bench.spec.base.ScenarioError: ...tiny.yaml:8: apps.shop.agents.bot.arrival.rate: Input should be ...
    """
    if isinstance(source, str) and source in _builtin_names():
        path = _scenarios_dir() / f"{source}.yaml"
    else:
        path = Path(source)
        if not path.is_file():
            if isinstance(source, str) and not path.suffix and os.sep not in source:
                raise ScenarioError(f"unknown scenario {source!r}: not a built-in ({', '.join(_builtin_names())}) "
                                    f"and no such file", source=source)
            raise ScenarioError(f"scenario file not found: {path}", source=str(path))
    label = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ScenarioError(f"cannot read scenario file {path}: {err.strerror or err}", source=label) from None
    except UnicodeDecodeError as err:
        line = path.read_bytes()[:err.start].count(b"\n") + 1
        raise ScenarioError.of(label, [ScenarioProblem("", line, f"not UTF-8 text (byte {err.start})")]) from None
    root, data = _parse_yaml(text, label)
    if not isinstance(data, dict):
        raise ScenarioError.of(label, [ScenarioProblem("", 1, "a scenario file must be a mapping of fields")])
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError.of(label, _problems(err, root)) from None
    scenario._base = path.resolve().parent
    missing = [(loc, p) for loc, p in _files(scenario) if not _resolve(p, scenario._base).is_file()]
    if missing:
        raise ScenarioError.of(label, [ScenarioProblem(*_locate(root, loc), f"file not found: {p}")
                                       for loc, p in missing])
    unreadable = []
    for loc, spec in _lengths_files(scenario):
        try:
            spec.distribution(scenario._base)
        except InvalidParameterError as err:
            unreadable.append(ScenarioProblem(*_locate(root, (*loc, "path")), str(err)))
    if unreadable:
        raise ScenarioError.of(label, unreadable)
    _trace_rows(scenario)  # its own ScenarioError: the trace file and the row's line
    return scenario


@functools.cache
def _builtin_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in _scenarios_dir().glob("*.yaml")))


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 booleans and floats.

    ``on``, ``off``, ``yes`` and ``no`` stay strings; ``2e-5`` and ``1e6`` are numbers (YAML
    1.1, PyYAML's, wants a dot and a signed exponent, and reads them as strings).
    """


_BOOL, _FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
# YAML 1.2's core schema, less its integers (PyYAML's int resolver reads those): a dot or an exponent.
_Loader.add_implicit_resolver(_FLOAT, re.compile(r"""^(?:
    [-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9]+[eE][-+]?[0-9]+
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.VERBOSE), list("-+0123456789."))


_MAX_NODES = 100_000
"""Most values a scenario file may hold once its aliases are expanded (a hand-written one holds hundreds)."""


def _parse_yaml(text: str, label: str) -> tuple[yaml.Node | None, Any]:
    loader = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is not None:
            _check_tree(node, label)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        what = " ".join(str(x) for x in (err.context, err.problem) if x)
        raise ScenarioError.of(label, [ScenarioProblem("", mark.line + 1 if mark else None,
                                                       f"YAML syntax error: {what}")]) from None
    except yaml.YAMLError as err:
        raise ScenarioError.of(label, [ScenarioProblem("", None, f"YAML error: {err}")]) from None
    except RecursionError:
        raise ScenarioError.of(label, [ScenarioProblem("", None, "YAML nested too deeply")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    return node, data


def _check_tree(root: yaml.Node, label: str) -> None:
    """Refuse duplicate keys, an alias inside the value it names, and aliases that expand past ``_MAX_NODES``.

    An alias makes a node appear again, so the tree is a graph: each node is visited once,
    and its size once expanded is counted from its children's.
    """
    sizes: dict[int, int] = {}  # id of a node → values below it, aliases expanded
    open_: set[int] = set()  # nodes being visited: meeting one again is a cycle

    def visit(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_:
            raise ScenarioError.of(label, [ScenarioProblem("", node.start_mark.line + 1,
                                                           "a YAML alias refers to a value that contains it")])
        open_.add(id(node))
        size = 1
        if isinstance(node, yaml.MappingNode):
            keys: set[str] = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if key.value in keys:
                        raise ScenarioError.of(label, [ScenarioProblem(key.value, key.start_mark.line + 1,
                                                                       f"duplicate key {key.value!r}")])
                    keys.add(key.value)
                size += visit(key) + visit(value)
        elif isinstance(node, yaml.SequenceNode):
            size += sum(visit(item) for item in node.value)
        if size > _MAX_NODES:
            message = f"YAML aliases expand this value past {_MAX_NODES:,} values"
            raise ScenarioError.of(label, [ScenarioProblem("", node.start_mark.line + 1, message)])
        open_.discard(id(node))
        sizes[id(node)] = size
        return size

    visit(root)


def _problems(err: ValidationError, root: yaml.Node | None) -> list[ScenarioProblem]:
    """Pydantic's errors as problems with field paths and lines, the most specific of each field first."""
    found: dict[str, tuple[ScenarioProblem, bool]] = {}
    for e in err.errors(include_url=False):
        ctx = e.get("ctx") or {}
        loc = tuple(e["loc"]) + tuple(ctx.get("loc", ()))
        path, line = _locate(root, loc, missing=e["type"] == "missing")
        message = ctx["message"] if e["type"] == "scenario" else e["msg"]
        value = e.get("input")
        if e["type"] not in ("missing", "scenario", "extra_forbidden") and isinstance(value, int | float | str):
            message += f" (got {value!r})"
        if path not in found or (found[path][1] and not _type_error(e)):
            found[path] = (ScenarioProblem(path, line, message), _type_error(e))
    # A union reports each alternative: keep the deepest field a value reached and, at one
    # field, an error of the alternative of the value's type over "not a valid <type>".
    kept = [p for path, (p, _) in found.items() if not (path and any(o.startswith(f"{path}.") for o in found))]
    return sorted(kept, key=lambda p: p.line or 0)


def _type_error(error: Any) -> bool:
    """Whether pydantic refused a value for its type: in a union, the alternatives the value was not meant for."""
    return str(error["type"]).endswith(("_type", "_parsing"))


def _locate(root: yaml.Node | None, loc: tuple[Any, ...], *, missing: bool = False) -> tuple[str, int | None]:
    """Dotted path and line of ``loc`` in the YAML tree (parts that are union branches are skipped)."""
    node, path, line = root, [], (root.start_mark.line + 1 if root is not None else None)
    for i, part in enumerate(loc):
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(part)),
                         None)
            if match is not None:
                path.append(str(part))
                line, node = match[0].start_mark.line + 1, match[1]
            elif missing and i == len(loc) - 1:
                path.append(str(part))
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            path.append(str(part))
            node = node.value[part]
            line = node.start_mark.line + 1
    return ".".join(path), line


def _files(scenario: Scenario) -> list[tuple[tuple[str | int, ...], str]]:
    """Every file a scenario names, with its location."""
    out = [((*loc, "path"), spec.path) for loc, spec in _lengths_files(scenario)]
    if scenario.trace is not None:
        out.append((("trace", "path"), scenario.trace.path))
    return out


def _lengths_files(scenario: Scenario) -> list[tuple[tuple[str | int, ...], EmpiricalLength]]:
    """Every length distribution read from a file, with its location."""
    out: list[tuple[tuple[str | int, ...], EmpiricalLength]] = []

    def lengths(spec: Any, loc: tuple[str | int, ...]) -> None:
        if isinstance(spec, EmpiricalLength):
            out.append((loc, spec))
        elif isinstance(spec, MixtureLength):
            for i, part in enumerate(spec.parts):
                lengths(part.length, (*loc, "parts", i, "length"))

    for app_name, app in scenario.apps.items():
        for agent_name, agent in app.agents.items():
            for what in ("prompt", "output"):
                lengths(getattr(agent, what), ("apps", app_name, "agents", agent_name, what))
    return out


def scenario_json_schema() -> dict[str, Any]:
    """The JSON schema of scenario files (pydantic's schema of :class:`Scenario`).

    Examples:
        >>> from fairagents.bench.spec import scenario_json_schema
        >>> schema = scenario_json_schema()
        >>> schema["title"], sorted(schema["required"])
        ('Scenario', ['duration', 'models', 'name'])
    """
    return Scenario.model_json_schema()
