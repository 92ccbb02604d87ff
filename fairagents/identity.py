"""Who is calling: apps, agents, their SLOs, and identity bound from context.

An :class:`App` is one multi-agent application (a tenant); an :class:`Agent` is a role
inside it. Both carry a ``weight``: an app's share of the pool against other apps, an
agent's share of its app against the app's other agents.

Identity travels in a :mod:`contextvars` variable, bound by :func:`acting_as` (a
context manager) or :func:`agent` (a decorator), so code deep inside an agent makes
model calls without passing its identity along. Context variables follow asyncio
tasks, so concurrent agents in one event loop keep their own identity.

A **run** is one invocation of an agent workflow (a graph run: a chain of calls, often
fanning out and joining): :func:`run_scope` binds a run id the same way, and every call
made inside it belongs to that run. A call outside any run is a run of its own.

Examples:
    >>> import fairagents as fa
    >>> driving = fa.App("driving", weight=2.0)
    >>> planner = fa.Agent("planner", driving, slo=fa.SLO(ttft=1.0))
    >>> with fa.acting_as(planner):
    ...     fa.current_agent().key
    ('driving', 'planner')
    >>> fa.current_agent() is None
    True
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import functools
import inspect
import math
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fairagents.constants import (
    DEFAULT_AGENT,
    HEADER_AGENT,
    HEADER_AGENT_SLO,
    HEADER_AGENT_WEIGHT,
    HEADER_APP,
    HEADER_RUN,
    METADATA_AGENT,
    METADATA_APP,
    RUN_PATTERN,
    XARG_AGENT_WEIGHT,
    XARG_APP_WEIGHT,
    XARG_RUN,
)
from fairagents.errors import InvalidParameterError, shown

__all__ = [
    "MAX_QUOTED", "SLO", "SLO_RANGE", "WEIGHT_RANGE", "Agent", "App", "Modality", "acting_as", "agent",
    "agent_from_headers", "check_run", "check_weight", "current_agent", "current_run", "identity_args",
    "identity_headers", "quoted", "run_from_headers", "run_scope",
]

F = TypeVar("F", bound=Callable[..., Any])


class Modality(str, enum.Enum):
    """What a model takes and gives.

    Examples:
        >>> import fairagents as fa
        >>> fa.Modality("vision") is fa.Modality.VISION
        True
    """

    TEXT = "text"
    """Text in, text out (an LLM)."""
    VISION = "vision"
    """Images and text in, text out (a vision-language model)."""
    IMAGE = "image"
    """Text in, images out (a diffusion model)."""


#: The range of a weight, an app's or an agent's: two clients' shares differ a million-fold at most.
#: Bounding it keeps every charge finite (a counter grows by ``charge / weight``).
WEIGHT_RANGE = (1e-3, 1e3)
#: The range of an SLO objective (``ttft``, ``tpot``, ``e2e``), in seconds: a millisecond to a day.
SLO_RANGE = (1e-3, 86_400.0)


def _in_range(value: object, low: float, high: float) -> bool:
    # Compared, not converted: NaN and the infinities fail the comparison, and an integer of any size compares.
    return not isinstance(value, bool) and isinstance(value, int | float) and low <= value <= high


def _range_text(low: float, high: float) -> str:
    return f"in [{low:g}, {high:g}]"


def check_weight(value: object, what: str, **about: Any) -> float:
    """``value`` as a weight: a number in :data:`WEIGHT_RANGE` (a boolean is not one); else an error naming ``what``.

    Args:
        value: the weight given.
        what: what it is the weight of, for the message (``"app weight"``).
        **about: attributes of the error (``param``, ``app``, ``agent``).

    Examples:
        >>> from fairagents.identity import check_weight
        >>> check_weight(2, "app weight")
        2.0
        >>> check_weight(1e-320, "agent weight")
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: agent weight must be a finite number in [0.001, 1000], got 1e-320
    """
    if not _in_range(value, *WEIGHT_RANGE):
        raise InvalidParameterError(f"{what} must be a finite number {_range_text(*WEIGHT_RANGE)}, "
                                    f"got {shown(value)}", **about)
    return float(value)  # type: ignore[arg-type]


def _check_seconds(value: object, what: str) -> None:
    if value is not None and not _in_range(value, *SLO_RANGE):
        raise InvalidParameterError(f"{what} must be a finite number of seconds {_range_text(*SLO_RANGE)}, "
                                    f"got {shown(value)}")


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise InvalidParameterError(f"{what} name must be a non-empty string, got {name!r}")


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency objectives of an agent (or an app's default), in seconds.

    A request meets its SLO when every objective that is set is met.

    Examples:
        >>> import fairagents as fa
        >>> slo = fa.SLO(ttft=0.5, e2e=4.0)
        >>> slo.met(ttft=0.3, tpot=0.05, e2e=3.0)
        True
        >>> slo.met(ttft=0.7, tpot=0.05, e2e=3.0)
        False
    """

    ttft: float | None = None
    """Time to first token (seconds)."""
    tpot: float | None = None
    """Mean time per output token after the first (seconds)."""
    e2e: float | None = None
    """End-to-end latency, arrival to last token (seconds)."""

    def __post_init__(self) -> None:
        for what in ("ttft", "tpot", "e2e"):
            _check_seconds(getattr(self, what), f"SLO {what}")

    def met(self, *, ttft: float, tpot: float | None, e2e: float) -> bool:
        """Whether measured latencies (seconds) meet every objective that is set."""
        if self.ttft is not None and ttft > self.ttft:
            return False
        if self.tpot is not None and tpot is not None and tpot > self.tpot:
            return False
        return self.e2e is None or e2e <= self.e2e


