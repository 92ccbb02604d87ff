"""Runs of agent workflows in the accounts: how long each took, how many calls it made, what it was served.

A *run* is one invocation of an agent workflow (a graph run: a chain of model calls,
often fanning out and joining), named by the requests that belong to it
(:attr:`~fairagents.request.Request.run`). The :class:`RunBook` keeps, per ``(app, run)``,
its first arrival, its last end, its calls (requests ended), the service charged to it
(unified tokens) and its requests queued or running.

A run completes when its scope ends (:meth:`RunBook.end`, which ``with arbiter.run():``
calls on exit), or once nothing of it has been queued or running for ``idle`` seconds:
a run that comes over HTTP sends no end. Idle runs are found lazily, when the stats are
read or a request ends. A completed run's duration is its first arrival to its last end.

Requests that name no run are each a run of their own to the scheduler, but they are
not counted here: each would be a run of one call, the request stats again.

The book is bounded whatever clients send: it keeps the last ``keep`` completed runs
of each app (its means and percentiles read them; the counts are exact), and at most
``max_active`` active runs per app: a new run past that completes the app's oldest
idle run early (the least recently active one, if none is idle).

Examples:
    >>> from fairagents.runs import RunBook
    >>> book = RunBook(idle=30.0)
    >>> book.arrive(0.0, "news", "digest-1", "r1", arrival=0.0)
    >>> book.charge(0.5, "news", "digest-1", "r1", 40.0)
    >>> book.ended(2.0, "news", "digest-1", "r1")
    >>> book.summary(now=10.0)["news"].active, book.summary(now=32.0)["news"].completed   # idle for 30 s
    (1, 1)
    >>> run = book.summary()["news"].recent[-1]
    >>> run.run, run.duration, run.calls, run.service
    ('digest-1', 2.0, 1, 40.0)
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from fairagents._logging import get_logger
from fairagents.metrics import percentile

__all__ = ["RunBook", "RunRecord", "RunStats"]

log = get_logger("fairagents.runs")


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One completed run (times in seconds on the arbiter's clock)."""

    app: str
    run: str
    start: float
    """Its first request's arrival."""
    end: float
    """When its last request ended (its last activity, if none ended)."""
    calls: int
    """Requests of it that ended, however they ended."""
    service: float
    """Unified tokens charged to it."""

    @property
    def duration(self) -> float:
        """Seconds from its first arrival to its last end."""
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class RunStats:
    """One app's runs: how many completed and are active, and what completed runs took (NaN without any).

    Means and the percentile read the app's most recent completed runs (the book's ``keep``);
    ``completed``, ``calls`` and ``service`` count every run completed since the start.
    """

    completed: int = 0
    """Runs completed so far."""
    active: int = 0
    """Runs with requests queued or running, or active within the idle time, not yet ended."""
    duration_mean: float = math.nan
    """Mean seconds from a run's first arrival to its last end."""
    duration_p95: float = math.nan
    calls_mean: float = math.nan
    """Mean requests per run."""
    service_mean: float = math.nan
    """Mean unified tokens per run."""
    calls: int = 0
    """Requests of all completed runs."""
    service: float = 0.0
    """Unified tokens of all completed runs."""
    recent: tuple[RunRecord, ...] = ()
    """The last few completed runs, oldest first."""


@dataclass(eq=False, slots=True)
class _Run:
    start: float
    last: float
    """Last activity: arrival, charge or end of one of its requests."""
    end: float | None = None
    """Its last request's end."""
    calls: int = 0
    service: float = 0.0
    live: set[str] = field(default_factory=set)
    """Its requests queued or running (as far as the book was told)."""
    ending: bool = False
    """Its scope ended: it completes when its last live request ends."""


@dataclass(slots=True)
class _Totals:
    completed: int = 0
    calls: int = 0
    service: float = 0.0


