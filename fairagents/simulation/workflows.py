"""Runs of agent workflows for the simulator: :class:`Shape` (stages of :class:`Call`) and :class:`Workflows`."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from fairagents.errors import InvalidParameterError
from fairagents.identity import Agent, App
from fairagents.simulation.workload import Length, check_max_tokens

__all__ = ["Call", "Mix", "Shape", "SimRun", "UserGroup", "Workflows"]


@dataclass(frozen=True, slots=True)
class Call:
    """One model call of a workflow stage; its lengths are drawn when its run starts."""

    agent: Agent
    model: str
    prompt: Length
    output: Length
    max_tokens: int | None = None
    """What the call asks for (≥ its longest output; default: exactly its output)."""

    def __post_init__(self) -> None:
        for what, length in (("prompt", self.prompt), ("output", self.output)):
            low = length if isinstance(length, int) else length[0]
            high = length if isinstance(length, int) else length[1]
            if isinstance(low, bool) or not isinstance(low, int) or not isinstance(high, int) or low > high \
                    or low < (1 if what == "output" else 0):
                raise InvalidParameterError(f"{what} must be an integer or an inclusive (low, high) range of "
                                            f"integers ≥ {1 if what == 'output' else 0}, got {length!r}")
        check_max_tokens(self.max_tokens, self.output)

    @property
    def longest(self) -> tuple[int, int]:
        """``(longest prompt, max_tokens)``: the most this call can hold in an engine."""
        prompt = self.prompt if isinstance(self.prompt, int) else self.prompt[1]
        output = self.output if isinstance(self.output, int) else self.output[1]
        return prompt, output if self.max_tokens is None else self.max_tokens


@dataclass(frozen=True, slots=True)
class Shape:
    """What a run of a workflow does: stages of calls, each starting when the previous one has fully finished.

    The calls of a stage arrive together (a fan-out); a stage of one call after another
    is a chain. Every call of a shape belongs to one app, the run's. ``label`` is the
    run's class in reports (``"single"``, ``"chain6"``, ``"fanout16"``).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.simulation import Shape
        >>> app = fa.App("news")
        >>> fan = Shape.fanout(fa.Agent("writer", app), fa.Agent("editor", app), "chat", 16, prompt=64, output=32)
        >>> fan.label, [len(stage) for stage in fan.stages]
        ('fanout16', [16, 1])
        >>> Shape.chain(fa.Agent("bot", app), "chat", 6, prompt=64, output=32).label
        'chain6'
    """

    label: str
    stages: tuple[tuple[Call, ...], ...]

    def __post_init__(self) -> None:
        if not self.stages or not all(self.stages):
            raise InvalidParameterError("a workflow shape needs at least one stage, and every stage a call")
        apps = {call.agent.app for stage in self.stages for call in stage}
        if len(apps) != 1:
            raise InvalidParameterError(f"every call of a run belongs to one app, got {sorted(a.name for a in apps)}")

    @property
    def app(self) -> App:
        """The app whose run this is."""
        return self.stages[0][0].agent.app

    @property
    def calls(self) -> list[Call]:
        return [call for stage in self.stages for call in stage]

    @classmethod
    def chain(cls, agent: Agent | Sequence[Agent], model: str, n: int = 1, *, prompt: Length, output: Length,
              max_tokens: int | None = None, label: str | None = None) -> Shape:
        """``n`` calls one after another (by ``agent``, or cycling through several); ``"single"`` or ``"chain<n>"``."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidParameterError(f"a chain has n ≥ 1 calls, got {n!r}")
        agents = [agent] if isinstance(agent, Agent) else list(agent)
        stages = tuple((Call(agents[i % len(agents)], model, prompt, output, max_tokens),) for i in range(n))
        return cls(label or ("single" if n == 1 else f"chain{n}"), stages)

    @classmethod
    def fanout(cls, fan: Agent, join: Agent, model: str, k: int, *, prompt: Length, output: Length,
               join_prompt: Length | None = None, join_output: Length | None = None, entry: Agent | None = None,
               max_tokens: int | None = None, label: str | None = None) -> Shape:
        """An optional ``entry`` call, ``k`` parallel calls by ``fan``, then one by ``join``: ``"fanout<k>"``."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidParameterError(f"a fan-out has k ≥ 1 parallel calls, got {k!r}")
        stages = [(Call(fan, model, prompt, output, max_tokens),) * k,
                  (Call(join, model, prompt if join_prompt is None else join_prompt,
                        output if join_output is None else join_output, max_tokens),)]
        if entry is not None:
            stages.insert(0, (Call(entry, model, prompt, output, max_tokens),))
        return cls(label or f"fanout{k}", tuple(stages))


Mix = Shape | Sequence[tuple[float, Shape]]
"""One shape, or ``(weight, shape)`` pairs a run draws its shape from."""


@dataclass(frozen=True, slots=True)
class SimRun:
    """One run of a workflow as the simulator played it (times in virtual seconds, service in unified tokens)."""

    id: str
    """The run id every call of it carried (``Request.run``)."""
    app: str
    label: str
    """Its class (the shape's label)."""
    start: float
    """When its first stage arrived."""
    end: float
    """When its last call ended."""
    calls: int
    service: float
    """Unified tokens charged for its calls."""
    user: str | None = None
    """The closed-loop user that started it (``None``: an open-loop run)."""
    refused: int = 0
    """Calls refused by the app's ``max_queued`` bound (the run went on without them)."""

    @property
    def duration(self) -> float:
        """Run completion time: ``end - start``."""
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class UserGroup:
    """Closed-loop users of one mix (:meth:`Workflows.users`)."""

    mix: tuple[tuple[float, Shape], ...]
    n: int
    until: float
    start: float
    think: float
    stagger: float
    name: str


class Workflows:
    """Runs of agent workflows: open-loop (at given times, or Poisson) and closed-loop users.

    A closed-loop user starts a run, waits for it to complete, thinks for ``think``
    seconds and starts the next, until ``until``. What each run does (its shape from the
    mix and its lengths) depends only on the seed and the run's place in its user's
    sequence, so every policy simulated plays the same runs. Run ids are ``o<i>`` for
    the ``i``-th open-loop run and ``u<j>.<k>`` for closed-loop user ``j``'s ``k``-th.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.simulation import Shape, Workflows, simulate_workflows
        >>> app = fa.App("news")
        >>> single = Shape.chain(fa.Agent("desk", app), "chat", prompt=64, output=16)
        >>> fan = Shape.fanout(fa.Agent("writer", app), fa.Agent("editor", app), "chat", 4, prompt=64, output=16)
        >>> flows = Workflows(seed=1).users([(0.7, single), (0.3, fan)], n=3, until=5.0)
        >>> result = simulate_workflows(flows, "hmfs", {"chat": fa.engines.SimEngine(fa.ModelProfile(4096, 1))})
        >>> {r.label for r in result.runs} == {"single", "fanout4"}, all(r.end > r.start for r in result.runs)
        (True, True)
    """

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed
        self.open: list[tuple[float, tuple[tuple[float, Shape], ...]]] = []
        """Open-loop runs: start time and mix."""
        self.closed: list[UserGroup] = []
        """Closed-loop user groups, in the order added."""
        self._rng = random.Random(seed)

    def run(self, mix: Mix, *, at: float = 0.0) -> Workflows:
        """One run starting at ``at``."""
        self.open.append((_time(at, "at"), _mix(mix)))
        return self

    def poisson(self, mix: Mix, *, rate: float, until: float, start: float = 0.0) -> Workflows:
        """Runs starting as a Poisson process of ``rate`` per second over ``[start, until)``."""
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise InvalidParameterError(f"rate must be > 0 runs per second, got {rate!r}")
        shapes = _mix(mix)
        t = _time(start, "start") + self._rng.expovariate(rate)
        while t < until:
            self.open.append((t, shapes))
            t += self._rng.expovariate(rate)
        return self

    def users(self, mix: Mix, *, n: int, until: float, start: float = 0.0, think: float = 0.0,
              stagger: float = 0.0, name: str | None = None) -> Workflows:
        """``n`` users each starting runs back to back from ``start`` (or up to ``stagger`` s later) until ``until``.

        A user starts no run at or after ``until``; runs in progress then complete.
        ``think`` is the pause between a run's end and the user's next run.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidParameterError(f"n must be an integer ≥ 1 users, got {n!r}")
        for what, value in (("think", think), ("stagger", stagger)):
            _time(value, what)
        shapes = _mix(mix)
        self.closed.append(UserGroup(shapes, n, _time(until, "until"), _time(start, "start"), think, stagger,
                                  name or f"{shapes[0][1].app.name}{len(self.closed)}"))
        return self

    def user_names(self) -> list[tuple[UserGroup, str]]:
        """Every closed-loop user, in order (user ``i``'s runs are ``u<i>.0``, ``u<i>.1``, …): its group and name."""
        return [(group, f"{group.name}.{u}") for group in self.closed for u in range(group.n)]

    def first_start(self, user: int) -> float:
        """When closed-loop user ``user`` starts its first run."""
        group = self.user_names()[user][0]
        if not group.stagger:
            return group.start
        return group.start + random.Random(f"{self.seed}/s{user}").uniform(0.0, group.stagger)

    def draw(
        self, run_id: str, mix: tuple[tuple[float, Shape], ...]
    ) -> tuple[Shape, list[list[tuple[Call, int, int]]]]:
        """Run ``run_id``'s shape from ``mix`` and, per stage, its calls with drawn prompt and output lengths.

        A function of the seed and the run id alone: every policy, and the real engine, play the same run.
        """
        rng = random.Random(f"{self.seed}/{run_id}")
        shape = mix[0][1] if len(mix) == 1 else rng.choices([s for _, s in mix], [w for w, _ in mix])[0]
        return shape, [[(call, _draw(rng, call.prompt), _draw(rng, call.output)) for call in stage]
                       for stage in shape.stages]

    def shapes(self) -> list[Shape]:
        """Every shape a run may take."""
        return [shape for _, mix in self.open for _, shape in mix] + [s for u in self.closed for _, s in u.mix]


def _time(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise InvalidParameterError(f"{what} must be a finite number of seconds ≥ 0, got {value!r}")
    return float(value)


def _mix(mix: Mix) -> tuple[tuple[float, Shape], ...]:
    pairs = ((1.0, mix),) if isinstance(mix, Shape) else tuple((float(w), s) for w, s in mix)
    if not pairs or any(not isinstance(s, Shape) or not w > 0 for w, s in pairs):
        raise InvalidParameterError("a mix is a Shape or (weight > 0, Shape) pairs")
    return pairs


def _draw(rng: random.Random, length: Length) -> int:
    return length if isinstance(length, int) else rng.randint(*length)