class _DefaultWeight(float):
    """The weight 1 a caller did not give, told apart from a weight given as 1."""

    __slots__ = ()


_DEFAULT_WEIGHT = _DefaultWeight(1.0)


def _stated(weight: float, slo: SLO | None, prefix: str = "") -> frozenset[str]:
    """The settings given: a weight that is not the default one, an SLO that is set."""
    return frozenset(f"{prefix}{what}" for what, given in (("weight", weight is not _DEFAULT_WEIGHT),
                                                          ("slo", slo is not None)) if given)


@dataclass(frozen=True, slots=True)
class App:
    """One multi-agent application (a tenant) sharing the model pool.

    Examples:
        >>> import fairagents as fa
        >>> studio = fa.App("studio", weight=2.0, slo=fa.SLO(e2e=30.0))   # twice a weight-1 app's share
        >>> writer = fa.Agent("writer", studio)
        >>> writer.key, writer.effective_slo   # its agents take the app's SLO unless they state one
        (('studio', 'writer'), SLO(ttft=None, tpot=None, e2e=30.0))
    """

    name: str
    """Unique name of the app."""
    weight: float = _DEFAULT_WEIGHT
    """Share of the pool relative to other apps (in :data:`WEIGHT_RANGE`; 1 unless given)."""
    slo: SLO | None = None
    """Default SLO of the app's agents."""
    stated: frozenset[str] = field(init=False, repr=False, compare=False)
    """Which of its settings (``weight``, ``slo``) were given rather than left to their defaults."""

    def __post_init__(self) -> None:
        _check_name(self.name, "app")
        check_weight(self.weight, "app weight")
        object.__setattr__(self, "stated", _stated(self.weight, self.slo))
        object.__setattr__(self, "weight", float(self.weight))


#: The settings of an agent's identity that a caller may state: its weight and SLO, and its app's.
SETTINGS = ("weight", "slo", "app weight", "app slo")


