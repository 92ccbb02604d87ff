"""The lifecycle of an arbiter: start, drain and close, and bringing dead models back.

:class:`Lifecycle` starts the pool's engines and opens the runner for requests, closes
them after draining accepted work, and restarts a model whose engine died. It is also
the interface a :class:`~fairagents.Portal` uses to reach an arbiter from another
thread or loop: :attr:`Lifecycle.loop`, :meth:`Lifecycle.until_started`, and the locks
that keep every portal in agreement on who starts the arbiter.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from fairagents._logging import get_logger
from fairagents.engines.base import capabilities
from fairagents.errors import EngineError, ProtocolError, ShutdownError
from fairagents.runtime.pool import Pool, PoolModel, Restart, schedules_fairly
from fairagents.runtime.runner import Runner
from fairagents.shared import SharedCounters, SharedView

if TYPE_CHECKING:
    from fairagents.runtime.preprocessing import Preprocessor

__all__ = ["Lifecycle"]

log = get_logger("fairagents.arbiter")


class Lifecycle:
    """Starts, drains, closes and restarts the engines of one arbiter.

    Args:
        pool, runner: the arbiter's.
        restart: how a model whose engine died is brought back (``None``: left down).
        drain_timeout: seconds a close waits for accepted work by default.
        preprocessors: the pools closed with the arbiter.
        counters, shared: counters shared with other arbiters, and the arbiter's view of them.
    """

    def __init__(self, pool: Pool, runner: Runner, *, restart: Restart | None, drain_timeout: float,
                 preprocessors: tuple[Preprocessor, ...], counters: SharedCounters | None,
                 shared: SharedView | None) -> None:
        self.pool = pool
        self.runner = runner
        self.restart = restart
        self.drain_timeout = drain_timeout
        self.counters = counters
        self.shared = shared
        self._preprocessors = preprocessors
        self.started = False
        """Whether the arbiter has started and not closed since."""
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop the arbiter last started on; its engines belong to it."""
        self.portal_lock = threading.Lock()
        """Held by a portal deciding whether to start the arbiter (one of them starts a loop thread)."""
        self.send_lock = threading.Lock()
        """Held while a portal sends a call to the loop, and while a close marks the loop stopping."""
        self._closing = False
        self._starting: asyncio.Future[None] | None = None  # done when a start under way ends
        self._start_failure: BaseException | None = None  # why the last start failed
        self._restarts: dict[str, asyncio.Task[None]] = {}
        runner.on_engine_death = self._schedule_restart

    @property
    def closed(self) -> bool:
        """Neither running nor starting (never started, or closed since)."""
        return not self.started and self._starting is None

    async def start(self) -> None:
        """Start every engine (in parallel) and open for requests (see :meth:`fairagents.Arbiter.start`)."""
        if self.started:
            return
        if self._starting is not None:
            await self.until_started()
            return
        if self.runner.calls:  # requests of the last run are still ending: they belong to its dispatcher
            raise ShutdownError(f"{len(self.runner.calls)} requests of the arbiter's last run have not ended yet")
        loop = asyncio.get_running_loop()
        # The loop is known from the start on, so that a portal call made while the engines
        # start waits for them on this loop (see until_started) instead of starting another.
        previous, self.loop = self.loop, loop
        self._starting = loop.create_future()
        self._start_failure = None
        try:
            await self._start()
        except BaseException as err:
            self._start_failure = err
            raise
        finally:
            if not self.started:
                self.loop = previous
            self._starting.set_result(None)
            self._starting = None

    async def _start(self) -> None:
        try:
            await self.pool.start(list(self.pool.models.values()))
        except asyncio.CancelledError:  # cancelled half-way (Ctrl-C in a sync caller): nothing is left running
            await self.pool.stop()
            raise
        runner = self.runner
        if runner.dispatcher.closed:  # started again after a close
            runner.dispatcher = runner.new_dispatcher(runner.dispatcher.policy)
        for m in self.pool.models.values():
            if m.name not in runner.dispatcher.models:
                self.register(m)
        if self.counters is not None and self.shared is not None:
            self.shared.bind(runner.dispatcher, self.shared_models())
            self.counters.attach(self.shared, runner.refill)
            try:
                await self.counters.start()
            except BaseException:  # nothing is left running
                await self.pool.stop()
                raise
        if self.pool.policy is not None:
            self.pool.policy.watchdog.start()
        self.started, self._closing = True, False
        runner.accepting = True
        log.info("fairagents.arbiter.started", models=list(self.pool.models), policy=runner.dispatcher.policy.name)

    async def until_started(self) -> None:
        """Wait for a start under way to end (at once when none is); raise if it failed.

        Raises:
            ProtocolError: the start is under way on another event loop (call through a portal).
            ShutdownError: the start it waited for failed (that start raised why).
        """
        starting = self._starting
        if starting is None:
            return
        if starting.get_loop() is not asyncio.get_running_loop():
            raise ProtocolError("the arbiter is starting on another event loop: call it through a fairagents.Portal")
        await asyncio.shield(starting)
        if not self.started:
            raise ShutdownError(f"the arbiter failed to start: {self._start_failure!r}") from self._start_failure

    def on_loop(self, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` on the arbiter's loop: soon from another thread, at once on it or with none running."""
        loop = self.loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is not None and here is not loop and loop.is_running():
            try:
                loop.call_soon_threadsafe(fn, *args)
                return
            except RuntimeError:  # the loop closed meanwhile: nothing else runs there now
                pass
        fn(*args)

    def register(self, m: PoolModel) -> None:
        """Open a started model for requests, with its limits."""
        caps = capabilities(m.engine)
        seat = self.pool.seat(m.name)
        if seat is not None:  # its device's engines take one order: the seat knows each of them
            seat.register(m.name, m.engine.profile)
        self.runner.dispatcher.add_model(m.name, m.engine.profile, slots=self.pool.limit(m),
                                         token_budget=self.pool.budget(m), max_model_len=m.engine.max_model_len,
                                         block=self.pool.block(m), in_engine=schedules_fairly(m.engine),
                                         kv_tokens=caps.token_capacity if isinstance(caps.token_capacity, int) else None)

    def shared_models(self) -> set[str]:
        """Models whose capacity other arbiters may draw on too (remote replicas)."""
        return {m.name for m in self.pool.models.values() if capabilities(m.engine).shared_capacity}

    async def close(self, timeout: float | None, *, stop_engines: bool, abort_timeout: float) -> None:
        """Stop admitting, drain, abort the rest, stop engines (see :meth:`fairagents.Arbiter.close`)."""
        if not self.started:
            return
        runner = self.runner
        self._closing, runner.accepting = True, False
        restarts, self._restarts = list(self._restarts.values()), {}
        for task in restarts:
            task.cancel()
        await asyncio.gather(*restarts, return_exceptions=True)
        await runner.wait_idle(self.drain_timeout if timeout is None else timeout)
        if runner.calls:
            log.warning("fairagents.arbiter.drain_timeout", aborted=len(runner.calls))
            runner.apply(runner.dispatcher.close(runner.clock()))  # the waiting fail with ShutdownError
            for call in list(runner.calls.values()):
                call.shutdown = True
                await self.pool.models[call.request.model].engine.abort(call.request.id)
            await runner.wait_idle(abort_timeout)
        runner.dispatcher.close(runner.clock())
        if self.counters is not None:
            await self.counters.close()
        for preprocessor in self._preprocessors:
            preprocessor.close()
        if stop_engines:
            await self.pool.stop()
        if self.pool.policy is not None:
            self.pool.policy.watchdog.stop()
        self.started = False
        log.info("fairagents.arbiter.closed")

    # -- restarts ------------------------------------------------------------------

    async def restart_model(self, model: str, attempts: int | None, backoff: float | None) -> None:
        """Restart ``model``'s engine now (see :meth:`fairagents.Arbiter.restart_model`)."""
        runner = self.runner
        runner.check_open()
        m = self.pool.get(model)
        pending = self._restarts.pop(model, None)
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        base = self.restart or Restart()
        plan = Restart(base.attempts if attempts is None else attempts, base.backoff if backoff is None else backoff,
                       base.max_backoff)
        if runner.dispatcher.model(model).down is None:
            down = EngineError(f"model {model!r} is restarting", model=model)
            runner.apply(runner.dispatcher.model_down(model, down, runner.clock()))
        await self.pool.restart(m, plan)
        runner.apply(runner.dispatcher.model_up(model, runner.clock()))
        log.info("fairagents.arbiter.model_restarted", model=model)

    def restarting(self, model: str) -> bool:
        """Whether an automatic restart of ``model`` is pending or under way."""
        task = self._restarts.get(model)
        return task is not None and not task.done()

    def restart_eta(self, model: str) -> float | None:
        """Seconds until a restarting ``model`` is likely back: the backoff plus its engine's last start time."""
        if not self.restarting(model) or self.restart is None:
            return None
        return self.restart.backoff + (self.pool.get(model).start_time or 0.0)

    def _schedule_restart(self, model: str) -> None:
        if self.restart is not None and not self._closing and model not in self._restarts:
            self._restarts[model] = asyncio.get_running_loop().create_task(self._auto_restart(model, self.restart))

    async def _auto_restart(self, model: str, plan: Restart) -> None:
        """Bring a dead model back by :attr:`restart`; on giving up it stays down (logged)."""
        try:
            await asyncio.sleep(plan.backoff)
            await self.pool.restart(self.pool.models[model], plan)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.error("fairagents.arbiter.restart_failed", model=model, attempts=plan.attempts, error=repr(err))
        else:
            if self.started and not self._closing:
                self.runner.apply(self.runner.dispatcher.model_up(model, self.runner.clock()))
                log.info("fairagents.arbiter.model_restarted", model=model, automatic=True)
        finally:
            if self._restarts.get(model) is asyncio.current_task():
                del self._restarts[model]
