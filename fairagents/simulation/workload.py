"""Timed requests for the simulator: :class:`Workload` and its :class:`SimRequest` items."""

from __future__ import annotations

import random
from dataclasses import dataclass

from fairagents.errors import InvalidParameterError
from fairagents.identity import Agent

__all__ = ["Length", "SimRequest", "Workload", "check_max_tokens"]


Length = int | tuple[int, int]


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request of a workload: who sends what to which model, and when."""

    at: float
    """Arrival time (seconds)."""
    agent: Agent
    model: str
    prompt_tokens: int
    output_tokens: int
    """Tokens the simulated engine will generate (≥ 1)."""
    max_tokens: int | None = None
    """The request's ``max_tokens`` (≥ output_tokens); defaults to ``output_tokens``."""
    cancel_at: float | None = None
    """When the caller gives up, if it does."""


class Workload:
    """A list of timed requests, with builders for common shapes (deterministic by seed).

    Lengths are an ``int`` or an inclusive ``(low, high)`` range drawn uniformly.
    ``max_tokens`` is what each request asks for (at least its longest output; default:
    exactly its output, so a worst-case reservation is exact).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.simulation import Workload
        >>> who = fa.Agent("a", fa.App("x"))
        >>> work = Workload(seed=0).poisson(who, "chat", rate=10.0, until=1.0, prompt=(4, 8), output=4)
        >>> 0 < len(work) < 30
        True
    """

    def __init__(self, requests: list[SimRequest] | None = None, *, seed: int = 0) -> None:
        self.requests: list[SimRequest] = list(requests or [])
        self._rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.requests)

    def add(self, request: SimRequest) -> Workload:
        """Append one request."""
        self.requests.append(request)
        return self

    def burst(self, agent: Agent, model: str, *, n: int, at: float = 0.0, prompt: Length, output: Length,
              max_tokens: int | None = None) -> Workload:
        """``n`` requests all arriving at ``at`` (a backlog)."""
        check_max_tokens(max_tokens, output)
        for _ in range(n):
            self.add(SimRequest(at, agent, model, self._draw(prompt), self._draw(output), max_tokens))
        return self

    def poisson(
        self, agent: Agent, model: str, *, rate: float, until: float, start: float = 0.0, prompt: Length, output: Length,
        max_tokens: int | None = None,
    ) -> Workload:
        """Requests arriving as a Poisson process of ``rate`` per second over ``[start, until)``."""
        if rate <= 0:
            raise InvalidParameterError(f"rate must be > 0 requests per second, got {rate!r}")
        check_max_tokens(max_tokens, output)
        t = start + self._rng.expovariate(rate)
        while t < until:
            self.add(SimRequest(t, agent, model, self._draw(prompt), self._draw(output), max_tokens))
            t += self._rng.expovariate(rate)
        return self

    def _draw(self, length: Length) -> int:
        return length if isinstance(length, int) else self._rng.randint(*length)


def check_max_tokens(max_tokens: int | None, output: Length) -> None:
    longest = output if isinstance(output, int) else output[1]
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < longest):
        raise InvalidParameterError(f"max_tokens must be an integer ≥ the longest output ({longest}), got {max_tokens!r}")