@dataclass(frozen=True, slots=True)
class Agent:
    """A role inside an app: a LangGraph node, a decorated function.

    Examples:
        >>> import fairagents as fa
        >>> critic = fa.Agent("critic", fa.App("studio"))
        >>> critic.key, critic.effective_slo
        (('studio', 'critic'), None)
    """

    name: str
    """Name of the agent, unique inside its app."""
    app: App
    """The app the agent belongs to."""
    weight: float = _DEFAULT_WEIGHT
    """Share of its app relative to the app's other agents (in :data:`WEIGHT_RANGE`; 1 unless given)."""
    slo: SLO | None = None
    """The agent's SLO; falls back to the app's."""
    declared: frozenset[str] = field(init=False, repr=False, compare=False)
    """Which of :data:`SETTINGS` were given (its own and its app's) rather than left to
    their defaults. An arbiter refuses a call whose given settings differ from the
    agent's declaration (:meth:`conflicts`) and takes the others from the declaration."""
    key: tuple[str, str] = field(init=False, repr=False, compare=False)
    """``(app name, agent name)``, the agent's identity in counters and stats."""

    def __post_init__(self) -> None:
        _check_name(self.name, "agent")
        if not isinstance(self.app, App):
            raise InvalidParameterError(f"agent app must be an App, got {self.app!r}")
        check_weight(self.weight, "agent weight")
        object.__setattr__(self, "key", (self.app.name, self.name))
        object.__setattr__(self, "declared", _stated(self.weight, self.slo) | {f"app {x}" for x in self.app.stated})
        object.__setattr__(self, "weight", float(self.weight))

    @property
    def effective_slo(self) -> SLO | None:
        """The agent's SLO, or its app's default when the agent has none."""
        return self.slo if self.slo is not None else self.app.slo

    def conflicts(self, declared: Agent) -> list[tuple[str, Any, Any]]:
        """``(setting, stated, declared)`` for each stated setting that differs from ``declared``'s.

        Examples:
            >>> import fairagents as fa
            >>> declared = fa.Agent("planner", fa.App("driving", weight=2.0), weight=3.0)
            >>> fa.Agent("planner", fa.App("driving", weight=1.0), weight=1.0).conflicts(declared)
            [('weight', 1.0, 3.0), ('app weight', 1.0, 2.0)]
            >>> fa.Agent("planner", fa.App("driving")).conflicts(declared)   # states nothing
            []
            >>> @fa.agent(app="driving", name="planner")
            ... def plan():
            ...     return fa.current_agent().conflicts(declared)
            >>> plan()
            []
        """
        out = []
        for what in SETTINGS:
            if what in self.declared:
                mine, theirs = _setting(self, what), _setting(declared, what)
                if mine != theirs:
                    out.append((what, mine, theirs))
        return out



def _setting(agent: Agent, what: str) -> Any:
    owner = agent.app if what.startswith("app ") else agent
    return getattr(owner, what.removeprefix("app "))


_current: contextvars.ContextVar[Agent | None] = contextvars.ContextVar("fairagents_agent", default=None)


def current_agent() -> Agent | None:
    """The agent bound in the current context, or ``None``.

    Examples:
        >>> import fairagents as fa
        >>> fa.current_agent() is None
        True
    """
    return _current.get()


@contextlib.contextmanager
def acting_as(who: Any, *, run: str | None = None) -> Iterator[Agent]:
    """Bind ``who`` (an :class:`Agent` or an arbiter's agent handle) as the calling agent.

    ``run`` also binds a run id (:func:`run_scope`). Nesting restores the outer binding on exit.

    Examples:
        >>> import fairagents as fa
        >>> a = fa.Agent("reader", fa.App("news"))
        >>> with fa.acting_as(a, run="digest-7") as bound:
        ...     bound is fa.current_agent(), fa.current_run()
        (True, 'digest-7')
    """
    who = getattr(who, "identity", who)  # an arbiter's AgentHandle carries its Agent
    if not isinstance(who, Agent):
        raise InvalidParameterError(f"acting_as takes an Agent or AgentHandle, got {who!r}")
    token = _current.set(who)
    try:
        if run is None:
            yield who
        else:
            with run_scope(run):
                yield who
    finally:
        _current.reset(token)


_run: contextvars.ContextVar[str | None] = contextvars.ContextVar("fairagents_run", default=None)
_RUN = re.compile(rf"^{RUN_PATTERN}$")


def current_run() -> str | None:
    """The run bound in the current context (:func:`run_scope`), or ``None``.

    Examples:
        >>> import fairagents as fa
        >>> fa.current_run() is None
        True
    """
    return _run.get()


