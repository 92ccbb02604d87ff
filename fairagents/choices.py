"""The ``n`` choices of one request, run together: awaited, or streamed and merged; and what a stream was charged.

Each choice is a request of its own, charged to the caller and scheduled like any
other. :func:`all_choices` awaits them all (one failing cancels the others);
:class:`Choices` reads their streams together, in the order their deltas come; and
:func:`streamed_charge` prices a streamed request's choices as the ledger charged
them. The server (:mod:`fairagents.server`) and the in-process OpenAI client
(``fairagents_openai``) answer with them alike.

Examples:
    >>> import asyncio
    >>> from fairagents.choices import Choices
    >>> from fairagents.engines import Delta
    >>> async def one(text):
    ...     yield Delta(1, text, "stop")
    >>> async def first_events():
    ...     choices = Choices([one("a"), one("b")])
    ...     head = await choices.head()
    ...     await choices.aclose()
    ...     return sorted((i, d.text) for i, d in head if d is not None)
    >>> asyncio.run(first_events())
    [(0, 'a'), (1, 'b')]
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TypeVar

from fairagents.cost import CostModel, prompt_cost
from fairagents.engines.base import Delta

__all__ = ["Choices", "all_choices", "streamed_charge"]

T = TypeVar("T")


async def all_choices(works: list[Awaitable[T]]) -> list[T]:
    """Await the ``n`` choices of one request at once; when one fails, the others are cancelled and its error raised."""
    tasks = [asyncio.ensure_future(work) for work in works]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Choices:
    """The streams of a request's choices, read together.

    One is read as the response goes (a client that reads slowly holds its request
    back). Several are read at once, each by a task of its own, their events in the
    order they come: a choice waiting for dispatch behind another of the same request
    must not wait for the client to read that one.
    """

    def __init__(self, streams: list[AsyncIterator[Delta]]) -> None:
        self.n = len(streams)
        self._streams = streams
        self._open = set(range(self.n))
        self._events: asyncio.Queue[tuple[int, Delta | Exception | None]] | None = None
        self._pumps: list[asyncio.Future[None]] = []
        if self.n > 1:
            self._events = asyncio.Queue()
            self._pumps = [asyncio.ensure_future(self._pump(i, s)) for i, s in enumerate(streams)]

    async def _pump(self, index: int, stream: AsyncIterator[Delta]) -> None:
        assert self._events is not None
        try:
            async for delta in stream:
                self._events.put_nowait((index, delta))
        except Exception as err:  # the choice failed: its reader raises it
            self._events.put_nowait((index, err))
        else:
            self._events.put_nowait((index, None))

    async def next(self) -> tuple[int, Delta | None] | None:
        """The next event: ``(choice, delta)``, ``(choice, None)`` when that choice ended, ``None`` when all did.

        A choice's failure raises here.
        """
        if not self._open:
            return None
        if self._events is None:
            index, event = 0, await anext(self._streams[0], None)
        else:
            index, event = await self._events.get()
            if isinstance(event, Exception):
                raise event
        if event is None:
            self._open.discard(index)
        return index, event  # type: ignore[return-value]

    async def head(self) -> list[tuple[int, Delta | None]]:
        """The events up to the first of every choice: an answer starts once each has a token (or ended)."""
        seen: set[int] = set()
        events: list[tuple[int, Delta | None]] = []
        while len(seen) < self.n:
            event = await self.next()
            if event is None:
                break
            seen.add(event[0])
            events.append(event)
        return events

    async def aclose(self) -> None:
        """Stop reading: the choices still running are cancelled (charged only for what they produced)."""
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        for stream in self._streams:
            await stream.aclose()  # type: ignore[attr-defined]


def streamed_charge(cost: CostModel, model: str, prompt_tokens: int, produced: Sequence[int],
                    cached: Sequence[int], *, cached_priced: bool) -> float:
    """The unified tokens a streamed request's choices were charged: each its prompt and what it produced.

    ``cached[i]`` is how many of choice ``i``'s prompt tokens its engine read from its
    prefix cache, charged at ``w_cached`` where the engine reports them as it runs
    (``cached_priced``: an engine that schedules by the policy itself), else at ``w_input``.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.choices import streamed_charge
        >>> cost = fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=4096, n_layers=1)})
        >>> streamed_charge(cost, "m", 10, [4, 2], [0, 8], cached_priced=False)   # 2 × 10 + 2 × 6
        32.0
    """
    seen = cached if cached_priced else [0] * len(cached)
    return sum(prompt_cost(cost, model, prompt_tokens, min(hit, prompt_tokens)) + cost.output_cost(model, p)
               for p, hit in zip(produced, seen, strict=True))
