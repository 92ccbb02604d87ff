"""What a model call returns: the text, its usage in raw and unified tokens, and its timing."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from fairagents.tools import ToolCall

__all__ = ["ImageReply", "Reply", "Timing", "TokenLogprob", "Usage"]

#: The log probability reported for a token the model could not sample (OpenAI's and vLLM's floor; JSON has no -inf).
LOGPROB_FLOOR = -9999.0


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One output token with its log probability, and the most likely tokens in its place.

    Examples:
        >>> from fairagents.reply import TokenLogprob
        >>> token = TokenLogprob("hi", -0.25, top=(TokenLogprob("hi", -0.25), TokenLogprob("yo", float("-inf"))))
        >>> token.as_openai()["top_logprobs"][1]
        {'token': 'yo', 'logprob': -9999.0, 'bytes': [121, 111]}
    """

    token: str
    """The token's text."""
    logprob: float
    """Its log probability (natural log; ``-inf`` for a token the model could not have sampled)."""
    top: tuple[TokenLogprob, ...] = ()
    """The most likely tokens at this position, most likely first (as many as were asked for)."""

    @property
    def bytes(self) -> list[int]:
        """The token's text as UTF-8 bytes."""
        return list(self.token.encode("utf-8", errors="replace"))

    def as_openai(self) -> dict[str, Any]:
        """The token as an item of OpenAI's ``choices[].logprobs.content``."""
        return {**self._entry(), "top_logprobs": [t._entry() for t in self.top]}

    def _entry(self) -> dict[str, Any]:
        value = self.logprob if math.isfinite(self.logprob) else LOGPROB_FLOOR
        return {"token": self.token, "logprob": max(value, LOGPROB_FLOOR), "bytes": self.bytes}


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a call consumed.

    Examples:
        >>> from fairagents.reply import Usage
        >>> Usage(prompt_tokens=10, completion_tokens=5, unified_tokens=20.0).total_tokens
        15
    """

    prompt_tokens: int
    """Prompt length in the model's raw tokens."""
    completion_tokens: int
    """Tokens generated (raw)."""
    unified_tokens: float
    """What the call was charged: ``w_input·T(prompt) + w_output·T(completion)``; on a model whose engine
    schedules in itself, the prompt tokens read from its prefix cache at ``w_cached``."""
    cached_tokens: int = 0
    """Of the prompt, tokens the engine read from its prefix cache (in-process vLLM engines report them)."""

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens (raw)."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Timing:
    """Latencies of a call, in seconds from its arrival at the arbiter.

    Examples:
        >>> from fairagents.reply import Timing
        >>> t = Timing(queue_wait=0.5, ttft=0.75, e2e=2.0)
        >>> t.ttft - t.queue_wait, t.e2e - t.ttft   # prefill once dispatched, then decoding
        (0.25, 1.25)
    """

    queue_wait: float
    """Arrival to dispatch to the engine."""
    ttft: float | None
    """Arrival to the first output token (``None`` if none was produced)."""
    e2e: float
    """Arrival to the end."""


@dataclass(frozen=True, slots=True)
class Reply:
    """The result of a chat call.

    Examples:
        >>> from fairagents.reply import Reply, Timing, Usage
        >>> reply = Reply(text='{"city": "Oslo"}', finish_reason="stop", model="chat", request_id="r1",
        ...               usage=Usage(prompt_tokens=3, completion_tokens=6, unified_tokens=15.0),
        ...               timing=Timing(queue_wait=0.0, ttft=0.1, e2e=0.2))
        >>> reply.json()["city"], reply.usage.total_tokens
        ('Oslo', 9)
    """

    text: str
    """What the model said (without its tool calls: with only calls, ``""``)."""
    finish_reason: str
    """``"stop"`` (end of sequence or a stop string), ``"length"`` (``max_tokens``) or
    ``"tool_calls"`` (the model called tools)."""
    model: str
    request_id: str
    usage: Usage
    timing: Timing
    tool_calls: tuple[ToolCall, ...] = ()
    """The tools the model called (a chat call with ``tools``)."""
    logprobs: tuple[TokenLogprob, ...] | None = None
    """Every output token with its log probability, when the call asked for them
    (``logprobs=True``); ``None`` otherwise. With tools they cover the whole output,
    tool calls' text included."""

    def json(self) -> Any:
        """The text decoded as JSON (a call with a JSON ``response_format``).

        Raises :class:`json.JSONDecodeError` when it is not JSON (the model was cut
        short by ``max_tokens``, or no JSON format was asked for).
        """
        return json.loads(self.text)


@dataclass(frozen=True, slots=True)
class ImageReply:
    """The result of an image-generation call.

    ``usage.completion_tokens`` counts the denoiser's latent tokens (latent patches ×
    steps × images); ``timing.ttft`` is the time to the first denoising step.

    Examples:
        >>> import io
        >>> from PIL import Image
        >>> from fairagents.reply import ImageReply, Timing, Usage
        >>> buf = io.BytesIO(); Image.new("RGB", (8, 8)).save(buf, "PNG")
        >>> reply = ImageReply(images=[Image.new("RGB", (8, 8))], png=[buf.getvalue()], finish_reason="stop",
        ...                    model="painter", request_id="r2", usage=Usage(12, 64, 200.0),
        ...                    timing=Timing(queue_wait=0.0, ttft=0.3, e2e=1.5))
        >>> reply.images[0].size, reply.png[0][:4]   # e.g. Path("out.png").write_bytes(reply.png[0])
        ((8, 8), b'\x89PNG')
    """

    images: list[Any]
    """The images, as ``PIL.Image.Image``."""
    png: list[bytes]
    """The same images encoded as PNG."""
    finish_reason: str
    """``"stop"`` when all steps ran."""
    model: str
    request_id: str
    usage: Usage
    timing: Timing