def check_run(run: object) -> str:
    """``run`` if it is a valid run id: 1 to 128 letters, digits and ``_.:@/+=-``.

    Examples:
        >>> from fairagents.identity import check_run
        >>> check_run("thread-42/turn-3")
        'thread-42/turn-3'
        >>> check_run("two words")
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: a run id is 1 to 128 letters, digits and _.:@/+=-, got 'two words'
    """
    if not isinstance(run, str) or not _RUN.match(run):
        given = quoted(run) if isinstance(run, str) else shown(run, MAX_QUOTED)
        raise InvalidParameterError(f"a run id is 1 to 128 letters, digits and _.:@/+=-, got {given}", param="run")
    return run


@contextlib.contextmanager
def run_scope(run: str | None = None) -> Iterator[str]:
    """Make every call inside one run: ``run`` (checked), else a new id — or the run already bound.

    Without an id, a scope inside another run's scope joins it: a subgraph's calls, or a
    tool's, stay in the run of the graph that invoked them. An explicit id always binds.

    Examples:
        >>> import fairagents as fa
        >>> with fa.run_scope() as outer:
        ...     with fa.run_scope() as inner:
        ...         inner == outer == fa.current_run()
        True
        >>> with fa.run_scope("ticket-9"):
        ...     fa.current_run()
        'ticket-9'
    """
    if run is None:
        bound = _run.get()
        if bound is not None:
            yield bound
            return
        run = f"run-{uuid.uuid4().hex[:16]}"
    else:
        run = check_run(run)
    token = _run.set(run)
    try:
        yield run
    finally:
        _run.reset(token)


def agent(
    app: str | App, name: str = DEFAULT_AGENT, *, weight: float | None = None, slo: SLO | None = None
) -> Callable[[F], F]:
    """Decorate a function so that every model call made inside it acts as this agent.

    Works on plain functions and coroutine functions (not generators: bind with
    :func:`acting_as` inside those).
    Settings left out (``weight``, ``slo``, and the app's when it is given by name) are
    the arbiter's declaration of the agent; settings given must match that declaration,
    or the arbiter refuses the call (:meth:`Agent.conflicts`) rather than replace them.

    Examples:
        >>> import fairagents as fa
        >>> @fa.agent(app="driving", name="planner")
        ... def plan():
        ...     return fa.current_agent().key
        >>> plan()
        ('driving', 'planner')
    """
    who = Agent(name, app if isinstance(app, App) else App(app), weight=_DEFAULT_WEIGHT if weight is None else weight,
                slo=slo)

    def decorate(fn: F) -> F:
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            # A generator suspends with the binding still set in its caller's context,
            # so identity would leak out between items; wrap the calls inside instead.
            raise InvalidParameterError(
                f"@agent cannot decorate the generator {fn.__qualname__}; use 'with acting_as(...)' inside it"
            )
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with acting_as(who):
                    return await fn(*args, **kwargs)

            wrapper: Any = async_wrapper
        else:

            @functools.wraps(fn)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                with acting_as(who):
                    return fn(*args, **kwargs)

            wrapper = sync_wrapper
        wrapper.__fairagents_agent__ = who
        return wrapper  # type: ignore[no-any-return]

    return decorate


