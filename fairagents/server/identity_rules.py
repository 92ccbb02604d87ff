"""Identity from the harness: rules that read a request's agent and run from what its client already sends.

Coding agents and their sub-agents cannot be made to send ``X-Fairagents-Agent`` or
``X-Fairagents-Run``, but they do say who they are: Claude Code's
``X-Claude-Code-Session-Id`` and ``x-claude-code-agent-id``, Codex CLI's ``session-id`` and
``x-openai-subagent``, OpenCode's ``x-session-id`` and ``x-parent-session-id``, a body's
``metadata.user_id``. A rule (``[[server.identity]]`` in the server's configuration) maps one
such source to the agent or the run:

- ``from``: ``header:<name>``, or ``body:<dotted path>`` (``body:metadata.user_id``);
- ``to``: ``agent`` or ``run``;
- ``value``: a fixed name to give when the source is present (a sub-agent marker → ``"subagent"``);
  unset, the source's own value is the name;
- ``pattern``: a regular expression the value is searched with; its first group (else the
  whole match) is the name, and a value it does not match is no match.

Rules are tried in order; the first that matches sets its target. ``X-Fairagents-Agent`` and
``X-Fairagents-Run`` take precedence over every rule. A name a rule reads is checked as every
name is (an agent's 1-64 printable characters, a run's 128 of ``[A-Za-z0-9_.:@/+=-]``; else a 400
naming the rule's source), and agents it declares count against the app's ``max_agents``, as
those a header names do: no rule makes the views grow past their bounds.

Examples:
    >>> from fairagents.server.identity_rules import IdentityRule, resolve
    >>> rules = [IdentityRule.model_validate({"from": "header:x-session-id", "to": "run"}),
    ...          IdentityRule.model_validate({"from": "header:x-parent-session-id", "to": "agent", "value": "subagent"})]
    >>> resolve(rules, {"x-session-id": "ses_42", "x-parent-session-id": "ses_41"})
    ('subagent', 'ses_42')
    >>> resolve(rules, {}, None)
    (None, None)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fairagents.errors import InvalidParameterError, shown
from fairagents.identity import MAX_QUOTED, check_run, quoted
from fairagents.labels import OTHER

__all__ = ["NAME_PATTERN", "IdentityRule", "check_name", "needs_body", "resolve"]

#: What app, agent and model names may be: 1-64 printable ASCII characters (they travel in HTTP
#: headers), no ``/`` (stats name agents ``app/agent``), no space at either end.
NAME_PATTERN = re.compile(r"^[!-.0-~](?:[ -.0-~]{0,62}[!-.0-~])?$")


def check_name(name: str, what: str, *, param: str | None = None) -> str:
    """``name`` if it is a valid app, agent or model name, else an :class:`~fairagents.InvalidParameterError`.

    No app or agent is named :data:`~fairagents.labels.OTHER` (``_other``): ``/metrics``
    and ``/v1/fairness`` count the apps and agents past their caps together under that
    name, which one of them would share. ``param`` is where the name came from (a header),
    for the error.

    Examples:
        >>> from fairagents.server.identity_rules import check_name
        >>> check_name("call model", "agent")
        'call model'
        >>> check_name("team/planner", "agent")
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: agent name must be 1-64 printable ASCII characters without '/' or a space at either end, got 'team/planner'
        >>> check_name("_other", "agent")
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: agent name '_other' is reserved: /metrics and /v1/fairness count the agents past their caps together under it
    """
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):  # match() lets a trailing "\n" pass "$"
        raise InvalidParameterError(
            f"{what} name must be 1-64 printable ASCII characters without '/' or a space at either end, got "
            f"{quoted(name) if isinstance(name, str) else shown(name, MAX_QUOTED)}", param=param,
        )
    if name == OTHER and what in ("app", "agent"):
        raise InvalidParameterError(f"{what} name {OTHER!r} is reserved: /metrics and /v1/fairness count the {what}s "
                                    "past their caps together under it", param=param)
    return name

_SOURCE = re.compile(r"^(header:[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}|body:[A-Za-z0-9_]{1,64}(\.[A-Za-z0-9_]{1,64}){0,7})$")


class IdentityRule(BaseModel):
    """One rule: where a request names its agent or run (see the module)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    source: str = Field(alias="from", pattern=_SOURCE.pattern)
    """``header:<name>`` or ``body:<dotted.path>``."""
    to: Literal["agent", "run"]
    value: str | None = Field(default=None, min_length=1, max_length=128)
    """The name to give when the source is present; unset, the source's value."""
    pattern: str | None = Field(default=None, min_length=1, max_length=512)
    """A regular expression searched in the source's value: its first group (or whole match) is the name."""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"pattern {pattern!r} is not a regular expression: {err}") from None
        return pattern

    @model_validator(mode="after")
    def _valid_value(self) -> IdentityRule:
        if self.value is not None:
            _checked(self, self.value)  # a fixed name must be a valid one
        return self

    @property
    def in_body(self) -> bool:
        """Whether the source is in the body (read once the body is parsed)."""
        return self.source.startswith("body:")

    def read(self, headers: Mapping[str, str], body: Any = None) -> str | None:
        """The name this rule gives a request with these ``headers`` (and parsed ``body``), or ``None``."""
        kind, _, where = self.source.partition(":")
        found = headers.get(where) if kind == "header" else _field(body, where)
        if found is None or (isinstance(found, str) and not found.strip()):
            return None
        text = str(found).strip()
        if self.pattern is not None:
            match = re.search(self.pattern, text)
            if match is None:
                return None
            text = match.group(1) if match.groups() and match.group(1) is not None else match.group(0)
        return _checked(self, self.value or text)


def _field(body: Any, path: str) -> Any:
    """The value at a dotted ``path`` of a parsed body (a pydantic model, its extra fields, or mappings)."""
    node = body
    for part in path.split("."):
        if isinstance(node, BaseModel):
            node = getattr(node, part) if part in type(node).model_fields else (node.model_extra or {}).get(part)
        elif isinstance(node, Mapping):
            node = node.get(part)
        else:
            return None
    return node if isinstance(node, str | int) and not isinstance(node, bool) else None


def _checked(rule: IdentityRule, name: str) -> str:
    try:
        return check_name(name, "agent") if rule.to == "agent" else check_run(name)
    except InvalidParameterError as err:
        raise InvalidParameterError(f"{rule.source} (the {rule.to} of server.identity): {err}",
                                    param=rule.source) from None


def resolve(rules: Sequence[IdentityRule], headers: Mapping[str, str], body: Any = None, *,
            in_body: bool | None = None) -> tuple[str | None, str | None]:
    """``(agent, run)`` the first matching rules give (``None`` where none matches).

    ``in_body``: only the rules that read the body (``True``), or only the others (``False``).
    """
    agent = run = None
    for rule in rules:
        if in_body is not None and rule.in_body != in_body:
            continue
        if (agent if rule.to == "agent" else run) is not None:
            continue
        name = rule.read(headers, body)
        if rule.to == "agent":
            agent = name
        else:
            run = name
    return agent, run


def needs_body(rules: Sequence[IdentityRule]) -> bool:
    """Whether any rule reads the body."""
    return any(rule.in_body for rule in rules)
