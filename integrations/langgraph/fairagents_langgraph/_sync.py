"""Sync calls into an arbiter that lives on an event loop in another thread.

An in-process arbiter and its engines belong to the event loop they started on. A sync
caller (a sync LangGraph node, which an async run puts in a worker thread) hands each
coroutine to that loop and blocks its own thread until the result is back.

Examples:
    >>> import asyncio, threading
    >>> loop = asyncio.new_event_loop()
    >>> thread = threading.Thread(target=loop.run_forever, daemon=True); thread.start()
    >>> async def numbers():
    ...     for i in range(3):
    ...         yield i
    >>> list(iterate(loop, numbers()))
    [0, 1, 2]
    >>> _ = loop.call_soon_threadsafe(loop.stop); thread.join(); loop.close()
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["iterate", "run"]

T = TypeVar("T")


def _check(loop: asyncio.AbstractEventLoop | None) -> asyncio.AbstractEventLoop:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "a sync call (invoke, stream) inside a running event loop would block it: use ainvoke or astream"
        )
    if loop is None or not loop.is_running():
        raise RuntimeError(
            "the arbiter runs on an event loop, and this sync call does not know it: run the graph with "
            "ainvoke/astream (sync nodes then find it), or pass loop= to ChatFairAgents"
        )
    return loop


def run(loop: asyncio.AbstractEventLoop | None, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop`` (running in another thread) and wait for its result."""
    try:
        loop = _check(loop)
    except RuntimeError:
        coro.close()
        raise
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def iterate(loop: asyncio.AbstractEventLoop | None, items: AsyncIterator[T]) -> Iterator[T]:
    """Iterate ``items`` on ``loop`` (running in another thread), one item at a time.

    Closing the returned iterator early closes ``items`` on its loop.
    """

    async def step() -> T:
        return await items.__anext__()

    async def close() -> None:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()

    loop = _check(loop)
    try:
        while True:
            try:
                item = asyncio.run_coroutine_threadsafe(step(), loop).result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        asyncio.run_coroutine_threadsafe(close(), loop).result()