def identity_headers(who: Any = None, *, app: str | None = None, name_app: bool = False,
                     run: str | None = None) -> dict[str, str]:
    """The HTTP headers that tell a fairagents server who is calling, and in which run.

    An agent's own settings that were given (its ``weight``, its ``slo``) go along, in
    ``X-Fairagents-Agent-Weight`` and ``X-Fairagents-Agent-Slo``: the server declares an
    agent new to it with them (:func:`agent_from_headers`). Its app's settings do not: an
    app's weight and SLO are the server's configuration.

    Args:
        who: an :class:`Agent`, an arbiter's agent handle, or an agent's name; ``None``:
            the agent bound in context (no agent header when none is).
        app: the app to name, instead of the agent's own.
        name_app: name the app too, for a server that runs without API keys (with keys,
            the key says which app).
        run: the run the call belongs to, sent in ``X-Fairagents-Run`` (checked); ``None``:
            the run bound in context (:func:`run_scope`), if any.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.identity import identity_headers
        >>> with fa.acting_as(fa.Agent("planner", fa.App("driving"))):
        ...     identity_headers(name_app=True)
        {'X-Fairagents-Agent': 'planner', 'X-Fairagents-App': 'driving'}
        >>> identity_headers("writer", app="studio", name_app=True)
        {'X-Fairagents-Agent': 'writer', 'X-Fairagents-App': 'studio'}
        >>> identity_headers(fa.Agent("critic", fa.App("studio", weight=3.0), weight=2, slo=fa.SLO(ttft=0.5, e2e=4)))
        {'X-Fairagents-Agent': 'critic', 'X-Fairagents-Agent-Weight': '2.0', 'X-Fairagents-Agent-Slo': 'ttft=0.5, e2e=4.0'}
        >>> with fa.run_scope("digest-7"):
        ...     identity_headers("writer")
        {'X-Fairagents-Agent': 'writer', 'X-Fairagents-Run': 'digest-7'}
    """
    who = current_agent() if who is None else getattr(who, "identity", who)  # an AgentHandle carries its Agent
    headers = {}
    if isinstance(who, Agent):
        headers[HEADER_AGENT] = who.name
        if "weight" in who.declared:
            headers[HEADER_AGENT_WEIGHT] = repr(who.weight)
        if "slo" in who.declared and who.slo is not None and (slo := _slo_text(who.slo)):
            headers[HEADER_AGENT_SLO] = slo
    elif isinstance(who, str) and who:
        headers[HEADER_AGENT] = who
    elif who is not None:
        raise InvalidParameterError(f"the caller must be an Agent, an agent handle or an agent name, got {who!r}")
    app = app or (who.app.name if isinstance(who, Agent) else None)
    if name_app and app:
        headers[HEADER_APP] = app
    run = current_run() if run is None else check_run(run)
    if run is not None:
        headers[HEADER_RUN] = run
    return headers


def run_from_headers(headers: Mapping[str, str]) -> str | None:
    """The run a request's ``X-Fairagents-Run`` header names (checked: :func:`check_run`); ``None`` without one.

    The server's reading of the run that :func:`identity_headers` sends. An empty header
    names no run.

    Raises:
        InvalidParameterError: the header is not a run id; the error's ``param`` names the header.

    Examples:
        >>> from fairagents.identity import run_from_headers
        >>> run_from_headers({"X-Fairagents-Run": "thread-42/turn-3"}), run_from_headers({})
        ('thread-42/turn-3', None)
        >>> run_from_headers({"X-Fairagents-Run": "two words"})
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: X-Fairagents-Run: a run id is 1 to 128 letters, digits and _.:@/+=-, got 'two words'
    """
    text = (headers.get(HEADER_RUN) or "").strip()
    if not text:
        return None
    try:
        return check_run(text)
    except InvalidParameterError as err:
        raise InvalidParameterError(f"{HEADER_RUN}: {err}", param=HEADER_RUN) from None


def agent_from_headers(app: str, name: str, headers: Mapping[str, str]) -> Agent:
    """Agent ``name`` of ``app`` as a request's headers state it: with the weight and SLO they give, if any.

    The server's reading of :func:`identity_headers`: settings a header leaves out are not
    stated (:attr:`Agent.declared`), so the agent keeps its declaration's.

    Raises:
        InvalidParameterError: ``X-Fairagents-Agent-Weight`` is not a number in
            :data:`WEIGHT_RANGE`, or ``X-Fairagents-Agent-Slo`` not ``ttft=<s>, tpot=<s>, e2e=<s>``
            (any of them, each once) with numbers in :data:`SLO_RANGE`; the error's ``param``
            names the header, and it quotes at most :data:`MAX_QUOTED` characters of the value.

    Examples:
        >>> from fairagents.identity import agent_from_headers
        >>> stated = {"X-Fairagents-Agent-Weight": "2", "X-Fairagents-Agent-Slo": "ttft=0.5, e2e=4"}
        >>> writer = agent_from_headers("studio", "writer", stated)
        >>> writer.weight, writer.slo, sorted(writer.declared)
        (2.0, SLO(ttft=0.5, tpot=None, e2e=4.0), ['slo', 'weight'])
        >>> sorted(agent_from_headers("studio", "writer", {}).declared)
        []
        >>> agent_from_headers("studio", "writer", {"X-Fairagents-Agent-Weight": "-1"})
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: X-Fairagents-Agent-Weight: the agent weight must be a finite number in [0.001, 1000], got '-1'
    """
    about: dict[str, Any] = {"app": app, "agent": name}
    weight_text = (headers.get(HEADER_AGENT_WEIGHT) or "").strip()
    slo_text = (headers.get(HEADER_AGENT_SLO) or "").strip()
    weight = (_header_number(weight_text, HEADER_AGENT_WEIGHT, "the agent weight", about, WEIGHT_RANGE)
              if weight_text else None)
    slo = _parse_slo(slo_text, about) if slo_text else None
    if weight is None:
        return Agent(name, App(app), slo=slo)
    return Agent(name, App(app), weight=weight, slo=slo)


