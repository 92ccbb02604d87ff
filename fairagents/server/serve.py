"""Running the server: uvicorn in the arbiter's event loop, and a graceful SIGTERM.

On SIGTERM (or Ctrl-C) the server stops admitting (new requests get 503, ``/health``
says ``draining``), lets the requests it accepted, queued ones included, finish for
``server.drain_timeout`` seconds, aborts the rest (their clients get a 503 or an
error event), then closes its connections, stops the engines and returns. A second
signal skips the wait. uvicorn's own signal handling is off: it would stop listening
at once, and re-raise the signal after the drain.

The process exits at most ``drain_timeout + 1`` s after the signal
(:data:`SHUTDOWN_GRACE`), sooner when the drain empties early. The second past the
drain timeout is shared: the aborted requests get :data:`ABORT_WAIT` (0.2 s) to end
before the engines stop; every connection is closed by :data:`CLOSE_WITHIN` (0.4 s),
uvicorn cancelling the requests still open then; the remaining 0.6 s is for uvicorn's
exit and the interpreter's (a few tenths of a second). The bound assumes engines that
end an aborted request and stop promptly, as the in-process ones do; a vLLM engine's
shutdown adds its own time. Should anything hold the shutdown longer (a thread stuck
with a lock the event loop needs), the process logs every thread's stack
(``fairagents.server.forced_exit``) and exits with status 1 at ``drain_timeout`` +
:data:`FORCED_EXIT` seconds, whatever is stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI
from pydantic import ValidationError
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from fairagents._logging import get_logger
from fairagents.runtime.arbiter import Arbiter
from fairagents.constants import HEADER_APP
from fairagents.errors import InvalidParameterError, ModelLoadError
from fairagents.server.app import create_app
from fairagents.server.streaming import ABORT_EXTENSION
from fairagents.server.config import Config, ServerSettings, build_arbiter, load_config

__all__ = ["free_socket", "main", "running", "serve", "with_options"]

log = get_logger("fairagents.server")

SHUTDOWN_GRACE = 1.0
"""Seconds past ``server.drain_timeout`` by which SIGTERM has ended :func:`serve` and its process.

It holds :data:`CLOSE_WITHIN`, then uvicorn's exit and the interpreter's.
"""

FORCED_EXIT = 5.0
"""Seconds past ``server.drain_timeout`` at which SIGTERM ends the process even if a thread is stuck.

Past :data:`SHUTDOWN_GRACE`, with room for engines that take a few seconds to stop.
"""

ABORT_WAIT = 0.2
"""Seconds past the drain timeout the aborted requests get to end before the engines stop.

Their clients get a 503, or an error event if they were streaming. Those that have not
ended by then may still end while the connections close (:data:`CLOSE_WITHIN`).
"""

CLOSE_WITHIN = 0.4
"""Seconds past the drain timeout by which every connection is closed (:data:`ABORT_WAIT` included).

