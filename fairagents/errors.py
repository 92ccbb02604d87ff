"""The exception tree of fairagents.

Every error fairagents raises on purpose derives from :class:`FairAgentsError`.
Errors caused by the caller's input also derive from :class:`ValueError`, so
retry policies that skip ``ValueError`` (LangGraph's default, tenacity's
``retry_if_not_exception_type(ValueError)``) do not retry them::

    FairAgentsError
    ├── BadInputError (also ValueError)      the request can never succeed as sent
    │   ├── InvalidParameterError            a weight, token count, SLO or limit out of range
    │   ├── UnknownModelError                no model of that name in the pool
    │   ├── UnknownAppError                  no app of that name
    │   ├── UnknownAgentError                no agent of that name in its app
    │   ├── ContextLengthError               the prompt does not fit the model's context
    │   ├── InvalidImageError                an image that is corrupt, of an unsupported format, or too large
    │   └── ModalityError                    the model does not take or make that modality (an image to a text model)
    ├── EngineError                          the engine serving a model failed
    │   └── ModelLoadError                   an engine could not load its model (missing files, hub unreachable)
    ├── OverloadedError                      the app's queue is full; retry after ``retry_after`` seconds
    ├── ShutdownError                        the arbiter is closing; the request did not run to the end
    └── ProtocolError (also RuntimeError)    a policy, dispatcher or engine driven out of order, or a charge not finite (a bug)

Every error carries what it is about as attributes, where they apply: ``model``,
``app``, ``agent``, ``request_id``, ``param`` (the request parameter at fault) (each
``None`` when not known), and ``retry_after`` on :class:`OverloadedError`. Code should
branch on these, not on the message.

Examples:
    >>> import fairagents as fa
    >>> try:
    ...     fa.App("driving", weight=0)
    ... except ValueError as err:
    ...     print(type(err).__name__, "-", err)
    InvalidParameterError - app weight must be a finite number in [0.001, 1000], got 0
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = [
    "BadInputError",
    "ContextLengthError",
    "EngineError",
    "FairAgentsError",
    "InvalidImageError",
    "InvalidParameterError",
    "ModalityError",
    "ModelLoadError",
    "OverloadedError",
    "ProtocolError",
    "ShutdownError",
    "UnknownAgentError",
    "UnknownAppError",
    "UnknownModelError",
]


def shown(value: Any, limit: int = 80) -> str:
    """``value`` as an error message quotes it: its ``repr``, cut to about ``limit`` characters.

    An error never echoes a huge value back, and never fails to say it: the ``repr`` of an
    integer past 4,300 digits raises, so such an integer is described instead.

    Examples:
        >>> from fairagents.errors import shown
        >>> shown(2**64), shown(-(10**5000)), shown("x" * 100, limit=8)
        ('18446744073709551616', 'an integer of about 5001 digits', "'xxxxxxx… (102 characters)")
    """
    if isinstance(value, int) and value.bit_length() > 4 * limit:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


class FairAgentsError(Exception):
    """Base class of every error fairagents raises on purpose.

    Args:
        message: what went wrong, for people.
        model: the model the error is about, if one.
        app: the calling app, if known.
        agent: the calling agent's name, if known.
        request_id: the request's id, if it had one.
        param: the request parameter at fault, as an OpenAI error body's ``param`` names it
            (a body field such as ``"max_tokens"``, or a header), if one is.

    Examples:
        >>> import fairagents as fa
        >>> err = fa.EngineError("model 'chat' is down", model="chat", request_id="fa-7")
        >>> err.model, err.app, err.request_id
        ('chat', None, 'fa-7')
    """

    def __init__(
        self,
        message: str = "",
        *,
        model: str | None = None,
        app: str | None = None,
        agent: str | None = None,
        request_id: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.model = model
        self.app = app
        self.agent = agent
        self.request_id = request_id
        self.param = param


class BadInputError(FairAgentsError, ValueError):
    """The caller's input can never succeed as sent; nothing was charged or queued.

    Examples:
        >>> import fairagents as fa
        >>> try:
        ...     fa.Agent("critic", fa.App("studio"), weight=-1)
        ... except fa.BadInputError as err:   # fix the input: a retry fails the same way
        ...     print(type(err).__name__, isinstance(err, ValueError))
        InvalidParameterError True
    """


class InvalidParameterError(BadInputError):
    """A parameter is out of range: a weight ≤ 0, a negative token count, an SLO ≤ 0.

    Examples:
        >>> import fairagents as fa
        >>> fa.SLO(ttft=-1)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: SLO ttft must be a finite number of seconds in [0.001, 86400], got -1
    """


class UnknownModelError(BadInputError):
    """No model of that name is in the pool (or has a cost profile).

    Examples:
        >>> import fairagents as fa
        >>> fa.UnifiedTokenCost({}).input_cost("chat", 10)
        Traceback (most recent call last):
        ...
        fairagents.errors.UnknownModelError: unknown model 'chat'; known models: none
    """

    @classmethod
    def among(cls, name: object, known: Iterable[str]) -> UnknownModelError:
        """The error for ``name``, listing the ``known`` models.

        Examples:
            >>> from fairagents.errors import UnknownModelError
            >>> str(UnknownModelError.among("chta", ["chat", "vision"]))
            "unknown model 'chta'; known models: chat, vision"
        """
        listed = ", ".join(sorted(known)) or "none"
        return cls(f"unknown model {name!r}; known models: {listed}", model=name if isinstance(name, str) else None)


class UnknownAppError(BadInputError):
    """No app of that name has been declared.

    Examples:
        >>> import fairagents as fa
        >>> err = fa.UnknownAppError("unknown app 'studio'", app="studio")
        >>> err.app, isinstance(err, fa.BadInputError)
        ('studio', True)
    """


class UnknownAgentError(BadInputError):
    """No agent of that name has been declared in its app.

    Examples:
        >>> import fairagents as fa
        >>> err = fa.UnknownAgentError("unknown agent 'critic'", app="studio", agent="critic")
        >>> err.app, err.agent
        ('studio', 'critic')
    """


class ContextLengthError(BadInputError):
    """The prompt (plus ``max_tokens``) is longer than the model's context.

    Examples:
        >>> import fairagents as fa
        >>> err = fa.ContextLengthError("prompt + max_tokens exceeds the context", model="chat", param="max_tokens")
        >>> err.model, err.param   # ask for fewer tokens, or shorten the prompt
        ('chat', 'max_tokens')
    """


class InvalidImageError(BadInputError):
    """An input image cannot be used: not an image, corrupt, of an unsupported format, or too large.

    Examples:
        >>> from fairagents.images import load_image
        >>> load_image(b"not an image")
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidImageError: the image data is not a readable image (12 bytes)
    """


class ModalityError(BadInputError):
    """The model does not take or make that modality: an image sent to a text model, an image asked of an LLM.

    Examples:
        >>> import fairagents as fa
        >>> err = fa.ModalityError("model 'chat' takes no images (it is a text model)", model="chat")
        >>> err.model, isinstance(err, fa.BadInputError)
        ('chat', True)
    """


class EngineError(FairAgentsError):
    """The engine serving a model failed; the request did not complete.

    Not a ``ValueError``: the same request may succeed once the engine is back.

    Examples:
        A retry policy that retries what may succeed later, and nothing else:

        >>> import fairagents as fa
        >>> def retryable(err):
        ...     return isinstance(err, fa.EngineError | fa.OverloadedError)
        >>> retryable(fa.EngineError("model 'chat' is down", model="chat")), retryable(fa.UnknownModelError("x"))
        (True, False)
    """


class ModelLoadError(EngineError):
    """An engine could not load its model: no such folder, a name not on the Hub, the Hub out of reach, bad files.

    Raised by ``start`` (so by entering the arbiter); the message names the model's
    path or name and why, in one line. ``fairagents serve`` reports it as a
    configuration error.

    Examples:
        >>> from fairagents.errors import EngineError, ModelLoadError
        >>> err = ModelLoadError("no folder '/models/llama' (not a Hugging Face name either)", model="chat")
        >>> isinstance(err, EngineError), err.model
        (True, 'chat')
    """


class OverloadedError(FairAgentsError):
    """The calling app already has as many requests queued as its bound allows; nothing was queued.

    Not a ``ValueError``: the same request succeeds once the app's queue has room.

    Args:
        message: what is full.
        retry_after: seconds after which a retry is likely to find room (a hint).

    Examples:
        >>> from fairagents.errors import OverloadedError
        >>> err = OverloadedError("app 'flood' has 8 requests queued", retry_after=0.5)
        >>> err.retry_after, isinstance(err, ValueError)
        (0.5, False)
    """

    def __init__(self, message: str = "", *, retry_after: float = 1.0, **about: str | None) -> None:
        super().__init__(message, **about)
        self.retry_after = retry_after


class ShutdownError(FairAgentsError):
    """The arbiter is shutting down: the request was not admitted, or was aborted after the drain timeout.

    Examples:
        >>> import fairagents as fa
        >>> try:
        ...     raise fa.ShutdownError("the arbiter is closed and admits no new requests", request_id="fa-7")
        ... except fa.ShutdownError as err:   # not the caller's fault: resend it to a running arbiter
        ...     print(err.request_id, isinstance(err, ValueError))
        fa-7 False
    """


class ProtocolError(FairAgentsError, RuntimeError):
    """A driver called a policy, the dispatcher or an engine out of order: a bug, not bad input.

    Dispatching a request that is not waiting, finishing one twice, admitting into a
    simulated batch mid-step; or a cost model that priced a charge that is not a finite
    number ≥ 0 (the request fails, and no counter moves). Not a ``ValueError``: retrying will not help, and code
    that treats ``ValueError`` as the caller's fault must not swallow it.

    Examples:
        >>> import fairagents as fa
        >>> policy = fa.policies.FCFS()
        >>> req = fa.Request(id="r1", agent=fa.Agent("a", fa.App("x")), model="m", prompt_tokens=1,
        ...                  max_tokens=1, arrival=0.0)
        >>> policy.on_dispatch(req, now=0.0)   # dispatched without arriving first
        Traceback (most recent call last):
        ...
        fairagents.errors.ProtocolError: request 'r1' is not waiting
    """