_SLO_FIELDS = ("ttft", "tpot", "e2e")
# A decimal number as a header carries it: 2, 0.5, .5, 1e-3 (no sign, no "inf", no "nan").
_NUMBER = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _slo_text(slo: SLO) -> str:
    """``slo`` as ``X-Fairagents-Agent-Slo`` carries it: ``ttft=0.5, e2e=4.0``."""
    return ", ".join(f"{what}={float(value)!r}" for what in _SLO_FIELDS if (value := getattr(slo, what)) is not None)


def _parse_slo(text: str, about: dict[str, Any]) -> SLO:
    values: dict[str, float] = {}
    for item in text.split(","):
        what, equals, value = (part.strip() for part in item.partition("="))
        if not equals or what not in _SLO_FIELDS or what in values:
            raise InvalidParameterError(
                f"{HEADER_AGENT_SLO}: {quoted(text)} is not 'ttft=<seconds>, tpot=<seconds>, e2e=<seconds>' "
                "(any of them, each once)", param=HEADER_AGENT_SLO, **about,
            )
        values[what] = _header_number(value, HEADER_AGENT_SLO, f"SLO {what}", about, SLO_RANGE)
    return SLO(**values)


def _header_number(text: str, header: str, what: str, about: dict[str, Any], bounds: tuple[float, float]) -> float:
    value = float(text) if _NUMBER.fullmatch(text) else math.nan
    if not (math.isfinite(value) and bounds[0] <= value <= bounds[1]):
        raise InvalidParameterError(f"{header}: {what} must be a finite number {_range_text(*bounds)}, "
                                    f"got {quoted(text)}", param=header, **about)
    return value


#: Most characters of a client's value an error message quotes: a 60 kB header is not echoed back.
MAX_QUOTED = 64


def quoted(text: str, limit: int = MAX_QUOTED) -> str:
    """``text`` as an error message quotes it: its ``repr``, cut to about ``limit`` characters.

    Examples:
        >>> from fairagents.identity import quoted
        >>> quoted("heavy"), quoted("9" * 100)
        ("'heavy'", "'9999999999999999999999999999999999999999999999999999999999999999…' (100 characters)")
    """
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}"[:-1] + f"…' ({len(text)} characters)"


def identity_args(agent: Agent, run: str | None = None) -> dict[str, Any]:
    """The arguments under which ``agent`` (and its request's ``run``) travel to an engine that schedules by identity.

    vLLM's ``SamplingParams.extra_args`` (``vllm_xargs`` over HTTP), read by
    :class:`~fairagents.vllm.scheduler.FairScheduler`.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.identity import identity_args
        >>> identity_args(fa.Agent("planner", fa.App("search", weight=2.0)))
        {'fairagents_app': 'search', 'fairagents_agent': 'planner', 'fairagents_app_weight': 2.0, 'fairagents_agent_weight': 1.0}
        >>> identity_args(fa.Agent("planner", fa.App("search")), run="digest-7")["fairagents_run"]
        'digest-7'
    """
    args: dict[str, Any] = {METADATA_APP: agent.app.name, METADATA_AGENT: agent.name,
                            XARG_APP_WEIGHT: agent.app.weight, XARG_AGENT_WEIGHT: agent.weight}
    if run is not None:
        args[XARG_RUN] = check_run(run)
    return args
