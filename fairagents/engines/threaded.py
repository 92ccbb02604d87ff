"""The base of in-process engines whose library runs on one thread of its own.

vLLM's synchronous engine and diffusers' pipelines block, and are not safe to call
from two threads. So one thread owns the library's object for the engine's life and
the event loop never touches it: the loop posts commands to a thread-safe inbox, and
the thread posts each request's events back with ``loop.call_soon_threadsafe`` to the
request's stream (its sink, a queue on the loop).

:class:`ThreadedEngine` runs the life cycle: ``start()`` builds the embedded model if
needed and loads the model on a new thread (a failure is a
:class:`~fairagents.ModelLoadError`); ``stop()`` posts ``("stop",)`` and joins the
thread; a failure while serving fails every open stream with
:class:`~fairagents.EngineError`, turns ``healthy`` false, and the next ``start()``
loads anew (the arbiter's restart). A subclass says what is its library's own:

- ``_load()``, on the thread: load the model, return the library's object;
- ``_ready(loaded)``, on the loop: read what the arbiter needs (profile, context);
- ``_serve(loaded, loop)``, on the thread: run commands until ``("stop",)``;
- ``_command(request_id, prompt, params)``: the command that runs a request;
- ``_cancel(request_id, notify=...)``: end a request early (``notify``: its stream
  ends with ``"abort"``);
- ``_delta(event, params)``: a library event as a :class:`Delta` (events posted as
  deltas pass as they are); ``_unload(loaded)``: release the object as the thread ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import queue
import threading
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from fairagents._logging import get_logger
from fairagents.cost import ModelProfile
from fairagents.engines.base import Delta, EngineBase, GenerationParams, Prompt
from fairagents.errors import EngineError, ModelLoadError, ProtocolError
from fairagents.identity import Modality
from fairagents.models import check_model_source, ensure_default_models

__all__ = ["ThreadedEngine"]

_names = itertools.count(1)


class ThreadedEngine(EngineBase):
    """An engine whose model is loaded and run by one thread it owns (see the module docs)."""

    modality: ClassVar[Modality]
    """What the served model takes and gives; also which embedded model ``model=None`` builds."""
    kind: ClassVar[str]
    """Names the engine's threads (``fairagents-<kind>-1``) and its log events."""
    library: ClassVar[str]
    """The library, as the engine's errors name it."""

    def __init__(self, model: str | os.PathLike[str] | None) -> None:
        self.model = None if model is None else str(model)
        self.healthy = True
        self.profile = ModelProfile(d_model=1, n_layers=1)  # the model's own, on start()
        self.max_model_len = 0
        self._tokenizer: Any = None
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._sinks: dict[str, asyncio.Queue[Any]] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failure: EngineError | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Build the embedded model if needed, then load the model on the engine's own thread."""
        if self._thread is not None:
            if self._thread.is_alive() and self._failure is None:
                return
            await self.stop()  # a dead engine: reap its thread, then start anew (a restart)
        self._failure = None
        self.healthy = True
        self._inbox = queue.SimpleQueue()
        if self.model is None:
            kind = self.modality.value
            self.model = str((await asyncio.to_thread(ensure_default_models, [kind]))[kind])
        else:
            try:
                await asyncio.to_thread(check_model_source, self.model)
            except ModelLoadError:
                self.healthy = False
                raise
        self._loop = asyncio.get_running_loop()
        ready: asyncio.Future[Any] = self._loop.create_future()
        self._thread = threading.Thread(target=self._own, args=(ready,), name=f"fairagents-{self.kind}-{next(_names)}",
                                        daemon=True)
        self._thread.start()
        await self._ready(await ready)

    async def stop(self) -> None:
        """Stop the engine's thread and release the model."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._inbox.put(("stop",))
        await asyncio.to_thread(thread.join)
        self._tokenizer = None

    # -- requests ------------------------------------------------------------------

    async def generate(self, request_id: str, prompt: Prompt, params: GenerationParams) -> AsyncIterator[Delta]:
        """Stream one request; closing the stream early ends it in the engine."""
        if self._failure is not None:
            raise self._failure
        if self._thread is None:
            raise EngineError("the engine is not started")
        if request_id in self._sinks:
            raise ProtocolError(f"request id {request_id!r} is already running")
        command = self._command(request_id, prompt, params)
        sink: asyncio.Queue[Any] = asyncio.Queue()
        self._sinks[request_id] = sink
        self._inbox.put(command)
        done = False
        try:
            while True:
                event = await sink.get()
                if isinstance(event, BaseException):
                    done = True
                    raise event
                delta = event if isinstance(event, Delta) else self._delta(event, params)
                done = delta.finish_reason is not None
                yield delta
                if done:
                    return
        finally:
            self._sinks.pop(request_id, None)
            if not done:  # the consumer left early (break, cancel): free the engine's slot
                self._cancel(request_id, notify=False)

    async def abort(self, request_id: str) -> None:
        """End a running request; its stream ends with ``"abort"``."""
        if request_id in self._sinks:
            self._cancel(request_id, notify=True)

    # -- what each library does ----------------------------------------------------

    def _load(self) -> Any:
        """On the thread: load the model; the library's object."""
        raise NotImplementedError

    async def _ready(self, loaded: Any) -> None:
        """On the loop, once loaded: read the profile, context and capacities."""
        raise NotImplementedError

    def _serve(self, loaded: Any, loop: asyncio.AbstractEventLoop) -> None:
        """On the thread: run the inbox's commands until ``("stop",)``."""
        raise NotImplementedError

    def _unload(self, loaded: Any) -> None:
        """On the thread, as it ends: release the library's object."""

    def _command(self, request_id: str, prompt: Prompt, params: GenerationParams) -> tuple[Any, ...]:
        """The inbox command that runs a request (raising for one the engine cannot take)."""
        raise NotImplementedError

    def _cancel(self, request_id: str, *, notify: bool) -> None:
        """End a running request early; with ``notify``, its stream ends with ``"abort"``."""
        raise NotImplementedError

    def _delta(self, event: Any, params: GenerationParams) -> Delta:
        """A library event of a request as a :class:`Delta`."""
        raise TypeError(f"{type(self).__name__} posted an event it cannot stream: {event!r}")

    # -- the owner thread --------------------------------------------------------------

    def _own(self, ready: asyncio.Future[Any]) -> None:
        loop = self._loop
        assert loop is not None
        try:
            loaded = self._load()
        except BaseException as err:  # noqa: BLE001 - any failure to load is reported to start()
            failure = ModelLoadError(f"{self.library} could not load {self.model!r}: {_one_line(err)}")
            failure.__cause__ = err
            self.healthy = False
            self._failure = failure
            loop.call_soon_threadsafe(_settle, ready, None, failure)
            return
        loop.call_soon_threadsafe(_settle, ready, loaded, None)
        ended = EngineError("the engine stopped")
        try:
            self._serve(loaded, loop)
        except BaseException as err:  # noqa: BLE001 - the engine died: fail everything, keep the process
            ended = EngineError(f"{self.library} failed serving {self.model!r}: {err!r}")
            ended.__cause__ = err
            self._failure = ended
            self.healthy = False
            get_logger(f"fairagents.engines.{self.kind}").error(f"fairagents.{self.kind}.failed", model=self.model,
                                                               error=repr(err))
        with contextlib.suppress(RuntimeError):  # the loop may be closed
            loop.call_soon_threadsafe(self._fail_all, ended)
        with contextlib.suppress(Exception):
            self._unload(loaded)
        del loaded
        gc.collect()

    def _post(self, loop: asyncio.AbstractEventLoop, request_id: str, event: Any) -> None:
        """From the thread: hand one event to a request's stream."""
        loop.call_soon_threadsafe(self._deliver, [(request_id, event)])

    def _deliver(self, events: list[tuple[str, Any]]) -> None:
        for rid, event in events:
            sink = self._sinks.get(rid)
            if sink is not None:
                sink.put_nowait(event)

    def _fail_all(self, failure: EngineError) -> None:
        for sink in self._sinks.values():
            sink.put_nowait(failure)


def _one_line(err: BaseException, limit: int = 400) -> str:
    """``err``'s message on one line (whitespace collapsed, at most ``limit`` characters)."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