uvicorn waits for the requests still open until then, and cancels the rest: a client
that stopped reading its stream has it cut, one that never sent all of its request
gets a 500.
"""

_UVICORN_TICKS = 0.2  # uvicorn sees should_exit within 0.1 s, then sleeps 0.1 s before it waits on connections


def _loopback(host: str) -> bool:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return host == "localhost"


def free_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one, read it from ``getsockname()``).

    Examples:
        >>> from fairagents.server import free_socket
        >>> with free_socket("127.0.0.1", 0) as sock:
        ...     sock.getsockname()[0]
        '127.0.0.1'
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: :func:`serve` drains first, then tells it to exit."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


class _Protocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol, with deadlines for clients that are slow or silent.

    uvicorn arms its keep-alive timer only once a response is sent: a connection that
    never completes its request's headers would be held for ever. Here the headers
    have ``header_timeout`` seconds (from connecting, or from a request's first byte);
    a response still unread ``stall_timeout`` seconds after it was sent is dropped with
    its connection; and the app can drop the connection of a stream its client stopped
    reading (the ``fairagents.abort`` scope extension).
    """

    header_timeout = 30.0
    stall_timeout = 30.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Two timers, so that a request's headers never cancel the deadline of a response still unread.
        self._header_deadline: asyncio.TimerHandle | None = None
        self._unread_deadline: asyncio.TimerHandle | None = None
        self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_late)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_deadline is None:
            self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_late)

    def on_headers_complete(self) -> None:
        self._header_deadline = _cancel(self._header_deadline)
        self.scope["extensions"] = {**self.scope.get("extensions", {}), ABORT_EXTENSION: self.transport.abort}
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.get_write_buffer_size():  # closing or kept alive, it waits for the client to read
            _cancel(self._unread_deadline)
            self._unread_deadline = self.loop.call_later(self.stall_timeout, self._unread)

    def connection_lost(self, exc: Exception | None) -> None:
        self._header_deadline = _cancel(getattr(self, "_header_deadline", None))
        self._unread_deadline = _cancel(getattr(self, "_unread_deadline", None))
        super().connection_lost(exc)

    def _headers_late(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def _unread(self) -> None:
        self._unread_deadline = None
        if self.transport.get_write_buffer_size():
            self.transport.abort()


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()


def _uvicorn(app: FastAPI) -> _Server:
    settings = app.state.gateway.config.server if hasattr(app.state, "gateway") else ServerSettings()
    protocol = type("Protocol", (_Protocol,), {"header_timeout": settings.header_timeout,
                                               "stall_timeout": settings.stream_stall_timeout})
    # log_config=None: a library does not configure logging; the application (the CLI) does.
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", ws="none",
                            timeout_graceful_shutdown=5, http=protocol)
    return _Server(config)


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextlib.asynccontextmanager
async def running(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``app`` in this event loop for the duration of the block; yields its base URL.

    For tests and benchmarks that share an engine (and its loop) with the server. It
    installs no signal handlers.

    Examples:
        >>> import asyncio, httpx
        >>> import fairagents as fa
        >>> from fairagents.server import create_app, running
        >>> async def main():
        ...     async with running(create_app(fa.Arbiter())) as url:
        ...         async with httpx.AsyncClient() as client:
        ...             return (await client.get(f"{url}/health")).json()["status"]
        >>> asyncio.run(main())
        'down'
    """
    server = _uvicorn(app)
    sock = free_socket(host, port)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # startup failed: raise why
                raise RuntimeError("the server stopped while starting")
            await asyncio.sleep(0.01)
        yield _url(sock)
    finally:
        server.should_exit = True
        await task


async def serve(
    arbiter: Arbiter,
    config: Config,
    *,
    stop_engines: bool = True,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Start ``arbiter``, serve it over HTTP until SIGTERM or SIGINT, drain, and close it.

    Args:
        arbiter: the arbiter to serve (started here; closed on the way out).
        config: apps, agents and server settings.
        stop_engines: stop the engines when done (``False`` leaves them to another arbiter).
        ready: called with the base URL once the server listens.

    Examples:
        >>> import asyncio
        >>> from fairagents.server import Config, build_arbiter, serve
        >>> config = Config.default()
        >>> asyncio.run(serve(build_arbiter(config), config, ready=print))  # doctest: +SKIP
        http://127.0.0.1:8000
    """
    app = create_app(arbiter, config)
    gateway = app.state.gateway
    await arbiter.start()
    server = _uvicorn(app)
    sock = free_socket(config.server.host, config.server.port)
    if not config.server.auth and not _loopback(sock.getsockname()[0]):
        log.warning("fairagents.server.open_without_keys", host=config.server.host,
                    hint="keys are off: anyone who reaches this address can name any app and read every view")
    loop = asyncio.get_running_loop()
    drained: asyncio.Task[None] | None = None

    async def drain() -> None:
        gateway.draining = True
        timeout = config.server.drain_timeout
        drained_by = loop.time() + timeout
        accepted = sum(m["queued"] + m["in_flight"] for m in gateway.models().values())
        log.info("fairagents.server.draining", timeout=timeout, accepted=accepted)  # a normal shutdown
        await arbiter.close(timeout=timeout, stop_engines=stop_engines, abort_timeout=ABORT_WAIT)
        # The connections still open close by CLOSE_WITHIN past the drain (past now if it ended early).
        now = loop.time()
        server.config.timeout_graceful_shutdown = max(0.0, min(now, drained_by) + CLOSE_WITHIN - now - _UVICORN_TICKS)
        server.should_exit = True

    def on_signal() -> None:
        nonlocal drained
        if drained is None:
            drained = loop.create_task(drain())
        else:  # a second signal: do not wait any longer
            server.config.timeout_graceful_shutdown = CLOSE_WITHIN - _UVICORN_TICKS
            server.should_exit = server.force_exit = True

    signals = (signal.SIGTERM, signal.SIGINT)
    backstop = _Backstop(config.server.drain_timeout + FORCED_EXIT)
    for sig in signals:
        loop.add_signal_handler(sig, on_signal)
        # The loop reads the signal from its wakeup file; this handler runs in the main thread even when the
        # loop is stuck (a lock acquisition is interrupted for it), and arms the exit that needs no loop.
        signal.signal(sig, backstop.arm)
    try:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started and ready is not None:
            ready(_url(sock))
        await task
    finally:
        backstop.disarm()
        for sig in signals:
            loop.remove_signal_handler(sig)
        if drained is not None:
            if not drained.done():
                drained.cancel()
            await asyncio.gather(drained, return_exceptions=True)
        await arbiter.close(timeout=0 if drained is not None else None, stop_engines=stop_engines,
                            abort_timeout=ABORT_WAIT)
    log.info("fairagents.server.stopped")


class _Backstop:
    """Ends the process ``within`` seconds of the first signal, if nothing else has by then.

    The drain runs on the event loop; a thread stuck holding a lock the loop waits for
    (a bug) would keep the process alive past any drain. A daemon thread, armed from the
    signal handler, logs every thread's stack and exits at the deadline. :func:`serve`
    disarms it once it returns.
    """

    def __init__(self, within: float) -> None:
        self.within = within
        self._armed = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fairagents-shutdown-backstop", daemon=True)
        self._thread.start()

    def arm(self, signum: int, frame: object) -> None:
        """The signal handler: start the countdown (a second signal changes nothing here)."""
        self._armed.set()

    def disarm(self) -> None:
        """:func:`serve` returned: the process is leaving on its own."""
        self._done.set()
        self._armed.set()  # wakes the thread, which sees it is done

    def _run(self) -> None:
        self._armed.wait()
        if self._done.wait(self.within):
            return
        stacks = {t.name: "".join(traceback.format_stack(frame)) for t in threading.enumerate()
                  if (frame := sys._current_frames().get(t.ident)) is not None}  # type: ignore[arg-type]
        log.error("fairagents.server.forced_exit", seconds=self.within, stacks=stacks,
                  hint="the drain did not end: a thread is stuck (its stack is above)")
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(1)


def main(
    config: str | os.PathLike[str] | None = None, *, host: str | None = None, port: int | None = None,
    policy: str | None = None, model: str | None = None,
) -> int:
    """``fairagents serve``: load the configuration (or the embedded default), serve until SIGTERM.

    Args:
        config: a ``.toml`` / ``.yaml`` file; ``None`` serves the embedded tiny model
            with keys off (apps named by ``X-Fairagents-App``).
        host: overrides ``server.host``.
        port: overrides ``server.port``.
        policy: overrides ``policy``: a built-in name or ``"module:Class"``.
        model: a model folder or Hugging Face name: the ``path`` of the pool's one model
            (without ``config``, the ``chat`` model instead of the embedded one).

    Returns:
        The process exit status (0 after a drain).

    Raises:
        InvalidParameterError: the configuration or an option is wrong (nothing started).

    Examples:
        >>> from fairagents.server import main
        >>> main("serve.toml", port=8080)  # doctest: +SKIP
        0
    """
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # "module:Class" policies import from here, as uvicorn's apps do
    settings = with_options(load_config(config) if config is not None else Config.default(),
                            host=host, port=port, policy=policy, model=model)
    check_local_models(settings)
    arbiter = build_arbiter(settings)

    def ready(url: str) -> None:
        keys = "API keys on" if settings.server.auth else f"keys off: {HEADER_APP} names the app"
        print(
            f"fairagents: serving {', '.join(arbiter.models)} on {url}/v1 (policy {settings.policy}; {keys}); "
            f"live fairness at {url}/dashboard",
            file=sys.stderr,
            flush=True,
        )

    asyncio.run(serve(arbiter, settings, ready=ready))
    return 0


def check_local_models(config: Config) -> None:
    """Raise :class:`~fairagents.errors.ModelLoadError` for a model whose ``path`` is a local one that cannot load.

    Before any engine is built (or vLLM imported): a missing folder, a file, a folder
    without a model's config fail in a moment, naming the model. A Hugging Face name
    is left to its engine, which looks it up in the cache or on the Hub.

    Examples:
        >>> from fairagents.server import Config
        >>> from fairagents.server.serve import check_local_models
        >>> check_local_models(Config.model_validate({"server": {"auth": False}, "models": {"chat": {"path": "./x"}}}))
        Traceback (most recent call last):
        ...
        fairagents.errors.ModelLoadError: model 'chat': no folder './x' (a Hugging Face name has the form 'org/model')
    """
    from fairagents.models import check_model_source

    for name, model in config.models.items():
        if model.path is None:
            continue
        try:
            check_model_source(model.path, hub=False)
        except ModelLoadError as err:
            raise ModelLoadError(f"model {name!r}: {err}", model=name) from None


def with_options(
    config: Config, *, host: str | None = None, port: int | None = None, policy: str | None = None,
    model: str | None = None,
) -> Config:
    """``config`` with the command line's options applied (``None``: not given), checked as the file is.

    Raises:
        InvalidParameterError: an option is invalid, naming it: a port out of range, a
            policy that does not import or build, ``--model`` for a pool of several models.

    Examples:
        >>> from fairagents.server import Config
        >>> from fairagents.server.serve import with_options
        >>> config = with_options(Config.default(), port=9000, policy="vtc", model="Qwen/Qwen2.5-0.5B-Instruct")
        >>> config.server.port, config.policy, config.models["chat"].path
        (9000, 'vtc', 'Qwen/Qwen2.5-0.5B-Instruct')
        >>> with_options(Config.default(), policy="lottery")
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: --policy: unknown policy 'lottery'; choose from adaptive, duet, edf, exfairs, fcfs, hmfs, hmfs_credit, hmfs_runs, rr, sjf, two_lane, vtc, wfq
    """
    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    if overrides:
        try:
            server = ServerSettings.model_validate({**config.server.model_dump(), **overrides})
        except ValidationError as err:
            raise InvalidParameterError(f"--host/--port: {err.errors(include_url=False)[0]['msg']}") from None
        config = config.model_copy(update={"server": server})
    if policy is not None:
        try:
            Config.model_validate({"policy": policy, "server": {"auth": False}})
        except ValidationError as err:
            message = err.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
            raise InvalidParameterError(f"--policy: {message}") from None
        config = config.model_copy(update={"policy": policy})
    if model is not None:
        if len(config.models) != 1:
            raise InvalidParameterError(f"--model: the configuration serves {len(config.models)} models "
                                        f"({', '.join(config.models)}); set each one's path in it")
        [(name, current)] = config.models.items()
        config = config.model_copy(update={"models": {name: current.model_copy(update={"path": model})}})
    return config
