"""Calling an arbiter from any event loop, or from sync code.

An :class:`~fairagents.Arbiter` and its engines belong to the event loop they started
on. A :class:`Portal` lets code elsewhere call it safely: from the arbiter's own loop a
call is awaited directly; from another loop (another thread, or a loop a framework
made) it runs on the arbiter's loop while the caller awaits the result on its own, and
cancelling the caller cancels the call; from sync code the thread blocks until the
result is back (``KeyboardInterrupt`` cancels the request).

An arbiter not running is started on a loop thread of the portal's own at its first
call, so a script with no event loop can use it; :meth:`Portal.close` (or the program's
exit, before Python's thread pools shut down) closes it. Portals onto one arbiter agree
on who starts it (:class:`~fairagents.runtime.lifecycle.Lifecycle`): a call that comes
while the arbiter is starting waits for that start. A call that cannot be served says
so instead of waiting forever: the arbiter's loop has ended (:class:`~fairagents.ShutdownError`),
or a sync call was made from the arbiter's own loop (:class:`~fairagents.errors.ProtocolError`).

Examples:
    >>> import fairagents as fa
    >>> from fairagents.runtime.portal import Portal
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
import concurrent.futures
import concurrent.futures.thread  # its exit hook is registered first, so ours runs before it
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from fairagents.errors import ProtocolError, ShutdownError

if TYPE_CHECKING:
    from fairagents.runtime.arbiter import Arbiter

__all__ = ["Portal"]

T = TypeVar("T")

_owned: set[Portal] = set()  # portals running a loop thread: closed at exit unless closed before
_owned_lock = threading.Lock()
_exiting = False
_stopping: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()  # loops a close is stopping: send nothing
_POLL = 0.5  # seconds between checks, while a call waits, that the arbiter's loop has not ended under it
_SETTLE = 5.0  # seconds a closing loop gives what was sent to it before cancelling it


class Portal:
    """Calls into ``arbiter`` from any event loop or thread (see the module docs).

    Args:
        arbiter: the arbiter to call. If it is not running (never started, or closed with its loop) when a
            call comes, the portal starts it on a loop thread of its own.

    Examples:
        >>> import asyncio
        >>> import fairagents as fa
        >>> from fairagents.runtime.portal import Portal
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
        self._loop: asyncio.AbstractEventLoop | None = None  # a loop thread of the portal's, when it started one
        self._thread: threading.Thread | None = None
        self._closed = False
        self._close_lock = threading.Lock()  # one close at a time; a second waits for the first

    # -- calls ---------------------------------------------------------------------------

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` on the arbiter's loop, from any event loop."""
        loop = await self._target_async()
        call = _call(self.arbiter, fn, args, kwargs)
        if _running() is loop:
            return await call
        return await _await(self._send(call, loop), loop)

    async def iterate(self, fn: Callable[..., AsyncIterator[T]], *args: Any, **kwargs: Any) -> AsyncIterator[T]:
        """Iterate ``fn(*args, **kwargs)`` (an async iterator) on the arbiter's loop, from any event loop.

        Leaving the iteration early closes the iterator on the arbiter's loop (a
        stream's request is then cancelled there).
        """
        loop = await self._target_async()
        if _running() is loop:
            await self.arbiter.lifecycle.until_started()
            async with contextlib.aclosing(fn(*args, **kwargs)) as items:  # type: ignore[type-var]
                async for item in items:
                    yield item
            return
        cursor = await _await(self._send(_open(self.arbiter, fn, args, kwargs), loop), loop)
        try:
            while True:
                try:
                    item = await _await(self._send(cursor.next(), loop), loop)
                except StopAsyncIteration:
                    return
                yield item
        finally:
            closing = self._send_if_running(cursor.close(), loop)
            if closing is not None:  # shielded: a cancelled caller still closes the stream it leaves
                with contextlib.suppress(ShutdownError):
                    await asyncio.shield(_await(closing, loop))

    def run_sync(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the arbiter's loop and block this thread until it is done."""
        loop = self._target()
        self._not_on(loop)
        return _wait(self._send(_call(self.arbiter, fn, args, kwargs), loop), loop)

    def iterate_sync(self, fn: Callable[..., AsyncIterator[T]], *args: Any, **kwargs: Any) -> Iterator[T]:
        """Iterate ``fn(*args, **kwargs)`` on the arbiter's loop from sync code, an item at a time.

        Closing the returned iterator early closes ``fn``'s iterator on the arbiter's loop.
        """
        loop = self._target()
        self._not_on(loop)
        cursor = _wait(self._send(_open(self.arbiter, fn, args, kwargs), loop), loop)
        try:
            while True:
                try:
                    item = _wait(self._send(cursor.next(), loop), loop)
                except StopAsyncIteration:
                    return
                yield item
        finally:
            closing = self._send_if_running(cursor.close(), loop)
            if closing is not None and _running() is not loop:  # finalized on that loop (by the GC): no waiting
                with contextlib.suppress(ShutdownError):
                    _wait(closing, loop)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Make sure the arbiter runs, from sync code: if nobody started it, start it on a loop thread of the
        portal's; if it is starting elsewhere, wait for that. Calls do this themselves; this is for code
        that needs the engines up before its first call (their tokenizers, say).

        Raises:
            ShutdownError: the start failed (its error is the cause), or the arbiter's loop has ended.

        Examples:
            >>> import fairagents as fa
            >>> from fairagents.runtime.portal import Portal
            >>> from fairagents.testing import FakeEngine
            >>> arbiter = fa.Arbiter()
            >>> arbiter.add_model("chat", FakeEngine())
            >>> portal = Portal(arbiter)
            >>> portal.start()
            >>> portal.owns_loop, arbiter.engine("chat").started
            (True, True)
            >>> portal.close()
        """
        loop = self._target()
        self._not_on(loop)
        _wait(self._send(self.arbiter.lifecycle.until_started(), loop), loop)

    @property
    def owns_loop(self) -> bool:
        """Whether the arbiter runs on a loop thread this portal started."""
        return self._thread is not None

    def close(self) -> None:
        """Close the portal; if it started the arbiter, close that too (engines stopped) and end its loop thread.

        Idempotent. Calls still arriving meanwhile end with :class:`~fairagents.ShutdownError`
        (none waits forever), and so do later calls through this portal; a new portal onto
        the arbiter starts it again.

        Raises:
            ProtocolError: called on the arbiter's own loop, which it would block.
        """
        self._not_on(self._loop)
        with self._close_lock:
            with self.arbiter.lifecycle.portal_lock:  # a start under way ends first; none begins after
                self._closed = True
                loop, thread = self._loop, self._thread
            if loop is None or thread is None:
                return
            try:
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(self.arbiter.close(), loop).result()
            finally:  # even when interrupted: the loop is stopped and its thread ended
                _stop(self.arbiter, loop, thread)
                self._loop = self._thread = None
                with _owned_lock:
                    _owned.discard(self)

    async def _target_async(self) -> asyncio.AbstractEventLoop:
        self._check_open()
        loop = self.arbiter.loop
        if loop is not None and loop.is_running():
            return loop
        if _exiting:
            raise ShutdownError("the program is exiting: the arbiter is not started again")
        return await asyncio.to_thread(self._target)  # starting takes as long as the engines: off the caller's loop

    def _target(self) -> asyncio.AbstractEventLoop:
        """The arbiter's running loop, starting the arbiter on a loop thread of the portal's if needed."""
        self._check_open()
        loop = self.arbiter.loop
        if loop is not None and loop.is_running():  # running, or starting there: calls wait for the start
            return loop
        with self.arbiter.lifecycle.portal_lock:  # one lock per arbiter: every portal onto it agrees on who starts it
            self._check_open()
            loop = self.arbiter.loop
            # never started, or closed with its loop
            if loop is None or (loop.is_closed() and self.arbiter.lifecycle.closed):
                if _exiting:
                    raise ShutdownError("the program is exiting: the arbiter is not started again")
                loop = self._start_thread()
        if loop.is_closed() or not loop.is_running():
            raise ShutdownError(
                "the arbiter's event loop is not running (it ended, or is between runs): start the arbiter on a "
                "loop that keeps running, or let the portal start it (pass an arbiter that is not running: never "
                "started, or closed with its loop)")
        return loop

    def _send(self, coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop) -> concurrent.futures.Future[T]:
        """Run ``coro`` on ``loop``; :class:`ShutdownError` (``coro`` dropped) when the loop stopped meanwhile."""
        future = self._send_if_running(coro, loop)
        if future is None:
            raise ShutdownError("the arbiter's event loop stopped (the arbiter was closed)")
        return future

    def _send_if_running(self, coro: Coroutine[Any, Any, T],
                         loop: asyncio.AbstractEventLoop) -> concurrent.futures.Future[T] | None:
        # a close marks its loop stopping under this lock: nothing sent is left unrun
        with self.arbiter.lifecycle.send_lock:
            if loop.is_running() and loop not in _stopping:
                return asyncio.run_coroutine_threadsafe(coro, loop)
        coro.close()
        return None

    def _start_thread(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="fairagents-arbiter", daemon=True)
        thread.start()
        started = None
        try:
            started = asyncio.run_coroutine_threadsafe(self.arbiter.start(), loop)
            started.result()
            with _owned_lock:  # the program's exit may have begun during the start: then it is undone here
                if not _exiting:
                    _owned.add(self)
                    self._loop, self._thread = loop, thread
                    return loop
            raise ShutdownError("the program is exiting: the arbiter is not started again")
        except BaseException:
            # It failed, this thread was interrupted (Ctrl-C), or the program exits: the start unwinds on its loop
            # (a start cancelled half-way stops the engines it started) before the loop ends: nothing is left running.
            if started is not None:
                started.cancel()
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(_unwind(self.arbiter), loop).result()
            _stop(self.arbiter, loop, thread)
            raise

    def _check_open(self) -> None:
        if self._closed:
            raise ShutdownError("this portal is closed (a new Portal onto the arbiter starts it again)")

    @staticmethod
    def _not_on(loop: asyncio.AbstractEventLoop | None) -> None:
        if loop is not None and _running() is loop:
            raise ProtocolError("a sync call from the arbiter's own event loop would block it: use the async API")


class _Cursor(Generic[T]):
    """An async iterator on the arbiter's loop, stepped from elsewhere; closing it ends a step under way first."""

    def __init__(self, items: AsyncIterator[T]) -> None:
        self._items = items
        self._step: asyncio.Task[T] | None = None

    async def next(self) -> T:
        self._step = asyncio.ensure_future(_anext(self._items))
        return await self._step  # cancelling the caller cancels the step

    async def close(self) -> None:
        step, self._step = self._step, None
        if step is not None and not step.done():  # the caller gave up mid-step: let the step unwind first
            step.cancel()
            await asyncio.wait([step])
        aclose = getattr(self._items, "aclose", None)
        if aclose is not None:
            await aclose()


def _running() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _wait(future: concurrent.futures.Future[T], loop: asyncio.AbstractEventLoop) -> T:
    """``future``'s result, for a sync caller.

    A waiter interrupted (``KeyboardInterrupt``) cancels the call on the arbiter's loop.
    A call the loop dropped (it ended, or a close cancelled what was left) is a
    :class:`ShutdownError`, never a wait without end.
    """
    try:
        while True:
            try:
                return future.result(timeout=_POLL)
            except TimeoutError:
                if future.done():  # the call's own TimeoutError
                    raise
                if loop.is_closed():
                    break
    except concurrent.futures.CancelledError:
        raise ShutdownError("the arbiter's event loop ended before the call did (it was closed)") from None
    except BaseException:
        if not loop.is_closed():
            future.cancel()
        raise
    raise ShutdownError("the arbiter's event loop ended before the call did")


async def _await(future: concurrent.futures.Future[T], loop: asyncio.AbstractEventLoop) -> T:
    """``future``'s result, for a caller on another event loop (cancelling the caller cancels the call).

    As :func:`_wait`: a call the arbiter's loop dropped is a :class:`ShutdownError`.
    """
    waiting = asyncio.wrap_future(future)
    while True:
        try:
            done, _ = await asyncio.wait([waiting], timeout=_POLL)
        except asyncio.CancelledError:  # the caller is cancelled: so is the call, on the arbiter's loop
            if not loop.is_closed():
                waiting.cancel()
            raise
        if done:
            break
        if loop.is_closed():  # (nothing to cancel there any more)
            raise ShutdownError("the arbiter's event loop ended before the call did")
    if waiting.cancelled():  # not by this caller (that would have raised above): by the loop's close
        raise ShutdownError("the arbiter's event loop ended before the call did (it was closed)")
    return waiting.result()


def _stop(arbiter: Arbiter, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """End a portal's loop: let what was sent to it end (bounded), stop it, end its thread, close it.

    The loop settles on its own thread, so this works from any thread, one running
    another event loop included.
    """
    with arbiter.lifecycle.send_lock:  # nothing is sent after this; what was sent before is settled below
        _stopping.add(loop)
    settling = asyncio.run_coroutine_threadsafe(_settle(), loop)
    with contextlib.suppress(concurrent.futures.TimeoutError):
        settling.result(timeout=3 * _SETTLE)
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


async def _settle() -> None:
    """Give what is left on a closing loop (calls sent just before the close: the arbiter is closed, so they end
    with ShutdownError) a few seconds to end, then cancel it; never waits without end."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _SETTLE
    while (left := deadline - loop.time()) > 0:
        await asyncio.sleep(0)  # calls sent just before the close make their tasks
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        if not tasks:
            break
        await asyncio.wait(tasks, timeout=left)
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    for task in leftover:
        task.cancel()
    if leftover:
        await asyncio.wait(leftover, timeout=_SETTLE)
    await loop.shutdown_asyncgens()


async def _unwind(arbiter: Arbiter) -> None:
    """After a start was cancelled: wait for it to end, and close the arbiter if it got to start."""
    with contextlib.suppress(Exception):
        await arbiter.lifecycle.until_started()
    if arbiter.lifecycle.started:
        await arbiter.close()


async def _call(arbiter: Arbiter, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> T:
    await arbiter.lifecycle.until_started()
    return await fn(*args, **kwargs)


async def _open(arbiter: Arbiter, fn: Callable[..., AsyncIterator[T]], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> _Cursor[T]:
    await arbiter.lifecycle.until_started()
    return _Cursor(fn(*args, **kwargs))


async def _anext(items: AsyncIterator[T]) -> T:
    return await items.__anext__()


def _close_owned() -> None:
    global _exiting
    with _owned_lock:
        _exiting = True  # a call still made by a thread that outlives the main one is refused, not a new start
        portals = list(_owned)
    for portal in portals:
        portal.close()


# At exit, before concurrent.futures refuses new work (engines stop through asyncio.to_thread):
# threading's exit hooks run last-registered first, and concurrent.futures.thread registered its own on import.
threading._register_atexit(_close_owned)  # type: ignore[attr-defined]
