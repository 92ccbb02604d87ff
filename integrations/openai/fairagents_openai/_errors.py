"""What a call served in process raises: the ``openai`` exception a fairagents server's answer would give.

A server answers an error with a status (the one table of :mod:`fairagents.http_errors`)
and the ``openai`` client raises the exception of that status; in process the drop-in
raises the same class, with the same ``status_code``, ``body``, ``code``, ``param`` and
headers (``retry-after`` on a 429), so code and frameworks that catch ``openai``'s
exceptions (and retry on them) work unchanged:

| fairagents error | ``openai`` exception |
| --- | --- |
| ``UnknownModelError`` | ``NotFoundError`` (404) |
| other ``BadInputError`` (``InvalidParameterError``, ``UnknownAgentError``, ...) | ``BadRequestError`` (400) |
| ``OverloadedError`` | ``RateLimitError`` (429) |
| ``EngineError``, ``ShutdownError`` | ``InternalServerError`` (503) |
| ``timeout=`` passed | ``APITimeoutError`` |
| an error while a stream is read | ``APIError`` (no status: the answer had started) |

Each is also the fairagents error it stands for (an instance of both classes, with its
attributes; the original is its ``__cause__``), so ``except fa.UnknownModelError`` and
``except ValueError`` catch what they caught, and a timeout is still a ``TimeoutError``.
A :class:`~fairagents.errors.ProtocolError` (a sync call made on the arbiter's own event
loop) is a bug in the calling code, not an answer a server gives: it is raised as it is.
Cancelling a call raises ``asyncio.CancelledError``, as with ``openai``.

Examples:
    >>> import openai
    >>> import fairagents as fa
    >>> err = status_error(fa.UnknownModelError.among("chta", ["chat"]), "fairagents://in-process/v1/chat/completions")
    >>> isinstance(err, openai.NotFoundError), isinstance(err, fa.UnknownModelError), err.status_code, err.code
    (True, True, 404, 'model_not_found')
    >>> str(err)
    "Error code: 404 - unknown model 'chta'; known models: chat"
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import openai

from fairagents.errors import FairAgentsError, ProtocolError
from fairagents.http_errors import http_error

try:  # the HTTP library the installed openai client is built on
    import httpx2 as httpx
except ImportError:  # pragma: no cover - openai releases before httpx2
    import httpx  # type: ignore[no-redef]

if TYPE_CHECKING:
    from fairagents import Arbiter

__all__ = ["openai_errors", "status_error", "stream_error", "timeout_error"]

# The exception openai's clients raise for each status (their _make_status_error); others are APIStatusError.
_BY_STATUS: dict[int, type[openai.APIStatusError]] = {
    400: openai.BadRequestError,
    401: openai.AuthenticationError,
    403: openai.PermissionDeniedError,
    404: openai.NotFoundError,
    409: openai.ConflictError,
    422: openai.UnprocessableEntityError,
    429: openai.RateLimitError,
}


def status_error(err: FairAgentsError, url: str, arbiter: Arbiter | None = None) -> openai.APIStatusError:
    """``err`` as the ``openai`` client raises a server's answer to it, for a call to ``url``.

    ``arbiter`` tells when a model that is down is expected back (``retry-after``).
    """
    told = http_error(err, arbiter, path=url)
    body = told.body(str(err))
    headers = dict(told.headers)
    if err.request_id is not None:
        headers["x-request-id"] = err.request_id
    response = httpx.Response(told.status, headers=headers, json=body, request=httpx.Request("POST", url))
    kind = _BY_STATUS.get(told.status) or (openai.InternalServerError if told.status >= 500 else openai.APIStatusError)
    converted = _both(kind, type(err))(f"Error code: {told.status} - {err}", response=response, body=body["error"])
    return _with_state(converted, err)


def stream_error(err: FairAgentsError, url: str) -> openai.APIError:
    """``err``, raised while a stream is read, as the ``openai`` client raises a server's ``error`` event."""
    body = http_error(err, path=url).body(str(err))["error"]
    return _with_state(_both(openai.APIError, type(err))(str(err), httpx.Request("POST", url), body=body), err)


def timeout_error(url: str) -> openai.APITimeoutError:
    """A call to ``url`` that ran out of time: ``openai.APITimeoutError``, and a ``TimeoutError``."""
    return _Timeout(httpx.Request("POST", url))


@contextlib.contextmanager
def openai_errors(url: str, arbiter: Arbiter | None = None, *, streaming: bool = False) -> Iterator[None]:
    """Raise fairagents errors (and timeouts) of the calls made within as ``openai``'s, for a call to ``url``.

    Args:
        url: the URL the call would have gone to.
        arbiter: the arbiter serving it, which knows when a model that is down comes back.
        streaming: the calls read a stream that has started (errors are then ``openai.APIError``).
    """
    try:
        yield
    except (openai.OpenAIError, ProtocolError):
        raise
    except FairAgentsError as err:
        raise (stream_error(err, url) if streaming else status_error(err, url, arbiter)) from err
    except TimeoutError as err:
        raise timeout_error(url) from err


class _Timeout(openai.APITimeoutError, TimeoutError):
    """``openai.APITimeoutError``, and the ``TimeoutError`` that ``asyncio.timeout`` raised."""


@functools.cache
def _both(kind: type[openai.APIError], fairagents_kind: type[FairAgentsError]) -> type[Any]:
    """A class that is both ``openai``'s ``kind`` and the fairagents error class."""
    doc = f"openai.{kind.__name__}, and fairagents' {fairagents_kind.__name__}."
    return type(fairagents_kind.__name__, (kind, fairagents_kind), {"__module__": __name__, "__doc__": doc})


# What openai reads from the answer (param: the error's own, else what the answer names, as a server's); request_id
# is both libraries' and agrees.
_OPENAI_OWN = frozenset({"message", "request", "body", "code", "type", "param", "response", "status_code"})


def _with_state(converted: Any, err: FairAgentsError) -> Any:
    """``converted`` with ``err``'s attributes: model, app, agent, request_id, param, retry_after, ..."""
    converted.__dict__.update((name, value) for name, value in vars(err).items() if name not in _OPENAI_OWN)
    return converted
