"""fairagents for OpenAI-client code: :class:`AsyncFairOpenAI`, a drop-in async client.

Examples:
    >>> import fairagents_openai
    >>> fairagents_openai.__all__
    ['AsyncFairOpenAI', 'ChatCompletionStream']
"""

from __future__ import annotations

from fairagents_openai._local import ChatCompletionStream
from fairagents_openai.client import AsyncFairOpenAI

__all__ = ["AsyncFairOpenAI", "ChatCompletionStream"]
