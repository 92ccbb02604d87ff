"""The request record that policies, the simulator and the arbiter pass around.

Examples:
    >>> import fairagents as fa
    >>> who = fa.Agent("planner", fa.App("driving"))
    >>> req = fa.Request(id="r1", agent=who, model="chat", prompt_tokens=12, max_tokens=32, arrival=0.5)
    >>> req.app, req.agent_key
    ('driving', ('driving', 'planner'))
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from fairagents.constants import MAX_TOKEN_COUNT
from fairagents.errors import InvalidParameterError, shown
from fairagents.identity import Agent

__all__ = ["Outcome", "Request"]


class Outcome(str, enum.Enum):
    """How a request left the system.

    Examples:
        A policy is told how each request ended; a cancelled waiting one leaves uncharged:

        >>> import fairagents as fa
        >>> policy = fa.policies.HMFS(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=4096, n_layers=1)}))
        >>> who = fa.Agent("a", fa.App("x"))
        >>> req = fa.Request(id="r1", agent=who, model="m", prompt_tokens=10, max_tokens=4, arrival=0.0)
        >>> policy.on_arrival(req, now=0.0); policy.on_finish(req, fa.Outcome.CANCELLED, now=1.0)
        >>> policy.queued(), policy.app_counters()
        (0, {'x': 0.0})
    """

    FINISHED = "finished"
    """It ran to completion."""
    CANCELLED = "cancelled"
    """The caller gave up: removed from the queue, or aborted in the engine."""
    FAILED = "failed"
    """The engine failed while it waited or ran."""


@dataclass(frozen=True, slots=True)
class Request:
    """One model call as the scheduler sees it.

    Examples:
        >>> import fairagents as fa
        >>> who = fa.Agent("critic", fa.App("studio"))
        >>> fa.Request(id="r2", agent=who, model="chat", prompt_tokens=-1, max_tokens=8, arrival=0.0)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: prompt_tokens must be an integer in [0, 2**40], got -1
    """

    id: str
    """Unique id of the request."""
    agent: Agent
    """Who is calling (the agent, and through it the app)."""
    model: str
    """Name of the model in the pool."""
    prompt_tokens: int
    """Prompt length in the model's raw tokens (image tokens included)."""
    max_tokens: int
    """Most output tokens the request may generate (raw tokens; ≥ 1)."""
    arrival: float
    """Arrival time (seconds on the scheduler's clock)."""
    payload: Any = field(default=None, compare=False, repr=False)
    """What the engine needs to run it (messages, sampling parameters); opaque to policies."""
    run: str | None = None
    """The run (one invocation of an agent workflow) the call belongs to; ``None``: a run of its own."""

    def __post_init__(self) -> None:
        prompt, most = self.prompt_tokens, self.max_tokens
        if isinstance(prompt, bool) or not isinstance(prompt, int) or not 0 <= prompt <= MAX_TOKEN_COUNT:
            raise InvalidParameterError(f"prompt_tokens must be an integer in [0, 2**40], got {shown(prompt)}",
                                        param="prompt_tokens")
        if isinstance(most, bool) or not isinstance(most, int) or not 1 <= most <= MAX_TOKEN_COUNT:
            raise InvalidParameterError(f"max_tokens must be an integer in [1, 2**40], got {shown(most)}",
                                        param="max_tokens")
        if not isinstance(self.arrival, int | float) or not math.isfinite(self.arrival):
            raise InvalidParameterError(f"arrival must be a finite time in seconds, got {self.arrival!r}")
        if not isinstance(self.agent, Agent):
            raise InvalidParameterError(f"agent must be an Agent, got {self.agent!r}")

    @property
    def app(self) -> str:
        """Name of the calling app."""
        return self.agent.app.name

    @property
    def agent_key(self) -> tuple[str, str]:
        """``(app name, agent name)``."""
        return self.agent.key

    @property
    def run_key(self) -> tuple[str, str]:
        """``(app name, run)``: its run, or the request alone when it names none."""
        return self.agent.app.name, self.run if self.run is not None else f"~{self.id}"
