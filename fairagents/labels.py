"""Bounded Prometheus labels for apps and agents: named up to a cap, the rest counted as ``_other``.

Any client can bring any app or agent name, and every label value makes series a
registry keeps, so metrics name the first ``max_apps`` apps they see, and the first
``max_agents`` agents of each, and count later ones together under :data:`OTHER`.
The server's ``/metrics`` and the fair vLLM scheduler's series both label through
:class:`LabelCap`.
"""

from __future__ import annotations

__all__ = ["OTHER", "LabelCap"]

#: The label of the apps (or an app's agents) past the cap.
OTHER = "_other"


class LabelCap:
    """Which ``(app, agent)`` label values an identity gets: its names, until the caps are reached.

    Args:
        max_apps: apps named; later ones are :data:`OTHER`.
        max_agents: agents named per app; later ones are :data:`OTHER`.

    Examples:
        >>> from fairagents.labels import LabelCap
        >>> cap = LabelCap(max_apps=1, max_agents=1)
        >>> cap("a", "x"), cap("a", "y"), cap("b", "x")
        (('a', 'x'), ('a', '_other'), ('_other', '_other'))
        >>> cap.forget("a", "x")
        >>> cap("a", "y")
        ('a', 'y')
    """

    def __init__(self, max_apps: int = 64, max_agents: int = 16) -> None:
        self.max_apps = max_apps
        self.max_agents = max_agents
        self._named: dict[str, set[str]] = {}

    def __call__(self, app: str, agent: str) -> tuple[str, str]:
        agents = self._named.get(app)
        if agents is None:
            if len(self._named) >= self.max_apps:
                return OTHER, OTHER
            agents = self._named[app] = set()
        if agent not in agents:
            if len(agents) >= self.max_agents:
                return app, OTHER
            agents.add(agent)
        return app, agent

    def app(self, app: str) -> str:
        """The label of an app, without naming it."""
        return app if app in self._named or len(self._named) < self.max_apps else OTHER

    def names(self, app: str, agent: str) -> bool:
        """Whether the agent has a label of its own."""
        return agent in self._named.get(app, ())

    def forget(self, app: str, agent: str) -> None:
        """Free the agent's label (and the app's, once it names no agent)."""
        agents = self._named.get(app)
        if agents is not None:
            agents.discard(agent)
            if not agents:
                del self._named[app]
