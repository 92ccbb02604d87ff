"""fairagents for OpenAI-client code: :class:`AsyncFairOpenAI` and :class:`FairOpenAI`, drop-in clients.

They serve through an arbiter in this process, or through a fairagents server; the
module :mod:`fairagents_openai.client` tells how.
"""

from __future__ import annotations

from fairagents_openai._events import ChatCompletionEventStream, ChatCompletionSyncEventStream
from fairagents_openai._local import ChatCompletionStream, ChatCompletionSyncStream
from fairagents_openai.client import AsyncFairOpenAI, FairOpenAI, RawResponse

__all__ = [
    "AsyncFairOpenAI",
    "ChatCompletionEventStream",
    "ChatCompletionStream",
    "ChatCompletionSyncEventStream",
    "ChatCompletionSyncStream",
    "FairOpenAI",
    "RawResponse",
]
