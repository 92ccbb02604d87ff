"""The apps and agents declared on an arbiter, and who a call is made by.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.runtime.tenants import Tenants
    >>> tenants = Tenants()
    >>> planner = tenants.declare_agent(tenants.declare_app("driving", 2.0, None, None), "planner", 1.0, None)
    >>> tenants.resolve(planner).app.weight
    2.0
    >>> tenants.resolve(fa.Agent("planner", fa.App("driving", weight=3.0)))
    Traceback (most recent call last):
    ...
    fairagents.errors.InvalidParameterError: agent 'planner' of app 'driving' is called with app weight=3.0, but it is declared with app weight=2.0
"""

from __future__ import annotations

from typing import Any

from fairagents.errors import InvalidParameterError, UnknownAgentError, UnknownAppError
from fairagents.identity import SLO, Agent, App, current_agent

__all__ = ["Tenants", "check_max_tokens", "check_share"]


class Tenants:
    """Declared apps (with their queue bounds) and agents; resolves a caller to its declared agent.

    Examples:
        >>> from fairagents.runtime.tenants import Tenants
        >>> Tenants().resolve(None)
        Traceback (most recent call last):
        ...
        fairagents.errors.UnknownAgentError: no agent given and none bound: pass agent=... or use fa.acting_as(...)
    """

    def __init__(self) -> None:
        self.apps: dict[str, App] = {}
        self.agents: dict[tuple[str, str], Agent] = {}
        self.max_queued: dict[str, int] = {}
        self.share: dict[str, float] = {}
        """Apps declared with their own ``max_in_flight_share``."""
        self.max_tokens: dict[str, int] = {}
        """Apps declared with their own ``default_max_tokens``."""

    def declare_app(
        self, name: str, weight: float, slo: SLO | None, max_queued: int | None, share: float | None = None,
        max_tokens: int | None = None,
    ) -> App:
        """Declare (or get) an app; re-declaring with other settings is an error."""
        new = App(name, weight=weight, slo=slo)
        if max_queued is not None and (isinstance(max_queued, bool) or not isinstance(max_queued, int) or max_queued < 1):
            raise InvalidParameterError(f"max_queued must be an integer ≥ 1 or None, got {max_queued!r}", app=name)
        check_share(share, app=name)
        check_max_tokens(max_tokens, app=name)
        existing = self.apps.get(name)
        if existing is not None and (
            existing != new or self.max_queued.get(name) != max_queued or self.share.get(name) != share
            or self.max_tokens.get(name) != max_tokens
        ):
            raise InvalidParameterError(
                f"app {name!r} is already declared as {existing} with max_queued={self.max_queued.get(name)}, "
                f"max_in_flight_share={self.share.get(name)}, default_max_tokens={self.max_tokens.get(name)}",
                app=name,
            )
        self.apps[name] = existing or new
        if max_queued is not None:
            self.max_queued[name] = max_queued
        if share is not None:
            self.share[name] = share
        if max_tokens is not None:
            self.max_tokens[name] = max_tokens
        return self.apps[name]

    def declare_agent(self, app: App, name: str, weight: float, slo: SLO | None) -> Agent:
        """Declare (or get) an agent of a declared app; re-declaring with other settings is an error."""
        new = Agent(name, app, weight=weight, slo=slo)
        existing = self.agents.get(new.key)
        if existing is not None and existing != new:
            raise InvalidParameterError(
                f"agent {name!r} of app {app.name!r} is already declared as {existing}", app=app.name, agent=name
            )
        self.agents[new.key] = existing or new
        return self.agents[new.key]

    def forget_agent(self, key: tuple[str, str]) -> bool:
        """Undeclare the agent ``(app, agent)``; whether it was declared. The caller checks it has no history."""
        return self.agents.pop(key, None) is not None

    def forget_app(self, name: str) -> bool:
        """Undeclare app ``name`` and its settings unless one of its agents is declared; whether it was forgotten."""
        if name not in self.apps or any(app == name for app, _ in self.agents):
            return False
        del self.apps[name]
        for settings in (self.max_queued, self.share, self.max_tokens):
            settings.pop(name, None)
        return True

    def resolve(self, who: Any) -> Agent:
        """The declared agent a call is made by: ``who`` (an agent handle or :class:`Agent`), or the one bound in context.

        ``who`` may also be a name: ``"app/agent"``, or an agent's name alone when one app
        declares an agent of that name.

        Raises:
            UnknownAppError: the app is not declared.
            UnknownAgentError: no agent given or bound, the agent is not declared, or its
                bare name is declared in more than one app.
            InvalidParameterError: the caller's identity states settings (weights, SLOs)
                other than the declared ones; they are not replaced in silence.
        """
        if who is None:
            who = current_agent()
            if who is None:
                raise UnknownAgentError("no agent given and none bound: pass agent=... or use fa.acting_as(...)")
        if isinstance(who, str):
            return self._named(who)
        identity = getattr(who, "identity", who)  # an AgentHandle carries its Agent
        if not isinstance(identity, Agent):
            raise InvalidParameterError(f"agent must be an AgentHandle or Agent, got {who!r}")
        app, name = identity.key
        if app not in self.apps:
            raise UnknownAppError(f"unknown app {app!r}; declare it with arbiter.app(...)", app=app, agent=name)
        agent = self.agents.get(identity.key)
        if agent is None:
            raise UnknownAgentError(
                f"unknown agent {name!r} of app {app!r}; declare it with arbiter.app({app!r}).agent({name!r})",
                app=app, agent=name,
            )
        if identity is not agent:
            conflicts = identity.conflicts(agent)
            if conflicts:
                given = ", ".join(f"{what}={mine}" for what, mine, _ in conflicts)
                declared = ", ".join(f"{what}={theirs}" for what, _, theirs in conflicts)
                raise InvalidParameterError(
                    f"agent {name!r} of app {app!r} is called with {given}, but it is declared with {declared}",
                    app=app, agent=name,
                )
        return agent

    def _named(self, name: str) -> Agent:
        by_key = [a for (app, agent), a in self.agents.items() if f"{app}/{agent}" == name]
        matches = by_key or [a for (_, agent), a in self.agents.items() if agent == name]
        if len(matches) == 1:
            return matches[0]
        if matches:
            apps = ", ".join(sorted(repr(a.app.name) for a in matches))
            raise UnknownAgentError(f"agent {name!r} is declared in apps {apps}: name one as 'app/{name}'", agent=name)
        raise UnknownAgentError(f"no agent {name!r} is declared; give 'app/agent' or declare it with "
                                f"arbiter.app(...).agent({name!r})", agent=name)


def check_share(share: object, **about: str | None) -> None:
    """Raise unless ``share`` is ``None`` or a number in (0, 1].

    Examples:
        >>> from fairagents.runtime.tenants import check_share
        >>> check_share(0.0)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: max_in_flight_share must be a number in (0, 1] or None, got 0.0
    """
    if share is None:
        return
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise InvalidParameterError(f"max_in_flight_share must be a number in (0, 1] or None, got {share!r}", **about)


def check_max_tokens(max_tokens: object, **about: str | None) -> None:
    """Raise unless ``max_tokens`` is ``None`` or an integer ≥ 1 (a ``default_max_tokens`` setting).

    Examples:
        >>> from fairagents.runtime.tenants import check_max_tokens
        >>> check_max_tokens(0)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: default_max_tokens must be an integer ≥ 1 or None, got 0
    """
    if max_tokens is None:
        return
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidParameterError(f"default_max_tokens must be an integer ≥ 1 or None, got {max_tokens!r}", **about)
