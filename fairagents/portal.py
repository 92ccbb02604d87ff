"""Calling an arbiter from any event loop, or from sync code.

An :class:`~fairagents.Arbiter` and its engines belong to the event loop they started
on. A :class:`Portal` lets code elsewhere call it safely:

- from the arbiter's own loop, a call is awaited directly;
- from another event loop (another thread, or a loop a framework made), the call runs
  on the arbiter's loop and the caller awaits its result on its own; cancelling the
  caller cancels the call (and its request) on the arbiter's side;
- from sync code, the call runs on the arbiter's loop and the thread blocks until the
  result is back. An arbiter not started yet is started on a loop thread of the
  portal's own (closed by :meth:`Portal.close`, or at exit), so a script with no event
  loop at all can use it.

A call that cannot be served says so instead of waiting forever: the arbiter's loop
has ended or is not running (:class:`~fairagents.ShutdownError`), or a sync call was made
from the arbiter's own loop, which it would block (:class:`~fairagents.errors.ProtocolError`).

Examples:
    >>> import fairagents as fa
    >>> from fairagents.portal import Portal
    >>> from fairagents.testing import FakeEngine
    >>> arbiter = fa.Arbiter()
    >>> arbiter.add_model("chat", FakeEngine())
    >>> bot = arbiter.app("demo").agent("bot")
    >>> portal = Portal(arbiter)
    >>> portal.run_sync(bot.chat, "chat", [{"role": "user", "content": "hi"}], max_tokens=2).text
    't0 t1 '
    >>> portal.close()
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from fairagents.errors import ProtocolError, ShutdownError

if TYPE_CHECKING:
    from fairagents.arbiter import Arbiter

__all__ = ["Portal"]

T = TypeVar("T")

_owned: weakref.WeakSet[Portal] = weakref.WeakSet()  # portals running a loop thread, closed at exit


class Portal:
    """Calls into ``arbiter`` from any event loop or thread (see the module docs).

    Args:
        arbiter: the arbiter to call. If it is not started when the first call comes,
            the portal starts it on a loop thread of its own.

    Examples:
        >>> import asyncio
        >>> import fairagents as fa
        >>> from fairagents.portal import Portal
        >>> from fairagents.testing import FakeEngine
        >>> arbiter = fa.Arbiter()
        >>> arbiter.add_model("chat", FakeEngine())
        >>> portal = Portal(arbiter)
        >>> async def elsewhere():   # a loop of its own: the arbiter runs on the portal's thread
        ...     return await portal.run(arbiter.chat, "chat", [{"role": "user", "content": "hi"}],
        ...                             agent=arbiter.app("a").agent("b"), max_tokens=1)
        >>> asyncio.run(elsewhere()).text
        't0 '
        >>> portal.close()
    """

    def __init__(self, arbiter: Arbiter) -> None:
        self.arbiter = arbiter
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None  # a loop thread of the portal's, when it started one
        self._thread: threading.Thread | None = None

    # -- calls ---------------------------------------------------------------------------

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` on the arbiter's loop, from any event loop."""
        loop = await asyncio.to_thread(self._target) if self._needs_start() else self._target()
        if _running() is loop:
            return await fn(*args, **kwargs)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_call(fn, args, kwargs), loop))

    async def iterate(self, fn: Callable[..., AsyncIterator[T]], *args: Any, **kwargs: Any) -> AsyncIterator[T]:
        """Iterate ``fn(*args, **kwargs)`` (an async iterator) on the arbiter's loop, from any event loop.

        Leaving the iteration early closes the iterator on the arbiter's loop (a
        stream's request is then cancelled there).
        """
        loop = await asyncio.to_thread(self._target) if self._needs_start() else self._target()
        if _running() is loop:
            async with contextlib.aclosing(fn(*args, **kwargs)) as items:  # type: ignore[type-var]
                async for item in items:
                    yield item
            return
        items = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_start(fn, args, kwargs), loop))
        try:
            while True:
                try:
                    item = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_next(items), loop))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_close(items), loop))

    def run_sync(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the arbiter's loop and block this thread until it is done."""
        loop = self._target()
        self._not_on(loop)
        return asyncio.run_coroutine_threadsafe(_call(fn, args, kwargs), loop).result()

    def iterate_sync(self, fn: Callable[..., AsyncIterator[T]], *args: Any, **kwargs: Any) -> Iterator[T]:
        """Iterate ``fn(*args, **kwargs)`` on the arbiter's loop from sync code, an item at a time.

        Closing the returned iterator early closes ``fn``'s iterator on the arbiter's loop.
        """
        loop = self._target()
        self._not_on(loop)
        items = asyncio.run_coroutine_threadsafe(_start(fn, args, kwargs), loop).result()
        try:
            while True:
                try:
                    item = asyncio.run_coroutine_threadsafe(_next(items), loop).result()
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    asyncio.run_coroutine_threadsafe(_close(items), loop).result()

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def owns_loop(self) -> bool:
        """Whether the arbiter runs on a loop thread this portal started."""
        return self._thread is not None

    def close(self) -> None:
        """If the portal started the arbiter, close it (engines stopped) and end the loop thread; idempotent."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.arbiter.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        _owned.discard(self)

    def _needs_start(self) -> bool:
        return self.arbiter.loop is None

    def _target(self) -> asyncio.AbstractEventLoop:
        """The arbiter's running loop, starting the arbiter on a loop thread of the portal's if needed."""
        with self._lock:
            loop = self.arbiter.loop
            if loop is None:
                loop = self._start_thread()
        if loop.is_closed() or not loop.is_running():
            raise ShutdownError(
                "the arbiter's event loop is not running (it ended, or is between runs): start the arbiter on a "
                "loop that keeps running, or let the portal start it (pass an arbiter that is not started)")
        return loop

    def _start_thread(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="fairagents-arbiter", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.arbiter.start(), loop).result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            raise
        self._loop, self._thread = loop, thread
        _owned.add(self)
        return loop

    @staticmethod
    def _not_on(loop: asyncio.AbstractEventLoop) -> None:
        if _running() is loop:
            raise ProtocolError("a sync call from the arbiter's own event loop would block it: use the async API")


def _running() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _call(fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    return await fn(*args, **kwargs)


async def _start(fn: Callable[..., AsyncIterator[T]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> AsyncIterator[T]:
    return fn(*args, **kwargs)


async def _next(items: AsyncIterator[T]) -> T:
    return await items.__anext__()


async def _close(items: AsyncIterator[Any]) -> None:
    aclose = getattr(items, "aclose", None)
    if aclose is not None:
        await aclose()


@atexit.register
def _close_owned() -> None:
    for portal in list(_owned):
        portal.close()
