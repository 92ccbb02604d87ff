"""Preparing requests off the event loop, fairly: a bounded worker pool that apps share by weight.

Decoding images, parsing a large body and tokenizing a long prompt take milliseconds to
seconds of CPU; on the event loop they would stall every other request behind them,
``/health`` included (head-of-line blocking, DuetInfer §III-B). A :class:`Preprocessor`
runs them in worker threads fed by a fair queue:

- **Fair.** Each app has its own queue; a free worker takes the head of the app with
  the least virtual preprocessing time (worker seconds over its weight; a newly
  backlogged app starts from the last started job's, so idleness earns no credit).
  While another app waits, one app holds at most ``workers − 1`` workers. Jobs are not
  preempted: one app's large images delay its own requests, not everyone's.
- **Bounded, and the bound is shared.** An app may have ``max_pending_per_app`` jobs in
  the pool; when the pool holds ``max_pending``, a job is refused only if its app holds
  an equal share already, so a flooding app is refused and a light one still gets in.
  A refusal is an :class:`~fairagents.errors.OverloadedError` at once, before any work.
- **Arrival kept.** The arbiter queues a prepared request with the time it came in, so
  its own preparation does not push back its place.

``inline=True`` prepares on the event loop instead, only so that
``fairagents bench modality`` can measure what the pool saves.

Examples:
    >>> import asyncio
    >>> from fairagents.runtime.preprocessing import Preprocessor
    >>> async def main():
    ...     pool = Preprocessor(workers=1, max_pending=4)
    ...     try:
    ...         return await pool.run(sum, [1, 2, 3], app="driving")
    ...     finally:
    ...         pool.close()
    >>> asyncio.run(main())
    6
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fairagents.errors import InvalidParameterError, OverloadedError, ShutdownError

__all__ = ["Preprocessor"]

T = TypeVar("T")


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    app: str
    weight: float
    future: asyncio.Future[Any]
    started: bool = field(default=False)


class Preprocessor:
    """A bounded, fair pool of worker threads for CPU-heavy preparation of requests.

    Args:
        workers: worker threads (PIL, NumPy and the tokenizers release the GIL for
            most of their work, so threads run beside the event loop).
        max_pending: jobs queued or running across apps past which an app holding an
            equal share of them is refused.
        max_pending_per_app: most jobs one app may have queued or running (default:
            ``max_pending``, no separate bound).
        inline: prepare on the calling (event-loop) thread instead: for benchmarks only.
        name: the worker threads' name prefix.

    Examples:
        >>> from fairagents.runtime.preprocessing import Preprocessor
        >>> Preprocessor(workers=0)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: workers must be an integer ≥ 1, got 0
    """

    def __init__(
        self,
        workers: int = 2,
        max_pending: int = 256,
        *,
        max_pending_per_app: int | None = None,
        inline: bool = False,
        name: str = "fairagents-preprocess",
    ) -> None:
        per_app = max_pending if max_pending_per_app is None else max_pending_per_app
        for what, value in (("workers", workers), ("max_pending", max_pending), ("max_pending_per_app", per_app)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(f"{what} must be an integer ≥ 1, got {value!r}")
        self.workers = workers
        self.max_pending = max_pending
        self.max_pending_per_app = per_app
        self.inline = inline
        self.name = name
        self.pending = 0
        """Jobs queued or running now."""
        self.pending_of: Counter[str] = Counter()
        """Jobs queued or running now, per app."""
        self.used: Counter[str] = Counter()
        """Worker seconds used, per app (since the pool was made)."""
        self._queues: dict[str, deque[_Job]] = {}
        self._vtime: dict[str, float] = {}
        self._clock = 0.0  # virtual time of the job last started
        self._busy = 0
        self._running_of: Counter[str] = Counter()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    async def run(self, fn: Callable[..., T], *args: Any, app: str = "", weight: float = 1.0) -> T:
        """``fn(*args)`` in the pool, queued fairly among ``app``'s peers, without blocking the event loop.

        Raises:
            OverloadedError: the pool, or ``app``'s part of it, is full; nothing ran.
            ShutdownError: the pool closed before the job started.
        """
        if self.inline:
            return fn(*args)
        if self.pending >= self.max_pending:
            apps = len(self.pending_of) + (app not in self.pending_of)
            if self.pending_of[app] >= self.max_pending / apps:  # a full pool refuses only who holds its share
                raise OverloadedError(
                    f"{self.pending} requests are waiting for preprocessing, the bound, {self.pending_of[app]} of them "
                    f"app {app!r}'s; retry later", retry_after=0.5, app=app or None,
                )
        if self.pending_of[app] >= self.max_pending_per_app:
            raise OverloadedError(
                f"app {app!r} has {self.pending_of[app]} requests waiting for preprocessing, its bound; retry later",
                retry_after=0.5, app=app or None,
            )
        loop = asyncio.get_running_loop()
        job = _Job(fn, args, app, weight, loop.create_future())
        queue = self._queues.get(app)
        if queue is None:  # backlogged from now: no credit for having been idle
            queue = self._queues[app] = deque()
            self._vtime[app] = max(self._vtime.get(app, 0.0), self._clock)
        queue.append(job)
        self.pending += 1
        self.pending_of[app] += 1
        try:
            self._pump(loop)
            return await job.future  # type: ignore[no-any-return]
        finally:
            self.pending -= 1
            self.pending_of[app] -= 1
            if not self.pending_of[app]:
                del self.pending_of[app]
            if not job.started:  # cancelled or closed while queued: it never runs
                self._drop(job)

    def close(self) -> None:
        """Fail queued jobs with :class:`~fairagents.ShutdownError` and let the workers exit (running ones finish)."""
        for queue in self._queues.values():
            for job in queue:
                if not job.future.done():
                    job.future.set_exception(ShutdownError("the preprocessing pool closed before the request was prepared"))
        self._queues.clear()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    # -- internals ---------------------------------------------------------------------

    def _pump(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start jobs while a worker is free: the head of the app with the least virtual time."""
        while self._busy < self.workers and self._queues:
            apps = list(self._queues)
            if len(apps) > 1:  # others are waiting: no app takes every worker
                cap = max(1, self.workers - 1)
                apps = [a for a in apps if self._running_of[a] < cap] or apps
            app = min(apps, key=lambda a: (self._vtime[a], self._running_of[a]))
            queue = self._queues[app]
            job = queue.popleft()
            if not queue:
                del self._queues[app]
            if job.future.done():
                continue
            job.started = True
            self._clock = self._vtime[app]
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix=self.name)
            self._busy += 1
            self._running_of[app] += 1
            work = self._pool.submit(_timed, job.fn, job.args)
            work.add_done_callback(lambda done, job=job: _call_soon(loop, self._finished, job, done, loop))

    def _finished(
        self, job: _Job, done: concurrent.futures.Future[tuple[float, Any, BaseException | None]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._busy -= 1
        self._running_of[job.app] -= 1
        if not self._running_of[job.app]:
            del self._running_of[job.app]
        try:
            seconds, result, error = done.result()
        except concurrent.futures.CancelledError:  # the pool closed before a worker took it
            closed = ShutdownError("the preprocessing pool closed before the request was prepared")
            seconds, result, error = 0.0, None, closed
        self.used[job.app] += seconds
        if job.app in self._vtime:
            self._vtime[job.app] += seconds / job.weight
        if not job.future.done():
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(result)
        self._pump(loop)

    def _drop(self, job: _Job) -> None:
        queue = self._queues.get(job.app)
        if queue is not None and job in queue:
            queue.remove(job)
            if not queue:
                del self._queues[job.app]


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Hand a finished job back to its loop; a loop that has closed meanwhile has no one to tell."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


def _timed(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[float, Any, BaseException | None]:
    """Run ``fn(*args)`` on a worker: the seconds it took, its result, and its error (returned, not lost)."""
    start = time.perf_counter()
    try:
        result = fn(*args)
    except BaseException as err:  # noqa: BLE001 - the job's own error goes to its caller
        return time.perf_counter() - start, None, err
    return time.perf_counter() - start, result, None
