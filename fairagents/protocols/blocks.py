"""An answer as content blocks: its text, then its tool calls, each opened, grown and closed.

Anthropic's Messages and OpenAI's Responses stream an answer as blocks (``content_block_*``,
``response.output_item.*``) where chat completions stream bare deltas. :class:`Blocks` reads a
choice's :class:`~fairagents.engines.Delta` events and says when a block starts, grows and
stops; :func:`reply_blocks` gives the blocks of a whole reply. Each protocol only renders them.

Examples:
    >>> from fairagents.engines import Delta
    >>> from fairagents.protocols.blocks import Blocks
    >>> from fairagents.tools import ToolCallDelta
    >>> blocks = Blocks()
    >>> events = blocks.feed(Delta(2, "Let me look.")) + blocks.feed(Delta(3, tool_calls=(
    ...     ToolCallDelta(0, id="call_1", name="weather"), ToolCallDelta(0, arguments='{"city": "Oslo"}'))))
    >>> [(e.kind, e.block.kind, e.piece) for e in events + blocks.close()]  # doctest: +NORMALIZE_WHITESPACE
    [('start', 'text', ''), ('delta', 'text', 'Let me look.'), ('stop', 'text', ''), ('start', 'call', ''),
     ('delta', 'call', '{"city": "Oslo"}'), ('stop', 'call', '')]
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Literal, Protocol

from fairagents.choices import Choices
from fairagents.engines.base import Delta
from fairagents.reply import Reply

__all__ = ["Block", "BlockEvent", "Blocks", "Ended", "Used", "answer_events", "reply_blocks"]


class Used(Protocol):
    """What a request used, as the server's usage record carries it (each protocol renders it its way)."""

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def unified_tokens(self) -> float: ...
    @property
    def cached_tokens(self) -> int: ...


@dataclass(slots=True)
class Block:
    """One block of an answer: text, or one tool call (its ``text`` is then the call's JSON arguments)."""

    kind: Literal["text", "call"]
    index: int
    """Its place among the answer's blocks, from 0."""
    text: str = ""
    id: str | None = None
    """The call's id (a call)."""
    name: str | None = None
    """The function called (a call)."""


@dataclass(frozen=True, slots=True)
class BlockEvent:
    """A block started, grew by ``piece``, or stopped."""

    kind: Literal["start", "delta", "stop"]
    block: Block
    piece: str = ""


@dataclass(slots=True)
class Blocks:
    """The blocks of one streamed choice, told as its deltas come (:meth:`feed`), and at its end (:meth:`close`)."""

    done: list[Block] = field(default_factory=list)
    """Every block so far, the open one last."""
    _open: Block | None = None
    _calls: dict[int, Block] = field(default_factory=dict)  # the call's index in the stream -> its block

    def feed(self, delta: Delta) -> list[BlockEvent]:
        """The events ``delta`` makes: text grows the open text block (or starts one), a call's first piece starts
        its block, later pieces grow it."""
        events: list[BlockEvent] = []
        if delta.text:
            if self._open is None or self._open.kind != "text":
                events += self._start(Block("text", len(self.done)))
            events.append(self._grow(self._open, delta.text))  # type: ignore[arg-type]
        for piece in delta.tool_calls:
            block = self._calls.get(piece.index)
            if block is None:
                block = self._calls[piece.index] = Block("call", len(self.done), id=piece.id, name=piece.name)
                events += self._start(block)
            if piece.arguments:
                events.append(self._grow(block, piece.arguments))
        return events

    def close(self) -> list[BlockEvent]:
        """The stop of the open block, if one is."""
        if self._open is None:
            return []
        block, self._open = self._open, None
        return [BlockEvent("stop", block)]

    def _start(self, block: Block) -> list[BlockEvent]:
        events = self.close()
        self._open = block
        self.done.append(block)
        return [*events, BlockEvent("start", block)]

    @staticmethod
    def _grow(block: Block, piece: str) -> BlockEvent:
        block.text += piece
        return BlockEvent("delta", block, piece)


def reply_blocks(reply: Reply) -> list[Block]:
    """The blocks of a whole reply: its text (if any), then its calls.

    Examples:
        >>> from fairagents.protocols.blocks import reply_blocks
        >>> from fairagents.reply import Reply, Timing, Usage
        >>> from fairagents.tools import ToolCall
        >>> reply = Reply("", "tool_calls", "chat", "r1", Usage(3, 6, 15.0), Timing(0.0, 0.1, 0.2),
        ...               tool_calls=(ToolCall("call_1", "weather", "{}"),))
        >>> [(b.kind, b.name, b.text) for b in reply_blocks(reply)]
        [('call', 'weather', '{}')]
    """
    blocks = [Block("text", 0, reply.text)] if reply.text else []
    blocks += [Block("call", len(blocks) + i, call.arguments, call.id, call.name) for i, call in enumerate(reply.tool_calls)]
    return blocks


@dataclass(frozen=True, slots=True)
class Ended:
    """The last event of a streamed answer: why it ended, what it produced, and its blocks."""

    finish_reason: str
    """``"stop"``, ``"length"`` or ``"tool_calls"``."""
    produced: int
    """Output tokens."""
    cached: int
    """Prompt tokens read from the prefix cache."""
    blocks: list[Block]


async def answer_events(streams: Choices, head: list[tuple[int, Delta | None]]) -> AsyncGenerator[BlockEvent | Ended, None]:
    """The block events of a one-choice stream from its first events (``head``) on, :class:`Ended` last.

    The stream is closed however the reading ends; an error of the engine mid-stream is raised
    (its protocol tells the client in its own shape).
    """
    blocks, produced, cached, finish = Blocks(), 0, 0, None
    pending = list(head)
    try:
        while True:
            event = pending.pop(0) if pending else await streams.next()
            if event is None:
                break
            delta = event[1]
            if delta is None:
                continue
            produced += delta.new_tokens
            cached = delta.cached_tokens or cached
            finish = delta.finish_reason or finish
            for told in blocks.feed(delta):
                yield told
    finally:
        await streams.aclose()
    for told in blocks.close():
        yield told
    yield Ended(finish or "stop", produced, cached, blocks.done)
