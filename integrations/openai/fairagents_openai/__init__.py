"""fairagents for OpenAI-client code: :class:`AsyncFairOpenAI` and :class:`FairOpenAI`, drop-in clients.

Examples:
    >>> import fairagents_openai
    >>> fairagents_openai.__all__
    ['AsyncFairOpenAI', 'ChatCompletionEventStream', 'ChatCompletionStream', 'ChatCompletionSyncEventStream', 'ChatCompletionSyncStream', 'FairOpenAI', 'RawResponse']
"""

from __future__ import annotations

from fairagents_openai._events import ChatCompletionEventStream, ChatCompletionSyncEventStream
from fairagents_openai._local import ChatCompletionStream
from fairagents_openai.client import AsyncFairOpenAI, ChatCompletionSyncStream, FairOpenAI, RawResponse

__all__ = [
    "AsyncFairOpenAI",
    "ChatCompletionEventStream",
    "ChatCompletionStream",
    "ChatCompletionSyncEventStream",
    "ChatCompletionSyncStream",
    "FairOpenAI",
    "RawResponse",
]
