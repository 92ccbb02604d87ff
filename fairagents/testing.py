"""Helpers for testing code that uses fairagents: a fake clock and a decision recorder.

Also re-exports the simulator (:class:`~fairagents.engines.SimEngine`,
:func:`~fairagents.simulation.simulate`) so tests of an app's scheduling need one import.

Example:
    >>> import fairagents as fa
    >>> from fairagents.testing import FakeClock, RecordingPolicy
    >>> clock = FakeClock()
    >>> policy = RecordingPolicy(fa.policies.HMFS(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)})))
    >>> who = fa.Agent("t", fa.App("a"))
    >>> req = fa.Request(id="r1", agent=who, model="m", prompt_tokens=3, max_tokens=4, arrival=clock())
    >>> policy.on_arrival(req, clock())
    >>> clock.advance(0.5)
    >>> policy.on_dispatch(policy.select("m", clock()), clock())
    >>> policy.decisions
    [Decision(time=0.5, model='m', request_id='r1', app='a', agent='t')]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fairagents.engines.sim import SimEngine
from fairagents.errors import InvalidParameterError
from fairagents.policies.base import Policy
from fairagents.request import Outcome, Request
from fairagents.simulation import SimRequest, Workload, simulate

__all__ = ["Decision", "FakeClock", "RecordingPolicy", "SimEngine", "SimRequest", "Workload", "simulate"]


class FakeClock:
    """A clock that moves only when told; call it for the time in seconds.

    Example:
        >>> from fairagents.testing import FakeClock
        >>> clock = FakeClock(start=10.0)
        >>> clock.advance(2.5); clock()
        12.5
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (≥ 0)."""
        if seconds < 0:
            raise InvalidParameterError(f"a clock cannot go back ({seconds} s)")
        self.now += seconds


@dataclass(frozen=True, slots=True)
class Decision:
    """One dispatch a policy made.

    Example:
        >>> from fairagents.testing import Decision
        >>> Decision(1.0, "m", "r1", "a", "t").app
        'a'
    """

    time: float
    model: str
    request_id: str
    app: str
    agent: str


class RecordingPolicy:
    """Wraps a policy and records every dispatch, in order.

    Example:
        >>> import fairagents as fa
        >>> from fairagents.testing import RecordingPolicy
        >>> RecordingPolicy(fa.policies.FCFS()).name
        'fcfs'
    """

    name: ClassVar[str] = "recording"

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.decisions: list[Decision] = []

    def on_arrival(self, req: Request, now: float) -> None:
        self.inner.on_arrival(req, now)

    def select(self, model: str, now: float) -> Request | None:
        return self.inner.select(model, now)

    def on_dispatch(self, req: Request, now: float) -> None:
        self.inner.on_dispatch(req, now)
        self.decisions.append(Decision(now, req.model, req.id, req.app, req.agent.name))

    def on_progress(self, req: Request, new_output_tokens: int, now: float) -> None:
        self.inner.on_progress(req, new_output_tokens, now)

    def on_finish(self, req: Request, outcome: Outcome, now: float) -> None:
        self.inner.on_finish(req, outcome, now)

    def queued(self, model: str | None = None) -> int:
        return self.inner.queued(model)
