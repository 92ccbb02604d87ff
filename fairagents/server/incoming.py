"""What a request brings, read with care: its body, its key, its context, and its client leaving.

A handler reads the body through :func:`read_body` (bounded in size and time), awaits
its slow work through :func:`until_disconnected` (a client that leaves cancels it), and
keeps what it learns about the request in one :class:`RequestContext`.

Examples:
    >>> from fairagents.server.incoming import RequestContext
    >>> RequestContext()
    RequestContext(run=None, holds=None, labels=None)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import HTTPException
from starlette.requests import ClientDisconnect

import fairagents.server.wire as wire
from fairagents.errors import FairAgentsError
from fairagents.http_errors import http_error
from fairagents.runtime.arbiter import Arbiter

__all__ = ["ClientGone", "MAX_BODY_BYTES", "RequestContext", "context", "digest", "error_reply", "presented_key",
           "read_body", "until_disconnected"]

#: Largest request body read, in bytes.
MAX_BODY_BYTES = 32 * 2**20

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its response; its request was cancelled."""


@dataclass(slots=True)
class RequestContext:
    """What the server learned about one request, kept on it as ``request.state.context``."""

    run: str | None = None
    """The run it belongs to, from ``X-Fairagents-Run`` (``None``: a run of its own)."""
    holds: tuple[str, str] | None = None
    """The agent it holds until its handler ends (:meth:`~fairagents.server.identities.Identities.release`)."""
    labels: tuple[str, str, str | None] | None = None
    """``(app, agent, model)`` once known: what a refusal of it is counted under."""


def context(request: Request) -> RequestContext:
    """The request's :class:`RequestContext`, made on first use."""
    found: RequestContext | None = getattr(request.state, "context", None)
    if found is None:
        found = request.state.context = RequestContext()
    return found


def digest(key: str) -> bytes:
    """A key's SHA-256: keys are looked up by digest, so the lookup's timing does not depend on the key's bytes."""
    return hashlib.sha256(key.encode()).digest()


def presented_key(request: Request) -> str | None:
    """The key of ``Authorization: Bearer <key>``, or the password of ``Authorization: Basic``."""
    scheme, _, value = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    if scheme.lower() == "basic":
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            return base64.b64decode(value.strip(), validate=True).decode().partition(":")[2] or None
    return None


async def read_body(request: Request, timeout: float) -> bytes:
    """The request body, refused (413) past :data:`MAX_BODY_BYTES` without reading it all.

    It must arrive within ``timeout`` seconds (``server.body_timeout``), else 408 (and
    the connection is closed: the rest of the body is not read).
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise HTTPException(413, f"the request body is over {MAX_BODY_BYTES} bytes")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise HTTPException(413, f"the request body is over {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
    except ClientDisconnect:  # it left before sending its whole request: nothing to answer
        raise ClientGone() from None
    except TimeoutError:
        raise HTTPException(408, f"the request body did not arrive within {timeout:g} s (server.body_timeout)",
                            {"Connection": "close"}) from None
    return b"".join(chunks)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``await work``, cancelling it (and raising :class:`ClientGone`) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server is cancelling this handler
        task.cancel()
        gone.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
        raise
    gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone()


def error_reply(err: FairAgentsError, arbiter: Arbiter | None = None, path: str | None = None,
                ) -> tuple[int, dict[str, Any], dict[str, str]]:
    """``(status, OpenAI-shaped error body, headers)`` for ``err`` (no server paths in the message)."""
    told = http_error(err, arbiter, path=path)
    return told.status, wire.error_body(str(err), told.type, told.code, told.param), told.headers
