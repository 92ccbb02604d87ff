"""Turning a call's input into an engine's :class:`~fairagents.engines.Prompt`, with typed errors.

Each helper returns a function of the engine, so the arbiter validates identity and
limits first and tokenizes last (or in its preprocessing pool, for images).

Examples:
    >>> from fairagents.prompts import chat_input
    >>> from fairagents.testing import FakeEngine
    >>> chat_input([{"role": "user", "content": "two words"}])(FakeEngine()).n_tokens
    3
    >>> chat_input("hi")(FakeEngine())
    Traceback (most recent call last):
    ...
    fairagents.errors.InvalidParameterError: messages must be a non-empty list of {'role': ..., 'content': ...} dicts
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fairagents.engines.base import Engine, Prompt
from fairagents.errors import InvalidParameterError

__all__ = ["Messages", "chat_input", "check_messages", "text_input"]

Messages = Sequence[dict[str, Any]]


def chat_input(messages: Messages) -> Callable[[Engine], Prompt]:
    """Validate ``messages``, then apply the engine's chat template."""

    def prepare(engine: Engine) -> Prompt:
        check_messages(messages)
        return engine.prepare_chat(messages)

    return prepare


def text_input(prompt: str | Prompt) -> Callable[[Engine], Prompt]:
    """A plain prompt tokenized by the engine, or a ready :class:`Prompt` as it is.

    A ready prompt's token ids must be in the engine's vocabulary when it reports its
    size (``vocab_size``): an id outside it would fail inside the engine, after dispatch.
    """

    def prepare(engine: Engine) -> Prompt:
        if isinstance(prompt, Prompt):
            if not prompt.n_tokens:
                raise InvalidParameterError("the prompt has no tokens")
            vocab = getattr(engine, "vocab_size", None)
            if isinstance(vocab, int) and (min(prompt.token_ids) < 0 or max(prompt.token_ids) >= vocab):
                bad = next(t for t in prompt.token_ids if not 0 <= t < vocab)
                raise InvalidParameterError(f"token id {bad} is outside the model's vocabulary (0 to {vocab - 1})")
            return prompt
        if not isinstance(prompt, str) or not prompt:
            raise InvalidParameterError(f"the prompt must be a non-empty string or a Prompt, got {prompt!r}")
        return engine.prepare_text(prompt)

    return prepare


def check_messages(messages: Messages) -> None:
    """Raise :class:`~fairagents.InvalidParameterError` unless ``messages`` is a list of role/content dicts."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise InvalidParameterError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or "content" not in message:
            raise InvalidParameterError(f"messages[{i}] must be a dict with 'role' and 'content', got {message!r}")
