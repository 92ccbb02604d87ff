"""fairagents errors as an OpenAI-compatible HTTP API answers them: status, error type, code, retry headers.

One table, read by the server (:mod:`fairagents.server`) to answer a request and by
the in-process OpenAI drop-in (``fairagents_openai``) to raise the ``openai`` exception
of the same status, so a caller sees the same error whichever way its call went.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.http_errors import http_error
    >>> told = http_error(fa.UnknownModelError.among("chta", ["chat"]))
    >>> told.status, told.code
    (404, 'model_not_found')
    >>> told.body(str(fa.UnknownModelError.among("chta", ["chat"])))["error"]["message"]
    "unknown model 'chta'; known models: chat"
    >>> http_error(fa.OverloadedError("app 'flood' is full", retry_after=0.25)).headers
    {'Retry-After': '1', 'retry-after-ms': '250'}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fairagents.errors import (
    BadInputError,
    ContextLengthError,
    EngineError,
    FairAgentsError,
    InvalidImageError,
    OverloadedError,
    ShutdownError,
    UnknownAgentError,
    UnknownAppError,
    UnknownModelError,
)

if TYPE_CHECKING:
    from fairagents.runtime.arbiter import Arbiter

__all__ = ["ErrorType", "HTTPError", "error_body", "http_error"]

#: The ``type`` of an OpenAI error body.
ErrorType = Literal["invalid_request_error", "authentication_error", "rate_limit_error", "server_error"]

# error type -> (HTTP status, OpenAI error type, code); the first match in this order wins
_ERRORS: list[tuple[type[FairAgentsError], int, ErrorType, str]] = [
    (UnknownModelError, 404, "invalid_request_error", "model_not_found"),
    (ContextLengthError, 400, "invalid_request_error", "context_length_exceeded"),
    (UnknownAppError, 400, "invalid_request_error", "unknown_app"),
    (UnknownAgentError, 400, "invalid_request_error", "unknown_agent"),
    (BadInputError, 400, "invalid_request_error", "invalid_parameter"),
    (OverloadedError, 429, "rate_limit_error", "queue_full"),
    (EngineError, 503, "server_error", "engine_unavailable"),
    (ShutdownError, 503, "server_error", "shutting_down"),
    (FairAgentsError, 500, "server_error", "internal_error"),
]


@dataclass(frozen=True, slots=True)
class HTTPError:
    """How the HTTP API answers one error."""

    status: int
    """The HTTP status code."""
    type: ErrorType
    """The error body's ``type``."""
    code: str
    """The error body's ``code``: ``model_not_found``, ``queue_full``, ..."""
    param: str | None = None
    """The error body's ``param``: the request parameter at fault, if one is."""
    headers: dict[str, str] = field(default_factory=dict)
    """``Retry-After`` and ``retry-after-ms`` when a retry is worth it, ``x-should-retry``."""

    def body(self, message: str) -> dict[str, Any]:
        """The error body, with ``message``."""
        return error_body(message, self.type, self.code, self.param)


def error_body(message: str, type: ErrorType, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-shaped error body.

    Examples:
        >>> error_body("bad", "invalid_request_error", "invalid_parameter", "max_tokens")
        {'error': {'message': 'bad', 'type': 'invalid_request_error', 'param': 'max_tokens', 'code': 'invalid_parameter'}}
    """
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


#: The request field that holds each endpoint's input (by the end of its path), which an error about the input
#: names as its ``param``; the chat endpoint first, as its path also ends with ``/completions``.
_INPUT_FIELD = (("/chat/completions", "messages"), ("/completions", "prompt"), ("/images/generations", "prompt"))


def http_error(err: FairAgentsError, arbiter: Arbiter | None = None, *, path: str | None = None) -> HTTPError:
    """How the HTTP API answers ``err``, raised by a request to the endpoint at ``path``.

    The ``param`` is the error's own, else what its kind says: ``model`` for an unknown
    model, the endpoint's input (``messages`` or ``prompt``) for a prompt too long for
    the context or an image that is not one. An
    :class:`~fairagents.OverloadedError` says when to retry; an
    :class:`~fairagents.EngineError` of a model that ``arbiter`` is restarting says when it
    is expected back, and one of a model left down says not to retry.
    """
    status, kind, code = next((s, k, c) for cls, s, k, c in _ERRORS if isinstance(err, cls))
    headers: dict[str, str] = {}
    if isinstance(err, OverloadedError):
        headers = _retry_after(err.retry_after)
    elif isinstance(err, EngineError):
        eta = arbiter.restart_eta(err.model) if arbiter is not None and err.model in arbiter.models else None
        if eta is not None:
            # The model is coming back (backoff + its engine's last start): worth a retry.
            headers = {**_retry_after(max(1.0, eta)), "x-should-retry": "true"}
        else:
            headers = {"x-should-retry": "false"}  # down until restarted by hand (or given up)
    return HTTPError(status, kind, code, _param(err, path), headers)


def _param(err: FairAgentsError, path: str | None) -> str | None:
    if err.param is not None:
        return err.param
    if isinstance(err, UnknownModelError):
        return "model"
    if isinstance(err, ContextLengthError | InvalidImageError) and path is not None:
        return next((name for end, name in _INPUT_FIELD if path.endswith(end)), None)
    return None


def _retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds))), "retry-after-ms": str(int(seconds * 1000))}
