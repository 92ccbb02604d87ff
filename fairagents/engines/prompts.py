"""Turning a call's input into an engine's :class:`~fairagents.engines.Prompt`, with typed errors.

Each helper returns a function of the engine, so the arbiter validates identity and
limits first and tokenizes last (or in its preprocessing pool). Before tokenizing, a
cheap check refuses a text that cannot fit the model's context whatever its tokens:
an engine that reports ``max_token_bytes`` (no token stands for more bytes) takes at
most ``max_model_len × max_token_bytes`` characters of prompt text, so a 10 MB
prompt for a 2,048-token model is a :class:`~fairagents.ContextLengthError` in
microseconds, not after seconds of tokenizing.

Examples:
    >>> from fairagents.engines.prompts import chat_input
    >>> from fairagents.testing import FakeEngine
    >>> chat_input([{"role": "user", "content": "two words"}])(FakeEngine()).n_tokens
    3
    >>> chat_input("hi")(FakeEngine())
    Traceback (most recent call last):
    ...
    fairagents.errors.InvalidParameterError: messages must be a non-empty list of {'role': ..., 'content': ...} dicts
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from fairagents._json import NumberError, loads
from fairagents.engines.base import Engine, Prompt, _clip, capabilities
from fairagents.errors import ContextLengthError, InvalidParameterError

__all__ = ["Messages", "chat_input", "check_messages", "check_text_fits", "render_chat", "template_messages", "text_input"]

Messages = Sequence[dict[str, Any]]


def chat_input(messages: Messages, tools: Sequence[dict[str, Any]] | None = None) -> Callable[[Engine], Prompt]:
    """Validate ``messages``, then apply the engine's chat template (rendering ``tools`` when given)."""

    def prepare(engine: Engine) -> Prompt:
        check_messages(messages)
        characters = sum(_text_length(m.get("content")) for m in messages)
        if not tools:
            check_text_fits(engine, characters)
            return engine.prepare_chat(messages)
        check_text_fits(engine, characters + len(json.dumps(list(tools))))
        return engine.prepare_chat(messages, tools=tools)  # type: ignore[call-arg]

    return prepare


def text_input(prompt: str | Prompt) -> Callable[[Engine], Prompt]:
    """A plain prompt tokenized by the engine, or a ready :class:`Prompt` as it is.

    A ready prompt's token ids must be in the engine's vocabulary when it reports its
    size (``vocab_size``): an id outside it would fail inside the engine, after dispatch.
    """

    def prepare(engine: Engine) -> Prompt:
        if isinstance(prompt, Prompt):
            if not prompt.n_tokens:
                raise InvalidParameterError("the prompt has no tokens", param="prompt")
            if engine.max_model_len and prompt.n_tokens > engine.max_model_len:  # before scanning the ids
                raise ContextLengthError(
                    f"the prompt has {prompt.n_tokens} tokens; the model's context is {engine.max_model_len}"
                )
            vocab = capabilities(engine).vocab_size
            if isinstance(vocab, int) and (min(prompt.token_ids) < 0 or max(prompt.token_ids) >= vocab):
                bad = next(t for t in prompt.token_ids if not 0 <= t < vocab)
                raise InvalidParameterError(f"token id {_clip(bad)} is outside the model's vocabulary "
                                            f"(0 to {vocab - 1})", param="prompt")
            return prompt
        if not isinstance(prompt, str) or not prompt:
            raise InvalidParameterError(f"the prompt must be a non-empty string or a Prompt, got {prompt!r}")
        check_text_fits(engine, len(prompt))
        return engine.prepare_text(prompt)

    return prepare


