"""LangChain messages as the OpenAI-style dicts the arbiter and a fairagents server take.

Examples:
    >>> from langchain_core.messages import HumanMessage, SystemMessage
    >>> to_openai([SystemMessage("be brief"), HumanMessage([{"type": "text", "text": "hi"}])])
    ([{'role': 'system', 'content': 'be brief'}, {'role': 'user', 'content': 'hi'}], False)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, convert_to_openai_messages

from fairagents.errors import InvalidParameterError

__all__ = ["to_openai"]

_PARTS = {"text", "image_url"}
# An earlier turn's reasoning, as some providers return it: no chat template takes it back, so it is left out.
_REASONING = {"thinking", "redacted_thinking", "reasoning"}


def to_openai(messages: Sequence[BaseMessage]) -> tuple[list[dict[str, Any]], bool]:
    """The messages as OpenAI chat dicts, and whether any of them carries an image.

    Text-only content becomes a plain string (what a text model takes); a message with
    images keeps its parts, images as ``image_url`` parts (LangChain's standard
    ``{"type": "image", ...}`` blocks included). An ``AIMessage``'s tool calls become the
    assistant message's ``tool_calls`` (arguments as JSON text), and a ``ToolMessage`` a
    ``tool`` message answering its ``tool_call_id``. An assistant's reasoning parts
    (``thinking``, ``reasoning``) are left out.

    Raises:
        InvalidParameterError: a content part that is neither text nor an image (audio, files).

    Examples:
        >>> from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
        >>> call = {"name": "weather", "args": {"city": "Oslo"}, "id": "call_1"}
        >>> history = [AIMessage("", tool_calls=[call]), ToolMessage("sunny", tool_call_id="call_1")]
        >>> asked, answered = to_openai(history)[0]
        >>> asked["tool_calls"][0]["function"]
        {'name': 'weather', 'arguments': '{"city": "Oslo"}'}
        >>> answered
        {'role': 'tool', 'tool_call_id': 'call_1', 'content': 'sunny'}
        >>> image = {"type": "image", "url": "https://example.com/road.png"}
        >>> to_openai([HumanMessage([{"type": "text", "text": "what is ahead?"}, image])])[1]
        True
    """
    converted = convert_to_openai_messages(list(messages))
    has_image = False
    for i, message in enumerate(converted):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        if message["role"] == "assistant":
            content = message["content"] = [p for p in content if not _is_reasoning(p)]
        kinds = {part.get("type") if isinstance(part, dict) else type(part).__name__ for part in content}
        if kinds - _PARTS:
            unsupported = sorted(str(kind) for kind in kinds - _PARTS)
            raise InvalidParameterError(
                f"messages[{i}] has content parts fairagents cannot send: {', '.join(unsupported)} "
                "(text and images are supported)"
            )
        if "image_url" in kinds:
            has_image = True
        else:
            message["content"] = "\n".join(part["text"] for part in content)
    return converted, has_image


def _is_reasoning(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in _REASONING
