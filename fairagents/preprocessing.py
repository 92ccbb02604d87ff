"""Modality-aware preprocessing (DuetInfer): image work runs in its own pool, off the event loop.

Decoding, resizing and tokenising images takes milliseconds to tenths of a second per
image on a CPU; run on the event loop, it would stall every other request's dispatch
and streaming behind it (head-of-line blocking in preprocessing, DuetInfer §III-B). So
a request that carries images is prepared by a :class:`Preprocessor`: a pool of worker
threads with its own bounded queue. Text requests are prepared on the loop as before
(tokenising text is cheap) and never wait behind it.

A request keeps the time it arrived: the arbiter reads the clock when the call comes
in, and queues the request with that arrival once preprocessing is done, so its place
is not pushed back by its own preprocessing (DuetInfer's ablation saw multimodal TTFT
grow when requests entered the queue later than they arrived).

``inline=True`` prepares on the event loop instead. It exists only so that
``fairagents bench modality`` can measure what the pool saves.

Examples:
    >>> import asyncio
    >>> from fairagents.preprocessing import Preprocessor
    >>> async def main():
    ...     pool = Preprocessor(workers=1, max_pending=4)
    ...     try:
    ...         return await pool.run(sum, [1, 2, 3])
    ...     finally:
    ...         pool.close()
    >>> asyncio.run(main())
    6
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

from fairagents.errors import InvalidParameterError, OverloadedError

__all__ = ["Preprocessor"]

T = TypeVar("T")


class Preprocessor:
    """A bounded pool of worker threads for CPU-heavy preparation of requests.

    Args:
        workers: worker threads (image decoding in PIL and NumPy releases the GIL, so
            threads run in parallel with the event loop).
        max_pending: most preparations queued or running at once; one more raises
            :class:`~fairagents.errors.OverloadedError` at once.
        inline: prepare on the calling (event-loop) thread instead: for benchmarks only.

    Examples:
        >>> from fairagents.preprocessing import Preprocessor
        >>> Preprocessor(workers=0)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: workers must be an integer ≥ 1, got 0
    """

    def __init__(self, workers: int = 2, max_pending: int = 256, *, inline: bool = False) -> None:
        for what, value in (("workers", workers), ("max_pending", max_pending)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(f"{what} must be an integer ≥ 1, got {value!r}")
        self.workers = workers
        self.max_pending = max_pending
        self.inline = inline
        self.pending = 0
        """Preparations queued or running now."""
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the pool (or inline), without blocking the event loop."""
        if self.inline:
            return fn(*args)
        if self.pending >= self.max_pending:
            raise OverloadedError(
                f"{self.pending} requests are waiting for image preprocessing, the bound; retry later", retry_after=0.5
            )
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="fairagents-preprocess")
        self.pending += 1
        try:
            return await asyncio.wrap_future(self._pool.submit(fn, *args))
        finally:
            self.pending -= 1

    def close(self) -> None:
        """Drop queued preparations and let the workers exit (running ones finish)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
