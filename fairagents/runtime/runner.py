"""The runner: turns the dispatcher's decisions into futures and streams.

A :class:`Call` is the async side of one request. :meth:`Runner.submit` hands its
request to the :class:`~fairagents.dispatcher.Dispatcher`; :meth:`Runner.apply` carries
out what each dispatcher event caused (a dispatched call's future resolves, an ended
one is recorded in the ledger); :meth:`Runner.run` waits for the dispatch, streams the
engine's output and reports progress and the end. The dispatcher decides; the runner
only carries out, and never raises on another request's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fairagents._logging import get_logger
from fairagents.admission import Statera
from fairagents.cost import CostModel
from fairagents.dispatcher import Dispatcher
from fairagents.engines.base import Delta, Engine, GenerationParams, Prompt
from fairagents.errors import EngineError, FairAgentsError, ShutdownError
from fairagents.identity import Agent
from fairagents.images import to_png
from fairagents.policies import Policy
from fairagents.records import Changes, ModelState, RequestRecord, Ticket
from fairagents.reply import ImageReply, Reply, Timing, TokenLogprob, Usage
from fairagents.request import Outcome, Request
from fairagents.runtime.handles import Who
from fairagents.runtime.pool import Pool, PoolModel
from fairagents.runtime.tenants import Tenants
from fairagents.shared import SharedView
from fairagents.stats import Ledger, Stats
from fairagents.tools import ToolCall, ToolReader

__all__ = ["Call", "Runner"]

log = get_logger("fairagents.arbiter")

# Request ids are unique across every arbiter in the process: arbiters may share an engine,
# and vLLM merges requests of the same id (an abort meant for one would end the other).
_request_ids = itertools.count(1)
#: Seconds before the dispatcher looks again at a model whose head it held for the device (the counters move as
#: the device's other engines serve; their in-engine progress does not pass through the dispatcher).
_LOOK_AGAIN = 0.01


@dataclass(eq=False)
class Call:
    """The async side of one request: what its engine needs, and the future its caller awaits."""

    request: Request
    prompt: Prompt
    params: GenerationParams
    dispatched: asyncio.Future[None]
    """Resolved when the dispatcher hands the request to its engine (or failed when it ends it first)."""
    ticket: Ticket | None = None
    """The dispatcher's accounting of it (kept after it ended, for the reply)."""
    shutdown: bool = False
    """Aborted by the arbiter's shutdown, not by its caller."""
    reader: ToolReader | None = None
    """Reads a chat call's output for tool calls (a call with tools or a response format)."""


