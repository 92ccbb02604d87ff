"""The live side of shared counters: an arbiter's sync loop with its store.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.shared import SharedCounters
    >>> SharedCounters("redis://127.0.0.1:6379/0", interval=0.01).describe()
    'redis://127.0.0.1:6379/0'
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from fairagents._logging import get_logger
from fairagents.errors import InvalidParameterError
from fairagents.shared.store import CounterStore, StoreUnavailable
from fairagents.shared.view import SharedView

__all__ = ["SharedCounters"]

log = get_logger("fairagents.shared")


class SharedCounters:
    """Fairness counters an arbiter shares with other arbiters through a store (Redis).

    Pass one to :class:`~fairagents.Arbiter` (``counters=``), or a ``redis://`` URL.
    While the arbiter runs, a task syncs every ``interval`` seconds: it sends the
    charges made since the last sync and what waits and runs here, and takes the
    pool's counters back (:mod:`fairagents.shared.store`). When the store cannot be
    reached the arbiter keeps serving on its own counters (logged once, shown by
    :meth:`status`), retries with exponential backoff (tenacity), and reconciles when
    the store answers again: its unsent charges are added, every counter is raised to
    at least this door's view of it from before the outage (so a Redis that restarted
    empty loses nothing the door knew), and the door takes the pool's counters as they
    are. What it charged while apart is not counted pool-wide (see
    :meth:`SharedView.apply`).

    Args:
        store: a :class:`~fairagents.shared.CounterStore`, or a ``redis://`` URL.
        interval: seconds between syncs (the staleness of the shared view; see
            :mod:`fairagents.shared` for what it does to the guarantee).
        ttl: seconds after its last sync a door stops counting for the others (a
            crashed door's waiting requests stop holding the others back).
        door: this arbiter's name among the doors (default: host, process and a number).
        namespace: for a URL: keeps several pools apart in one Redis.
        timeout: for a URL: seconds before Redis counts as unreachable.

    Examples:
        >>> from fairagents.shared import SharedCounters
        >>> SharedCounters("redis://localhost", interval=0)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: interval must be a number of seconds > 0, got 0
    """

    _doors = 0

    def __init__(
        self,
        store: CounterStore | str,
        *,
        interval: float = 0.02,
        ttl: float = 2.0,
        door: str | None = None,
        namespace: str = "default",
        timeout: float = 0.5,
    ) -> None:
        for value, what in ((interval, "interval"), (ttl, "ttl")):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidParameterError(f"{what} must be a number of seconds > 0, got {value!r}")
        if ttl <= interval:
            raise InvalidParameterError(f"ttl ({ttl} s) must exceed the sync interval ({interval} s)")
        if isinstance(store, str):
            from fairagents.shared.redis import RedisStore

            store = RedisStore(store, namespace=namespace, timeout=timeout)
        elif not isinstance(store, CounterStore):
            raise InvalidParameterError(f"counters must be a redis:// URL or a CounterStore, got {store!r}")
        SharedCounters._doors += 1
        self.store = store
        self.interval = float(interval)
        self.ttl = float(ttl)
        self.door = door or f"{socket.gethostname()}:{os.getpid()}:{SharedCounters._doors}"
        self.view: SharedView | None = None
        self.syncs = 0
        """Syncs that reached the store."""
        self.failures = 0
        """Syncs that did not."""
        self.last_sync: float | None = None
        """When the last sync reached the store (``time.monotonic``)."""
        self.round_trips: collections.deque[float] = collections.deque(maxlen=4096)
        """Seconds the recent syncs took, send to reply (the staleness a sync adds: ``ℓ``)."""
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._after_sync: Callable[[], None] | None = None

    def describe(self) -> str:
        """Where the counters live (no credentials)."""
        return self.store.describe()

    @property
    def connected(self) -> bool:
        """Whether the last sync reached the store."""
        return self.view is not None and self.view.connected

    def attach(self, view: SharedView, after_sync: Callable[[], None]) -> None:
        """Sync ``view``; call ``after_sync`` (on the loop) after each sync, and after losing the store."""
        self.view = view
        self._after_sync = after_sync

    async def start(self) -> None:
        """Sync once (so the first dispatches see the pool), then keep syncing in the background.

        A store that cannot be reached now does not stop the start: the arbiter serves
        on its own counters until it can.
        """
        if self._task is not None:
            return
        self._stopping = False
        reconcile = await self._first_sync()
        self._task = asyncio.get_running_loop().create_task(self._run(reconcile), name=f"fairagents-sync-{self.door}")

    async def close(self) -> None:
        """Stop syncing, send the last charges, and leave the pool (what waited here stops counting)."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            # A client library may turn a cancellation that lands mid-command into an error of its own, which
            # the loop would retry: so the loop also checks _stopping, and the cancel is repeated until it ends.
            while not task.done():
                task.cancel()
                await asyncio.wait([task], timeout=0.1)
            if not task.cancelled() and task.exception() is not None:
                log.debug("fairagents.shared.sync_stopped", error=repr(task.exception()))
        with contextlib.suppress(StoreUnavailable):
            if self.view is not None and self.view.connected:
                await self._sync_once(reconcile=False)
            await self.store.leave(self.door)
        await self.store.close()
        if self.view is not None:
            self.view.disconnected()

    def status(self) -> dict[str, Any]:
        """For ``/health`` and metrics: where, whether reached, how fresh, how many doors.

        Examples:
            >>> from fairagents.shared import SharedCounters, MemoryStore
            >>> SharedCounters(MemoryStore(), door="a").status()["connected"]
            False
        """
        age = None if self.last_sync is None else round(time.monotonic() - self.last_sync, 3)
        view = self.view
        return {"backend": self.describe(), "door": self.door, "connected": self.connected,
                "doors": view.doors if view is not None else 1, "last_sync_age": age,
                "syncs": self.syncs, "failures": self.failures,
                "leases": {} if view is None else view.leases()}

    async def _first_sync(self) -> bool:
        try:
            await self._sync_once(reconcile=True)
        except Exception as err:
            self._lost(err)
            return True
        return False

    async def _run(self, reconcile: bool) -> None:
        while not self._stopping:
            await asyncio.sleep(self.interval)
            # Until the store answers: exponential backoff from one interval up to 2 s, then a reconciling sync.
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(Exception),  # anything but cancellation: never die silently
                stop=lambda _: self._stopping,
                reraise=True,
                wait=wait_exponential(multiplier=self.interval, min=self.interval, max=2.0),
                before_sleep=lambda state: self._lost(state.outcome.exception() if state.outcome else None),
            ):
                with attempt:
                    await self._sync_once(reconcile=reconcile or not self.connected)
            reconcile = False

    async def _sync_once(self, *, reconcile: bool) -> None:
        view = self.view
        assert view is not None, "attach() before start()"
        was_connected = view.connected
        payload = view.payload(ttl=int(self.ttl * 1000), reconcile=reconcile)
        sent = time.monotonic()
        try:
            reply = await self.store.sync(payload)
            self.round_trips.append(time.monotonic() - sent)
            view.apply(reply)
        except StoreUnavailable:
            self.failures += 1  # its charges stay in flight and go out again with the next sync
            raise
        except Exception:
            self.failures += 1
            log.exception("fairagents.shared.sync_failed", store=self.describe(), door=self.door)
            raise
        self.syncs += 1
        self.last_sync = time.monotonic()
        if not was_connected:
            log.info("fairagents.shared.connected", store=self.describe(), door=self.door, doors=view.doors,
                     reconciled=reconcile)
        if self._after_sync is not None:
            self._after_sync()

    def _lost(self, err: BaseException | None) -> None:
        view = self.view
        if view is not None and (view.connected or self.syncs == 0 and self.failures == 1):
            log.warning("fairagents.shared.unreachable", store=self.describe(), door=self.door, error=str(err),
                        note="serving on this arbiter's own counters until the store is back")
        if view is not None:
            view.disconnected()
        if self._after_sync is not None:
            self._after_sync()