class RunBook:
    """The runs of one arbiter's requests, active and completed (see the module docstring).

    Args:
        idle: seconds with nothing queued or running after which a run completes.
        keep: completed runs kept per app for the means and percentiles.
        max_active: active runs tracked per app.
        recent: completed runs listed per app in :attr:`RunStats.recent`.
        clock: the arbiter's clock, to find idle runs when nothing happens; without it,
            the latest time the book was told of stands for now.

    Examples:
        >>> from fairagents.runs import RunBook
        >>> book = RunBook(max_active=1)
        >>> book.ended(1.0, "a", "x", "r1", arrival=0.0)
        >>> book.ended(3.0, "a", "y", "r2", arrival=2.0)   # past max_active: x completes early
        >>> book.summary()["a"].completed, book.summary()["a"].active
        (1, 1)
    """

    def __init__(self, *, idle: float = 30.0, keep: int = 1_000, max_active: int = 10_000, recent: int = 5,
                 clock: Callable[[], float] | None = None) -> None:
        self.idle = idle
        self.keep = keep
        self.max_active = max_active
        self.recent = recent
        self.clock = clock
        self.listeners: list[Callable[[RunRecord], None]] = []
        """Called with each run as it completes (metrics exporters)."""
        self._active: dict[str, dict[str, _Run]] = {}  # per app, least recently active first
        self._done: dict[str, deque[RunRecord]] = {}
        self._totals: dict[str, _Totals] = {}
        self._now = -math.inf
        self._lock = threading.RLock()  # stats() may read (and expire) from a portal's thread
        self._completed: list[RunRecord] = []  # completed under the lock, told to the listeners after it

    # -- what happens to a run's requests ---------------------------------------------

    def arrive(self, now: float, app: str, run: str, request: str, *, arrival: float) -> None:
        """A request of ``run`` is queued."""
        with self._lock:
            self._touch(now, app, run, arrival).live.add(request)
        self._tell()

    def charge(self, now: float, app: str, run: str, request: str, amount: float, *,
               arrival: float | None = None) -> None:
        """``amount`` unified tokens charged to a request of ``run`` (it is running)."""
        with self._lock:
            r = self._touch(now, app, run, now if arrival is None else arrival)
            r.service += amount
            r.live.add(request)
        self._tell()

    def ended(self, now: float, app: str, run: str, request: str, *, arrival: float | None = None) -> None:
        """A request of ``run`` ended at ``now`` (a call of the run)."""
        with self._lock:
            r = self._touch(now, app, run, now if arrival is None else arrival)
            r.calls += 1
            r.live.discard(request)
            r.end = now if r.end is None else max(r.end, now)
            if r.ending and not r.live:
                self._complete(app, run)
            self._expire(None)
        self._tell()

    def end(self, run: str, now: float) -> None:
        """``run``'s scope ended: it completes now, or as its last request queued or running ends."""
        with self._lock:
            self._now = max(self._now, now)
            for app, runs in list(self._active.items()):
                r = runs.get(run)
                if r is None:
                    continue
                if r.live:
                    r.ending = True
                else:
                    self._complete(app, run)
        self._tell()

    # -- reading ------------------------------------------------------------------------

    def expire(self, now: float | None = None) -> None:
        """Complete the runs idle for ``idle`` seconds at ``now`` (default: the clock, or the latest time seen)."""
        with self._lock:
            self._expire(now)
        self._tell()

    def _expire(self, now: float | None) -> None:
        now = self._time(now)
        for app, runs in list(self._active.items()):
            stale = []
            for run, r in runs.items():  # least recently active first: stop at the first still recent
                if now - r.last < self.idle:
                    break
                if not r.live:
                    stale.append(run)
            for run in stale:
                self._complete(app, run)

    def summary(self, now: float | None = None) -> dict[str, RunStats]:
        """Each app's :class:`RunStats` (apps with a run active or completed), idle runs completed first."""
        with self._lock:
            out = self._summary(now)
        self._tell()
        return out

    def _summary(self, now: float | None) -> dict[str, RunStats]:
        self._expire(now)
        out = {}
        for app in self._totals.keys() | self._active.keys():
            done = self._done.get(app, ())
            totals = self._totals.get(app, _Totals())
            n = len(done)
            out[app] = RunStats(
                completed=totals.completed,
                active=len(self._active.get(app, ())),
                duration_mean=sum(r.duration for r in done) / n if n else math.nan,
                duration_p95=percentile([r.duration for r in done], 95),
                calls_mean=sum(r.calls for r in done) / n if n else math.nan,
                service_mean=sum(r.service for r in done) / n if n else math.nan,
                calls=totals.calls,
                service=totals.service,
                recent=tuple(list(done)[-self.recent:]) if self.recent else (),
            )
        return out

    def service_of(self, app: str, run: str) -> float:
        """Unified tokens charged so far to an active run (0 if it is not active)."""
        r = self._active.get(app, {}).get(run)
        return 0.0 if r is None else r.service

    # -- bookkeeping ----------------------------------------------------------------------

    def _time(self, now: float | None) -> float:
        if now is None:
            now = self.clock() if self.clock is not None else self._now
        return now

    def _touch(self, now: float, app: str, run: str, arrival: float) -> _Run:
        """The active run, created if new (past the cap, the app's oldest idle run completes), moved to the end."""
        self._now = max(self._now, now)
        runs = self._active.setdefault(app, {})
        r = runs.pop(run, None)
        if r is None:
            if len(runs) >= self.max_active:
                oldest = next((k for k, v in runs.items() if not v.live), next(iter(runs)))
                self._complete(app, oldest)
                runs = self._active.setdefault(app, {})  # the app's last run may have gone with it
            r = _Run(start=arrival, last=now)
        r.start = min(r.start, arrival)
        r.last = max(r.last, now)
        runs[run] = r  # the most recently active last
        return r

    def _complete(self, app: str, run: str) -> None:
        runs = self._active.get(app, {})
        r = runs.pop(run, None)
        if r is None:  # completed already
            return
        if not runs:
            self._active.pop(app, None)
        record = RunRecord(app, run, r.start, r.last if r.end is None else r.end, r.calls, r.service)
        done = self._done.get(app)
        if done is None:
            done = self._done[app] = deque(maxlen=self.keep)
        done.append(record)
        totals = self._totals.setdefault(app, _Totals())
        totals.completed += 1
        totals.calls += r.calls
        totals.service += r.service
        self._completed.append(record)

    def _tell(self) -> None:
        """Tell the listeners of the runs completed, outside the lock (a listener may read the book)."""
        while self._completed:
            with self._lock:
                records, self._completed = self._completed, []
            for record in records:
                for listener in self.listeners:
                    try:
                        listener(record)
                    except Exception:  # a listener's bug must not leak into the request that ended
                        log.exception("fairagents.runs.listener_failed", listener=repr(listener))
