"""The pool's lock, and a watchdog that says when a thread holds it too long.

Every call into a pool's policy runs under one re-entrant lock
(:attr:`~fairagents.policies.pooled.PoolPolicy.lock`): the arbiter's event loop takes it
for each dispatcher event, each engine thread for each scheduling step. Work done under
it is bounded (no loop in the scheduling structures runs on without end), so a thread
that holds it for long is a bug, and every other model and the event loop wait for it.
:class:`WatchedLock` knows which thread holds it and since when; :class:`LockWatchdog`,
a daemon thread, logs ``fairagents.policy.lock_held`` with that thread's stack once per
hold that outlasts its deadline, so the bug can be found rather than guessed.

Examples:
    >>> from fairagents.policies.watched_lock import WatchedLock
    >>> lock = WatchedLock()
    >>> with lock:
    ...     with lock:   # re-entrant
    ...         lock.holder() is not None
    True
    >>> lock.holder() is None
    True
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable

from fairagents._logging import get_logger

__all__ = ["LOCK_DEADLINE", "LockWatchdog", "WatchedLock"]

log = get_logger("fairagents.policy")

#: Seconds a thread may hold a pool's lock before the watchdog logs it (a step holds it for milliseconds).
LOCK_DEADLINE = 2.0


class WatchedLock:
    """A re-entrant lock that knows which thread holds it, and since when (``time.monotonic``)."""

    __slots__ = ("_depth", "_lock", "_owner", "_since")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._since: float | None = None
        self._depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock (as :meth:`threading.RLock.acquire`)."""
        if not self._lock.acquire(blocking, timeout):
            return False
        if not self._depth:
            self._owner, self._since = threading.get_ident(), time.monotonic()
        self._depth += 1
        return True

    def release(self) -> None:
        """Give the lock back (as :meth:`threading.RLock.release`)."""
        self._depth -= 1
        if not self._depth:
            self._owner = self._since = None
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def holder(self) -> tuple[int, float] | None:
        """``(thread ident, held since)`` of the thread that holds the lock, or ``None`` when it is free.

        Read without the lock, so it may be a moment old; a watchdog needs no more.
        """
        owner, since = self._owner, self._since
        return None if owner is None or since is None else (owner, since)


class LockWatchdog:
    """A daemon thread that logs, with the holder's stack, each hold of ``lock`` past ``deadline`` seconds.

    Args:
        lock: the lock to watch.
        deadline: seconds a hold may last before it is logged.
        interval: seconds between looks (default: a quarter of ``deadline``).
        clock: the time source the lock dates holds by.

    Examples:
        >>> from fairagents.policies.watched_lock import LockWatchdog, WatchedLock
        >>> lock = WatchedLock()
        >>> watchdog = LockWatchdog(lock, deadline=1.0)
        >>> with lock:
        ...     watchdog.check(now=lock.holder()[1] + 0.5)   # held half a second: fine
        False
    """

    def __init__(self, lock: WatchedLock, *, deadline: float = LOCK_DEADLINE, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lock = lock
        self.deadline = deadline
        self.interval = deadline / 4 if interval is None else interval
        self._clock = clock
        self._reported: tuple[int, float] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self, now: float | None = None) -> bool:
        """Look once: log the hold if it is past the deadline and not logged yet; whether it was logged now."""
        holder = self.lock.holder()
        if holder is None or holder == self._reported:
            return False
        held = (self._clock() if now is None else now) - holder[1]
        if held <= self.deadline:
            return False
        self._reported = holder
        frame = sys._current_frames().get(holder[0])
        thread = next((t.name for t in threading.enumerate() if t.ident == holder[0]), str(holder[0]))
        log.error("fairagents.policy.lock_held", thread=thread, seconds=round(held, 3), deadline=self.deadline,
                  stack="".join(traceback.format_stack(frame)) if frame is not None else None)
        return True

    def start(self) -> None:
        """Start watching (a no-op when already watching)."""
        if self._thread is not None:
            return
        stop = self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(stop,), name="fairagents-lock-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; the thread ends within one interval (it is not waited for: this may run on an event loop)."""
        self._stop.set()
        self._thread = None

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            self.check()
