"""Handles of the apps and agents declared on an arbiter: what agents call models through.

Examples:
    >>> import fairagents as fa
    >>> arbiter = fa.Arbiter()
    >>> planner = arbiter.app("driving", weight=2.0).agent("planner")
    >>> planner, planner.identity.app.weight
    (AgentHandle(driving/planner), 2.0)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, Protocol, Unpack

from fairagents.engines.base import Delta, Prompt
from fairagents.identity import SLO, Agent, App
from fairagents.reply import ImageReply, Reply
from fairagents.runtime.sampling import ChatArgs, SamplingArgs
from fairagents.runtime.tenants import Tenants

__all__ = ["AgentHandle", "AppHandle", "Who"]

Messages = Sequence[dict[str, Any]]


class _Calls(Protocol):
    """What a handle needs of its arbiter: its tenants, and its calls."""

    tenants: Tenants

    def chat(self, model: str, messages: Any, /, *, agent: Any, **kw: Any) -> Awaitable[Reply]: ...
    def stream_chat(self, model: str, messages: Any, /, *, agent: Any, **kw: Any) -> AsyncIterator[Delta]: ...
    def complete(self, model: str, prompt: Any, /, *, agent: Any, **kw: Any) -> Awaitable[Reply]: ...
    def stream_complete(self, model: str, prompt: Any, /, *, agent: Any, **kw: Any) -> AsyncIterator[Delta]: ...
    def generate_image(self, model: str, prompt: str, /, *, agent: Any, **kw: Any) -> Awaitable[ImageReply]: ...


class AgentHandle:
    """An agent declared on an arbiter; makes calls as itself.

    Examples:
        >>> import fairagents as fa
        >>> planner = fa.Arbiter().app("driving").agent("planner", weight=2.0)
        >>> planner.identity.key, planner.identity.weight
        (('driving', 'planner'), 2.0)
    """

    def __init__(self, arbiter: _Calls, identity: Agent) -> None:
        self._arbiter = arbiter
        self.identity = identity

    def __repr__(self) -> str:
        return f"AgentHandle({self.identity.app.name}/{self.identity.name})"

    async def chat(self, model: str, messages: Messages | Prompt, *, arrival: float | None = None,
                   **sampling: Unpack[ChatArgs]) -> Reply:
        """:meth:`Arbiter.chat <fairagents.Arbiter.chat>` as this agent."""
        return await self._arbiter.chat(model, messages, agent=self, arrival=arrival, **sampling)

    def stream_chat(self, model: str, messages: Messages | Prompt, *, arrival: float | None = None,
                   **sampling: Unpack[ChatArgs]) -> AsyncIterator[Delta]:
        """:meth:`Arbiter.stream_chat <fairagents.Arbiter.stream_chat>` as this agent."""
        return self._arbiter.stream_chat(model, messages, agent=self, arrival=arrival, **sampling)

    async def complete(self, model: str, prompt: str | Prompt, *, arrival: float | None = None,
                   **sampling: Unpack[SamplingArgs]) -> Reply:
        """:meth:`Arbiter.complete <fairagents.Arbiter.complete>` as this agent."""
        return await self._arbiter.complete(model, prompt, agent=self, arrival=arrival, **sampling)

    def stream_complete(self, model: str, prompt: str | Prompt, *, arrival: float | None = None,
                   **sampling: Unpack[SamplingArgs]) -> AsyncIterator[Delta]:
        """:meth:`Arbiter.stream_complete <fairagents.Arbiter.stream_complete>` as this agent."""
        return self._arbiter.stream_complete(model, prompt, agent=self, arrival=arrival, **sampling)

    async def generate_image(self, model: str, prompt: str, **params: Any) -> ImageReply:
        """:meth:`Arbiter.generate_image <fairagents.Arbiter.generate_image>` as this agent."""
        return await self._arbiter.generate_image(model, prompt, agent=self, **params)


class AppHandle:
    """An app declared on an arbiter; declares its agents.

    Examples:
        >>> import fairagents as fa
        >>> studio = fa.Arbiter().app("studio", weight=3.0)
        >>> studio.identity.weight, studio.agent("writer").identity.app is studio.identity
        (3.0, True)
    """

    def __init__(self, arbiter: _Calls, identity: App) -> None:
        self._arbiter = arbiter
        self.identity = identity

    def __repr__(self) -> str:
        return f"AppHandle({self.identity.name})"

    @property
    def arbiter(self) -> Any:
        """The arbiter the app is declared on."""
        return self._arbiter

    def agent(self, name: str, weight: float = 1.0, slo: SLO | None = None) -> AgentHandle:
        """Declare (or get) an agent of this app; re-declaring with other settings is an error."""
        return AgentHandle(self._arbiter, self._arbiter.tenants.declare_agent(self.identity, name, weight, slo))


Who = AgentHandle | Agent | str | None
"""Who makes a call: a handle, an :class:`~fairagents.Agent`, a declared agent's name, or ``None`` (in context)."""