def check_messages(messages: Messages) -> None:
    """Raise :class:`~fairagents.InvalidParameterError` unless ``messages`` is a list of role/content dicts."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise InvalidParameterError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts",
                                    param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidParameterError(f"messages[{i}] must be a dict with 'role' and 'content', got {message!r}",
                                        param=f"messages[{i}]")
        calls = message.get("tool_calls")
        if calls is not None:
            if message["role"] != "assistant":
                raise InvalidParameterError(f"messages[{i}]: only an assistant message carries tool_calls",
                                            param=f"messages[{i}].tool_calls")
            _check_tool_calls(i, calls)
        if "content" not in message and not calls:
            raise InvalidParameterError(f"messages[{i}] must be a dict with 'role' and 'content', got {message!r}",
                                        param=f"messages[{i}].content")
        if message["role"] == "tool" and not isinstance(message.get("content"), str | list):
            raise InvalidParameterError(f"messages[{i}]: a tool message's content must be the tool's result as text",
                                        param=f"messages[{i}].content")


def template_messages(messages: Messages) -> list[dict[str, Any]]:
    """``messages`` as chat templates read them: assistant tool calls' JSON arguments decoded.

    The OpenAI API carries a call's arguments as JSON text; templates (as vLLM renders
    them) write them out as objects. A message without content gets ``""``.

    Examples:
        >>> from fairagents.engines.prompts import template_messages
        >>> call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
        >>> template_messages([{"role": "assistant", "content": None, "tool_calls": [call]}])[0]["tool_calls"][0]
        {'id': 'c1', 'type': 'function', 'function': {'name': 'f', 'arguments': {'x': 1}}}
    """
    out = []
    for message in messages:
        m = dict(message)
        if m.get("content") is None:
            m["content"] = ""
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": _arguments(c["function"].get("arguments"))}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def render_chat(tokenizer: Any, messages: Messages, tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
    """``messages`` through ``tokenizer``'s chat template, with ``tools``, as token ids ready to generate from.

    Raises :class:`~fairagents.InvalidParameterError` when the template rejects the
    conversation, renders it empty, or is given tools it never writes into the prompt.
    """
    if tools:
        template = getattr(tokenizer, "chat_template", None)
        text = " ".join(template.values()) if isinstance(template, dict) else str(template or "")
        if "tools" not in text:
            raise InvalidParameterError("the model's chat template does not render tools; it cannot be offered any",
                                        param="tools")
    try:
        ids = tokenizer.apply_chat_template(
            template_messages(messages), tools=list(tools) if tools else None, add_generation_prompt=True,
            tokenize=True, return_dict=False,
        )
    except Exception as err:  # a template that rejects the conversation (roles, order)
        raise InvalidParameterError(f"the model's chat template rejected the messages: {err}",
                                    param="messages") from err
    if not ids:
        raise InvalidParameterError("the messages render to an empty prompt", param="messages")
    return list(ids)


def _check_tool_calls(i: int, calls: Any) -> None:
    if not isinstance(calls, list):
        raise InvalidParameterError(f"messages[{i}].tool_calls must be a list", param=f"messages[{i}].tool_calls")
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidParameterError(
                f"messages[{i}].tool_calls[{j}] must be {{'id': ..., 'type': 'function', "
                f"'function': {{'name': ..., 'arguments': ...}}}}", param=f"messages[{i}].tool_calls[{j}]")
        _arguments(fn.get("arguments"), where=f"messages[{i}].tool_calls[{j}].function.arguments")


def _arguments(arguments: Any, where: str = "arguments") -> Any:
    """A call's arguments as a JSON value (they may come as JSON text or already decoded)."""
    if arguments is None or arguments == "":
        return {}
    if not isinstance(arguments, str):
        return arguments
    try:
        return loads(arguments)
    except NumberError as err:
        raise InvalidParameterError(f"{where} must be JSON: {err}", param=where) from None
    except ValueError:  # not JSON, or not Unicode
        raise InvalidParameterError(f"{where} must be JSON, got {arguments[:80]!r}", param=where) from None
    except RecursionError:
        raise InvalidParameterError(f"{where} is nested too deeply", param=where) from None


def check_text_fits(engine: Engine, characters: int) -> None:
    """Refuse ``characters`` of prompt text that cannot fit ``engine``'s context, without tokenizing.

    Applies when the engine reports ``max_token_bytes``: every token stands for at most
    that many bytes, and a character is at least one byte, so the text has at least
    ``characters / max_token_bytes`` tokens.

    Examples:
        >>> from fairagents.engines.prompts import check_text_fits
        >>> from fairagents.testing import FakeEngine
        >>> check_text_fits(FakeEngine(max_model_len=100, max_token_bytes=8), 800)
        >>> check_text_fits(FakeEngine(max_model_len=100, max_token_bytes=8), 10_000_000)
        Traceback (most recent call last):
        ...
        fairagents.errors.ContextLengthError: the prompt has 10000000 characters, so at least 1250000 tokens; the model's context is 100 tokens
    """
    most = capabilities(engine).max_token_bytes
    if not isinstance(most, int) or isinstance(most, bool) or most < 1 or not engine.max_model_len:
        return
    if characters > engine.max_model_len * most:
        raise ContextLengthError(
            f"the prompt has {characters} characters, so at least {-(-characters // most)} tokens; "
            f"the model's context is {engine.max_model_len} tokens"
        )


def _text_length(content: Any) -> int:
    """Characters of text in a message's content (a string, or a list of parts)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0
