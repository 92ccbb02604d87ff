"""Handles of the apps and agents declared on an arbiter: what agents call models through.

Examples:
    >>> import fairagents as fa
    >>> arbiter = fa.Arbiter()
    >>> planner = arbiter.app("driving", weight=2.0).agent("planner")
    >>> planner, planner.identity.app.weight
    (AgentHandle(driving/planner), 2.0)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from fairagents.engines.base import Delta, Prompt
from fairagents.identity import SLO, Agent, App
from fairagents.reply import ImageReply, Reply

if TYPE_CHECKING:
    from fairagents.arbiter import Arbiter

__all__ = ["AgentHandle", "AppHandle"]

Messages = Sequence[dict[str, Any]]


class AgentHandle:
    """An agent declared on an arbiter; makes calls as itself.

    Examples:
        >>> import fairagents as fa
        >>> planner = fa.Arbiter().app("driving").agent("planner", weight=2.0)
        >>> planner.identity.key, planner.identity.weight
        (('driving', 'planner'), 2.0)
    """

    def __init__(self, arbiter: Arbiter, identity: Agent) -> None:
        self._arbiter = arbiter
        self.identity = identity

    def __repr__(self) -> str:
        return f"AgentHandle({self.identity.app.name}/{self.identity.name})"

    async def chat(self, model: str, messages: Messages, **params: Any) -> Reply:
        """:meth:`Arbiter.chat` as this agent."""
        return await self._arbiter.chat(model, messages, agent=self, **params)

    def stream_chat(self, model: str, messages: Messages, **params: Any) -> AsyncIterator[Delta]:
        """:meth:`Arbiter.stream_chat` as this agent."""
        return self._arbiter.stream_chat(model, messages, agent=self, **params)

    async def complete(self, model: str, prompt: str | Prompt, **params: Any) -> Reply:
        """:meth:`Arbiter.complete` as this agent."""
        return await self._arbiter.complete(model, prompt, agent=self, **params)

    def stream_complete(self, model: str, prompt: str | Prompt, **params: Any) -> AsyncIterator[Delta]:
        """:meth:`Arbiter.stream_complete` as this agent."""
        return self._arbiter.stream_complete(model, prompt, agent=self, **params)

    async def generate_image(self, model: str, prompt: str, **params: Any) -> ImageReply:
        """:meth:`Arbiter.generate_image` as this agent."""
        return await self._arbiter.generate_image(model, prompt, agent=self, **params)


class AppHandle:
    """An app declared on an arbiter; declares its agents.

    Examples:
        >>> import fairagents as fa
        >>> studio = fa.Arbiter().app("studio", weight=3.0)
        >>> studio.identity.weight, studio.agent("writer").identity.app is studio.identity
        (3.0, True)
    """

    def __init__(self, arbiter: Arbiter, identity: App) -> None:
        self._arbiter = arbiter
        self.identity = identity

    def __repr__(self) -> str:
        return f"AppHandle({self.identity.name})"

    def agent(self, name: str, weight: float = 1.0, slo: SLO | None = None) -> AgentHandle:
        """Declare (or get) an agent of this app; re-declaring with other settings is an error."""
        return self._arbiter._declare_agent(self.identity, name, weight, slo)