class Runner:
    """Carries out the dispatcher's decisions for the calls of one arbiter.

    Args:
        policy, cost: the dispatcher's.
        pool, tenants, ledger, clock: the arbiter's.
        pool_slots: the pool's in-flight limit (``None``: models independent).
        app_share: an app's cap on a model's slots and token budget (``None``: none).
        admission: adaptive admission (:class:`~fairagents.admission.Statera`), if any.
        shared: the view of counters shared with other arbiters, if any.
    """

    def __init__(
        self, policy: Policy, cost: CostModel, *, pool: Pool, tenants: Tenants, ledger: Ledger,
        clock: Callable[[], float], pool_slots: int | None, app_share: Callable[[str], float | None],
        admission: Statera | None, shared: SharedView | None,
    ) -> None:
        self.pool = pool
        self.tenants = tenants
        self.ledger = ledger
        self.clock = clock
        self.shared = shared
        self._dispatcher_args = (cost, pool_slots, app_share, admission)
        self.dispatcher = self.new_dispatcher(policy)
        self.accepting = False
        """Whether the arbiter takes requests (set by its lifecycle)."""
        self.on_engine_death: Callable[[str], None] = lambda model: None
        """Called when a model's engine is found dead (the lifecycle schedules its restart)."""
        self.listeners: list[Callable[[RequestRecord], None]] = []
        """Called with the record of every request as it ends."""
        self.submitted: list[Callable[[Request], None]] = []
        """Called with every request as the dispatcher queues it (before it can end)."""
        self.calls: dict[str, Call] = {}
        """The calls queued or running, by request id."""
        self._idle = asyncio.Event()
        self._look_again: asyncio.TimerHandle | None = None

    def new_dispatcher(self, policy: Policy) -> Dispatcher:
        """A dispatcher for a run of the arbiter (a new one after each close)."""
        cost, pool_slots, app_share, admission = self._dispatcher_args
        return Dispatcher(policy, cost, pool_slots=pool_slots, charge=self._charge, is_live=self._is_live,
                          app_share=app_share, queue_bound=self.tenants.max_queued.get, admission=admission,
                          gate=None if self.shared is None else self.shared.gate,
                          lock=None if self.pool.devices is None else self.pool.devices.lock,
                          device_hold=None if self.pool.devices is None else self.pool.devices.holds)

    # -- admitting and submitting ----------------------------------------------

    def check_open(self) -> None:
        """Raise :class:`~fairagents.ShutdownError` unless the arbiter takes requests."""
        if not self.accepting:
            raise ShutdownError("the arbiter is not running: use 'async with arbiter:' or await arbiter.start()")

    def admit(self, model: str, who: Who) -> tuple[PoolModel, Agent]:
        """The one admission check of a request: what submitting it now would raise, before any work on it.

        The arbiter runs, the model and the agent are known, the model is up, and the
        app's queue for the model has room (the dispatcher's bound).
        """
        self.check_open()
        m = self.pool.get(model)
        agent = self.tenants.resolve(who)
        state = self._serving(m, agent)
        if state.down is not None:
            raise EngineError(f"model {model!r} is down: {state.down}", model=model, app=agent.app.name)
        self.dispatcher.check_queue(agent.app.name, model)
        return m, agent

    def submit(self, m: PoolModel, agent: Agent, params: GenerationParams, prompt: Prompt, arrival: float,
               run: str | None = None) -> Call:
        """Queue a request of ``agent`` for ``m``; raises, changing nothing, what the dispatcher refuses.

        The dispatcher refuses what changed since the request was admitted (the arbiter
        closed, the model went down, the app's queue filled) and what can never run
        (a prompt longer than the context or the token budget).
        """
        self.check_open()
        self._serving(m, agent)
        now = self.clock()
        request = Request(f"fa-{next(_request_ids)}", agent, m.name, prompt.n_tokens, params.max_tokens, arrival,
                          run=run)
        params = dataclasses.replace(params, agent=agent, run=run)
        call = Call(request, prompt, params, asyncio.get_running_loop().create_future())
        self.calls[request.id] = call
        try:
            changes = self.dispatcher.arrive(request, now)
        except BaseException:
            del self.calls[request.id]  # if it was queued all the same, it is withdrawn at its turn
            raise
        call.ticket = self.dispatcher.ticket(request.id)
        self.ledger.arrive(request)
        for hook in self.submitted:
            try:
                hook(request)
            except Exception:  # a hook's bug must not leak into the request, nor leave its slot taken
                log.exception("fairagents.arbiter.hook_failed", hook=repr(hook))
        self.apply(changes)
        return call

    # -- running -----------------------------------------------------------------

    async def run(self, call: Call) -> AsyncIterator[Delta]:
        """Wait for the call's dispatch, stream its engine's output, and report progress and its end."""
        r = call.request
        outcome = Outcome.CANCELLED
        try:
            await call.dispatched
            stream = self.pool.models[r.model].engine.generate(r.id, call.prompt, call.params)
            try:
                async for delta in stream:
                    if delta.new_tokens:
                        self.dispatcher.progress(r.id, delta.new_tokens, self.clock(), delta.cached_tokens)
                    if delta.finish_reason == "abort" and call.shutdown:
                        raise ShutdownError("the arbiter shut down and aborted the request after the drain timeout",
                                            model=r.model, app=r.app, request_id=r.id)
                    yield delta
            finally:
                await stream.aclose()
            outcome = Outcome.FINISHED
        except EngineError as err:
            outcome = Outcome.FAILED
            self._fail_model(r.model, err)
            if err.model is None:  # the engine's own error: say which model and request it is about
                raise EngineError(str(err), model=r.model, app=r.app, agent=r.agent.name, request_id=r.id) from err
            raise
        except (asyncio.CancelledError, GeneratorExit):
            outcome = Outcome.FAILED if call.shutdown else Outcome.CANCELLED
            raise
        except FairAgentsError:  # shut down, or rejected by the engine after dispatch
            outcome = Outcome.FAILED
            raise
        except Exception as err:  # an engine bug in this request's stream: surface it typed
            outcome = Outcome.FAILED
            failure = EngineError(f"model {r.model!r} failed: {err!r}", model=r.model, app=r.app, request_id=r.id)
            self._fail_model(r.model, failure)
            raise failure from err
        finally:
            seat = self.pool.seat(r.model)
            if seat is not None:
                seat.unexpect(r.model, r.id)  # if its engine never took it
            self.apply(self.dispatcher.end(r.id, outcome, self.clock()))

    async def stream(self, call: Call) -> AsyncIterator[Delta]:
        """:meth:`run`, with a chat's output read for tool calls when it has a reader.

        With a reader, a delta's ``text`` is the model's content and its ``tool_calls`` the
        pieces of its calls; the last delta has ``finish_reason`` ``"tool_calls"`` when the
        model called any, so the stream adds up to :meth:`collect`'s reply.
        """
        reader = call.reader
        async with contextlib.aclosing(self.run(call)) as run:
            async for delta in run:
                if reader is None:
                    yield delta
                    continue
                content, pieces = reader.feed(delta.text)
                finish = delta.finish_reason
                if finish in ("stop", "length"):  # what the stream owes, so that it adds up to the reply
                    rest, owed = reader.flush()
                    content, pieces = content + rest, [*pieces, *owed]
                    if finish == "stop" and reader.finish()[1]:
                        finish = "tool_calls"
                yield dataclasses.replace(delta, text=content, finish_reason=finish, tool_calls=tuple(pieces))

    async def collect_images(self, call: Call) -> ImageReply:
        """Run an image call to its end and make its reply (the images, and PNG bytes of each)."""
        images: tuple[Any, ...] = ()
        finish = "stop"
        async with contextlib.aclosing(self.run(call)) as run:
            async for delta in run:
                images = delta.images or images
                finish = delta.finish_reason or finish
        reply = self.reply(call, "", finish)
        return ImageReply(images=list(images), png=[to_png(image) for image in images], finish_reason=finish,
                          model=reply.model, request_id=reply.request_id, usage=reply.usage, timing=reply.timing)

    async def collect(self, call: Call) -> Reply:
        """Run ``call`` to its end and make its reply (tool calls parsed when it has a reader)."""
        texts, finish, logprobs = [], "stop", []
        async with contextlib.aclosing(self.run(call)) as run:
            async for delta in run:
                texts.append(delta.text)
                logprobs.extend(delta.logprobs)
                finish = delta.finish_reason or finish
        text = "".join(texts)
        tokens = None if call.params.logprobs is None else tuple(logprobs)
        if call.reader is None:
            return self.reply(call, text, finish, logprobs=tokens)
        content, calls = call.reader.finish(text)
        if calls and finish == "stop":
            finish = "tool_calls"
        return self.reply(call, content or "", finish, tuple(calls), logprobs=tokens)

    def reply(self, call: Call, text: str, finish: str, tool_calls: tuple[ToolCall, ...] = (), *,
              logprobs: tuple[TokenLogprob, ...] | None = None) -> Reply:
        """The reply of an ended call, with its usage and timing."""
        r, t = call.request, call.ticket
        assert t is not None  # set when it was queued
        end = self.clock()
        dispatched = end if t.dispatched is None else t.dispatched
        return Reply(
            text=text, finish_reason=finish, model=r.model, request_id=r.id,
            usage=Usage(r.prompt_tokens, t.produced, t.charged, t.cached),
            timing=Timing(queue_wait=dispatched - r.arrival,
                          ttft=None if t.first_token is None else t.first_token - r.arrival, e2e=end - r.arrival),
            tool_calls=tool_calls, logprobs=logprobs,
        )

    # -- accounts -----------------------------------------------------------------------

    def stats(self) -> Stats:
        """Per app and per agent: service, share vs weight, requests, wait and TTFT percentiles."""
        queued: dict[tuple[str, str], int] = defaultdict(int)
        running: dict[tuple[str, str], int] = defaultdict(int)
        for t in self.dispatcher.tickets():
            (running if t.dispatched is not None else queued)[t.request.agent_key] += 1
        return self.ledger.snapshot({n: a.weight for n, a in self.tenants.apps.items()},
                                    {k: a.weight for k, a in self.tenants.agents.items()}, queued, running,
                                    devices={name: m.device for name, m in self.pool.models.items()})

    def knows(self, app: str, agent: str) -> bool:
        """Whether ``app``'s ``agent`` has any history: a request queued or running, or accounted."""
        key = (app, agent)
        return (self.ledger.knows(app, agent) or any(c.request.agent_key == key for c in self.calls.values())
                or any(t.request.agent_key == key for t in self.dispatcher.tickets()))

    # -- the dispatcher's events -------------------------------------------------

    def apply(self, changes: Changes) -> None:
        """Carry out what a dispatcher event caused. Raises nothing: it runs on other requests' paths."""
        for t in changes.started:
            call = self.calls.get(t.request.id)
            if call is not None and not call.dispatched.done():
                seat = self.pool.seat(t.request.model)
                if seat is not None and self.dispatcher.models[t.request.model].in_engine:
                    seat.expect(t.request)  # its engine's scheduler takes this very request
                call.dispatched.set_result(None)
        for t in changes.ended:
            self._ended(t)
        if not self.calls:
            self._idle.set()
        if self.dispatcher.device_held and self._look_again is None:
            with contextlib.suppress(RuntimeError):  # no running loop: the next event looks again
                self._look_again = asyncio.get_running_loop().call_later(_LOOK_AGAIN, self._refill_held)

    def _refill_held(self) -> None:
        """A model's head was held for its device: the counters have moved since, look again."""
        self._look_again = None
        self.refill()

    def _ended(self, t: Ticket) -> None:
        r = t.request
        call = self.calls.pop(r.id, None)
        if call is not None and not call.dispatched.done():
            call.dispatched.set_exception(t.error or ShutdownError("the request ended before it ran", request_id=r.id))
        record = t.record()
        self.ledger.record(record)
        for listener in self.listeners:
            try:
                listener(record)
            except Exception:  # a listener's bug must not leak into the request that ended
                log.exception("fairagents.arbiter.listener_failed", listener=repr(listener))

    async def wait_idle(self, timeout: float) -> None:
        """Wait up to ``timeout`` s until no call is queued or running."""
        if self.calls:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout)

    def refill(self) -> None:
        """Something outside the dispatcher changed (a shared view's sync, the device's counters): a held dispatch may go now."""
        if self.accepting:
            self.apply(self.dispatcher.refill(self.clock()))

    def _is_live(self, request_id: str) -> bool:
        call = self.calls.get(request_id)
        return call is not None and not call.dispatched.done()

    def _charge(self, now: float, request: Request, amount: float) -> None:
        self.ledger.charge(now, request.app, request.agent.name, amount, request)
        if self.shared is not None:
            self.shared.charge(request, amount)

    # -- engine failures -------------------------------------------------------------

    def _serving(self, m: PoolModel, agent: Agent) -> ModelState:
        """The dispatcher's state of ``m``, which has started; an engine found dead now takes it down.

        An engine that died with nothing running is noticed when a request comes.
        """
        state = self.dispatcher.models.get(m.name)
        if state is None:
            raise EngineError(f"model {m.name!r} is starting", model=m.name, app=agent.app.name)
        if state.down is None and not m.engine.healthy:
            self.engine_died(m.name, EngineError(f"model {m.name!r}'s engine is dead", model=m.name))
        return state

    def _fail_model(self, model: str, err: EngineError) -> None:
        """A request's stream failed: the model goes down only if its engine reports itself dead."""
        if self.pool.models[model].engine.healthy:
            log.warning("fairagents.arbiter.request_failed", model=model, error=str(err))
        else:
            self.engine_died(model, err)

    def engine_died(self, model: str, err: EngineError) -> None:
        """Take ``model`` down (its waiting requests fail) and have the lifecycle restart it."""
        if self.dispatcher.model(model).down is not None:
            return
        log.error("fairagents.arbiter.engine_failed", model=model, error=str(err))
        seat = self.pool.seat(model)
        if seat is not None and self.dispatcher.model(model).in_engine:
            seat.forget(model)  # what its scheduler held will never end there
        self.on_engine_death(model)
        self.apply(self.dispatcher.model_down(model, err, self.clock()))
