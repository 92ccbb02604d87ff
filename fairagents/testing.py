"""Helpers for testing code that uses fairagents: a fake clock, a decision recorder, a fake engine.

Also re-exports the simulator (:class:`~fairagents.engines.SimEngine`,
:func:`~fairagents.simulation.simulate`) so tests of an app's scheduling need one import.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.testing import FakeClock, RecordingPolicy
    >>> clock = FakeClock()
    >>> policy = RecordingPolicy(fa.policies.HMFS(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)})))
    >>> who = fa.Agent("t", fa.App("a"))
    >>> req = fa.Request(id="r1", agent=who, model="m", prompt_tokens=3, max_tokens=4, arrival=clock())
    >>> policy.on_arrival(req, clock())
    >>> clock.advance(0.5)
    >>> policy.on_dispatch(policy.select("m", clock()), clock())
    >>> policy.decisions
    [Decision(time=0.5, model='m', request_id='r1', app='a', agent='t')]
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import json
import re
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from fairagents.runtime.arbiter import Arbiter
from fairagents.cost import ModelProfile
from fairagents.engines.base import Delta, EngineBase, GenerationParams, Prompt
from fairagents.engines.sim import SimEngine
from fairagents.errors import EngineError, InvalidParameterError
from fairagents.identity import Agent, App
from fairagents.policies.base import DefersInput, Policy
from fairagents.request import Outcome, Request
from fairagents.simulation import SimRequest, SimResult, Workload, simulate

__all__ = [
    "Decision",
    "FakeClock",
    "FakeEngine",
    "RecordingPolicy",
    "SimEngine",
    "SimRequest",
    "Workload",
    "replay_on_arbiter",
    "simulate",
]


class FakeClock:
    """A clock that moves only when told; call it for the time in seconds.

    Examples:
        >>> from fairagents.testing import FakeClock
        >>> clock = FakeClock(start=10.0)
        >>> clock.advance(2.5); clock()
        12.5
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (≥ 0)."""
        if seconds < 0:
            raise InvalidParameterError(f"a clock cannot go back ({seconds} s)")
        self.now += seconds


@dataclass(frozen=True, slots=True)
class Decision:
    """One dispatch a policy made.

    Examples:
        >>> from fairagents.testing import Decision
        >>> Decision(1.0, "m", "r1", "a", "t").app
        'a'
    """

    time: float
    model: str
    request_id: str
    app: str
    agent: str


class RecordingPolicy:
    """Wraps a policy and records every dispatch, in order.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.testing import RecordingPolicy
        >>> RecordingPolicy(fa.policies.FCFS()).name
        'fcfs'
    """

    name: ClassVar[str] = "recording"

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.decisions: list[Decision] = []

    @property
    def cost(self) -> Any:
        """The wrapped policy's cost model (an arbiter prices with it when it counts unified tokens)."""
        return getattr(self.inner, "cost", None)

    def on_arrival(self, req: Request, now: float) -> None:
        self.inner.on_arrival(req, now)

    def select(self, model: str, now: float) -> Request | None:
        return self.inner.select(model, now)

    def select_among(self, models: Iterable[str], now: float) -> Request | None:
        return self.inner.select_among(models, now)

    def on_dispatch(self, req: Request, now: float) -> None:
        self.inner.on_dispatch(req, now)
        self.decisions.append(Decision(now, req.model, req.id, req.app, req.agent.name))

    def on_take(self, req: Request, now: float) -> None:
        """Taken into a batch, its input charged later (:class:`~fairagents.policies.DefersInput`), if the wrapped
        policy defers input; else dispatched and charged at once."""
        if isinstance(self.inner, DefersInput):
            self.inner.on_take(req, now)
        else:
            self.inner.on_dispatch(req, now)
        self.decisions.append(Decision(now, req.model, req.id, req.app, req.agent.name))

    def on_input(self, req: Request, tokens: int, now: float, cached: int = 0) -> None:
        if isinstance(self.inner, DefersInput):
            self.inner.on_input(req, tokens, now, cached)

    def on_progress(self, req: Request, new_output_tokens: int, now: float) -> None:
        self.inner.on_progress(req, new_output_tokens, now)

    def on_finish(self, req: Request, outcome: Outcome, now: float) -> None:
        self.inner.on_finish(req, outcome, now)

    def queued(self, model: str | None = None) -> int:
        return self.inner.queued(model)


class FakeEngine(EngineBase):
    """A test double of an engine: counts words as tokens and emits canned tokens.

    It runs no model and is for testing code around the arbiter (fault handling,
    cancellation, scheduling order) in milliseconds. Two modes:

    - **timed** (default): each request generates ``min(max_tokens, tokens_per_reply)``
      tokens, one every ``token_time`` seconds;
    - **manual** (``manual=True``): a request produces nothing until the test says so
      with :meth:`emit`, :meth:`fail_request` or :meth:`fail` — for deterministic
      interleavings (:attr:`running` lists what the engine holds).

    :meth:`fail` makes every running and future request fail like a crashed engine.
    ``token_capacity`` and ``kv_block_size`` play a real engine's KV capacity (the
    arbiter's token budget reads them); ``max_num_seqs`` its batch capacity;
    ``vocab_size`` the range of token ids a ready prompt may hold; ``max_token_bytes``
    the longest token, for the cheap context check before tokenizing. ``prepare_time``
    makes preparing a prompt burn that many seconds of CPU, like a tokenizer on a long
    prompt (tests of what runs off the event loop).

    ``reply`` scripts what a timed request says: a text, or a function of the request's
    :class:`~fairagents.engines.GenerationParams` returning one; it is emitted a word
    (a token) at a time, up to ``max_tokens``. It plays a model that calls tools (in
    the Hermes syntax, ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, which
    vLLM's ``hermes`` tool parser reads back) or meets a response format; the engine
    takes ``tools`` and constraints but enforces nothing (``params`` says what was asked).

    Examples:
        >>> from fairagents.testing import FakeEngine
        >>> FakeEngine().prepare_chat([{"role": "user", "content": "two words"}]).n_tokens
        3
    """

    structured_outputs = True
    """Takes ``GenerationParams.structured`` (a real engine enforces it; this one records it)."""

    def __init__(
        self,
        *,
        tokens_per_reply: int = 8,
        token_time: float = 0.0,
        max_model_len: int = 4096,
        profile: ModelProfile | None = None,
        token_capacity: int | None = None,
        kv_block_size: int = 1,
        max_num_seqs: int | None = None,
        vocab_size: int | None = None,
        max_token_bytes: int | None = None,
        prepare_time: float = 0.0,
        manual: bool = False,
        shared_capacity: bool = False,
        reply: str | Callable[[GenerationParams], str] | None = None,
    ) -> None:
        self.profile = profile or ModelProfile(d_model=4096, n_layers=1)
        self.shared_capacity = shared_capacity
        self.max_model_len = max_model_len
        self.tokens_per_reply = tokens_per_reply
        self.token_time = token_time
        self.token_capacity = token_capacity
        self.kv_block_size = kv_block_size
        self.vocab_size = vocab_size
        self.max_token_bytes = max_token_bytes
        self.prepare_time = prepare_time
        self.max_num_seqs = max_num_seqs
        self.manual = manual
        self.reply = reply
        self.params: dict[str, GenerationParams] = {}
        """The parameters of every request started, by id."""
        self.tools: list[list[dict[str, Any]] | None] = []
        """The tools each chat prompt rendered (``None``: none), in order."""
        self.healthy = True
        self.started = False
        self.running: set[str] = set()
        self.max_running = 0
        self.started_order: list[str] = []
        self._aborted: set[str] = set()
        self._failure: str | None = None
        self._inbox: dict[str, asyncio.Queue[tuple[Any, ...]]] = {}
        self.prompts: dict[str, Prompt] = {}
        """The prompt of every request started, by id."""

    async def start(self) -> None:
        self.started = True
        self._failure = None  # started again after fail(): a restart
        self.healthy = True

    async def stop(self) -> None:
        self.started = False

    def prepare_chat(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> Prompt:
        self._burn()
        words = sum(len(str(m.get("content") or "").split()) + 1 for m in messages)
        self.tools.append(None if tools is None else [dict(t) for t in tools])
        return Prompt(token_ids=tuple(range(words + len(json.dumps(tools).split() if tools else ()))))

    def tool_parser(self, spec: Any) -> Any:
        """vLLM's ``hermes`` tool parser for ``spec``'s tools (it reads text only)."""
        from fairagents.tools import tool_parser_for

        return tool_parser_for("hermes", self, spec)

    def prepare_text(self, text: str) -> Prompt:
        if not isinstance(text, str) or not text:
            raise InvalidParameterError(f"the prompt must be a non-empty string, got {text!r}")
        self._burn()
        return Prompt(token_ids=tuple(range(len(text.split()) + 1)))

    def _burn(self) -> None:
        """Spend ``prepare_time`` seconds of CPU in Python, holding the GIL between switches, as tokenizing does."""
        end = time.perf_counter() + self.prepare_time
        while time.perf_counter() < end:
            pass

    def fail(self, reason: str = "simulated crash") -> None:
        """Make the engine fail: running requests raise, later ones too."""
        self._failure = reason
        self.healthy = False
        for inbox in self._inbox.values():
            inbox.put_nowait(("fail",))

    def emit(self, request_id: str, tokens: int = 1, finish: str | None = None) -> None:
        """Manual mode: ``request_id`` produces ``tokens`` tokens; ``finish`` (``"stop"``, ``"length"``) ends it."""
        self._inbox.setdefault(request_id, asyncio.Queue()).put_nowait(("emit", tokens, finish))

    def fail_request(self, request_id: str, error: BaseException) -> None:
        """Manual mode: ``request_id``'s stream raises ``error`` (a per-request failure)."""
        self._inbox.setdefault(request_id, asyncio.Queue()).put_nowait(("raise", error))

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)
        inbox = self._inbox.get(request_id)
        if inbox is not None:
            inbox.put_nowait(("abort",))

    async def generate(self, request_id: str, prompt: Prompt, params: GenerationParams) -> AsyncGenerator[Delta, None]:
        if self._failure is not None:
            raise EngineError(f"engine failed: {self._failure}")
        self.running.add(request_id)
        self.started_order.append(request_id)
        self.prompts[request_id] = prompt
        self.max_running = max(self.max_running, len(self.running))
        try:
            if self.manual:
                async for delta in self._manual(request_id):
                    yield delta
                return
            self.params[request_id] = params
            if self.reply is not None:
                async for delta in self._scripted(request_id, params):
                    yield delta
                return
            n = min(params.max_tokens, self.tokens_per_reply)
            for i in range(n):
                await asyncio.sleep(self.token_time)
                if self._failure is not None:
                    raise EngineError(f"engine failed: {self._failure}")
                if request_id in self._aborted:
                    yield Delta(0, "", "abort")
                    return
                last = i == n - 1
                finish = ("length" if n == params.max_tokens else "stop") if last else None
                yield Delta(1, f"t{i} ", finish)
        finally:
            self.running.discard(request_id)
            self._aborted.discard(request_id)
            self._inbox.pop(request_id, None)

    async def _scripted(self, request_id: str, params: GenerationParams) -> AsyncGenerator[Delta, None]:
        text = self.reply(params) if callable(self.reply) else self.reply
        words = re.findall(r"\S*\s*", text or "")[:-1] or [""]
        n = min(params.max_tokens, len(words))
        for i in range(n):
            await asyncio.sleep(self.token_time)
            if request_id in self._aborted:
                yield Delta(0, "", "abort")
                return
            last = i == n - 1
            yield Delta(1, words[i], ("length" if n < len(words) else "stop") if last else None)

    async def _manual(self, request_id: str) -> AsyncGenerator[Delta, None]:
        inbox = self._inbox.setdefault(request_id, asyncio.Queue())
        if request_id in self._aborted:
            inbox.put_nowait(("abort",))
        while True:
            command = await inbox.get()
            if command[0] == "fail" or self._failure is not None:
                raise EngineError(f"engine failed: {self._failure}")
            if command[0] == "raise":
                raise command[1]
            if command[0] == "abort":
                yield Delta(0, "", "abort")
                return
            _, tokens, finish = command
            yield Delta(tokens, "t " * tokens, finish)
            if finish is not None:
                return


def replay_on_arbiter(
    workload: Workload,
    policy: str | Policy,
    engines: Mapping[str, SimEngine],
    *,
    pool_running: int | None = None,
    settle_rounds: int = 4,
) -> SimResult:
    """Play ``workload`` through a live :class:`~fairagents.Arbiter` on a fake clock, timed by simulated engines.

    The twin of :func:`~fairagents.simulation.simulate` on the serving path: each
    request is a real call (``arbiter.complete``) from its own task; each model is a
    :class:`FakeEngine` in manual mode whose tokens are released as its
    :class:`SimEngine` twin finishes a step, with the engine's batch size and KV
    capacity as the arbiter's in-flight limit and token budget, each on a device of its own
    (the simulator gives each engine hardware of its own), or all on one under
    ``pool_running`` (the models share the pool's capacity). The result has the
    shape of :class:`~fairagents.simulation.SimResult`, so the same properties check
    both paths. A request's caller that raises anything but its own cancellation
    makes the replay raise. It runs its own event loop; called from a running loop, it
    runs on a helper thread and blocks until done.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.testing import SimEngine, Workload, replay_on_arbiter
        >>> who = fa.Agent("a", fa.App("x"))
        >>> work = Workload().burst(who, "m", n=3, prompt=4, output=2)
        >>> engines = {"m": SimEngine(fa.ModelProfile(d_model=4096, n_layers=1), max_running=2)}
        >>> result = replay_on_arbiter(work, "hmfs", engines)
        >>> [r.output_tokens for r in result.records], result.idle_with_backlog
        ([2, 2, 2], 0)
    """
    fair = sorted(m for m, e in engines.items() if e.scheduler == "fair")
    if fair:
        raise InvalidParameterError(
            f"replay_on_arbiter replays the arbiter's dispatching on engines that do not schedule themselves; "
            f"{', '.join(fair)} (scheduler='fair') would schedule in the engine: use scheduler='vllm' twins")
    replay = _Replay(workload, policy, engines, pool_running, settle_rounds)
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop running here: the usual case
        return asyncio.run(replay.play())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fairagents-replay") as thread:
        return thread.submit(asyncio.run, replay.play()).result()


class _Replay:
    _STEP, _ARRIVAL, _CANCEL = 0, 1, 2  # the simulator's order of events at one instant

    def __init__(self, workload: Workload, policy: str | Policy, engines: Mapping[str, SimEngine],
                 pool: int | None, settle_rounds: int) -> None:
        self.workload, self.sims, self.pool, self.rounds = workload, engines, pool, settle_rounds
        self.clock = FakeClock()
        self.arbiter = Arbiter(policy, pool_in_flight=pool, clock=self.clock, drain_timeout=0.0)
        self.fakes = {
            m: FakeEngine(manual=True, profile=e.profile, max_model_len=e.max_model_len,
                          token_capacity=e.kv_capacity, max_num_seqs=e.max_running)
            for m, e in engines.items()
        }
        for m, fake in self.fakes.items():
            # each simulated engine has hardware of its own, as simulated; under a pool limit, the pool is one
            self.arbiter.add_model(m, fake, device=m if pool is None else "pool")
        self.apps: dict[str, App] = {}
        self.agents: dict[tuple[str, str], Agent] = {}
        for item in workload.requests:
            who = item.agent
            if who.key not in self.agents:
                self.arbiter.app(who.app.name, who.app.weight, who.app.slo).agent(who.name, who.weight, who.slo)
                self.apps[who.app.name], self.agents[who.key] = who.app, who
        self.events: list[tuple[float, int, int, Any]] = []
        self.seq = itertools.count()
        self.admitted = dict.fromkeys(engines, 0)
        self.idle_with_backlog = 0

    def push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self.events, (t, kind, next(self.seq), payload))

    async def play(self) -> SimResult:
        tasks: dict[int, asyncio.Task[Any]] = {}
        cancelled: set[int] = set()
        for i, item in enumerate(self.workload.requests):
            self.push(item.at, self._ARRIVAL, i)
            if item.cancel_at is not None:
                self.push(max(item.cancel_at, item.at), self._CANCEL, i)
        async with self.arbiter:
            while self.events:
                now, kind, _, payload = heapq.heappop(self.events)
                self.clock.now = max(self.clock.now, now)
                if kind == self._ARRIVAL:
                    item = self.workload.requests[payload]
                    prompt = Prompt(token_ids=tuple(range(item.prompt_tokens)), data=payload)
                    tasks[payload] = asyncio.create_task(self.arbiter.complete(
                        item.model, prompt, agent=item.agent, max_tokens=item.max_tokens or item.output_tokens))
                elif kind == self._STEP:
                    fake = self.fakes[payload]
                    for p in self.sims[payload].finish_step(now):
                        fake.emit(p.request.id, p.new_tokens, "stop" if p.finished else None)
                elif not tasks[payload].done():
                    cancelled.add(payload)
                    tasks[payload].cancel()
                await self._settle()
                self._start_steps(now)
            stuck = [i for i, task in tasks.items() if not task.done()]
            if stuck:  # a dispatch did not reach its engine within settle_rounds: the replay cannot go on
                raise RuntimeError(f"{len(stuck)} requests never finished; raise settle_rounds")
            results = await asyncio.gather(*tasks.values(), return_exceptions=True)
        for i, result in zip(tasks, results, strict=True):
            if isinstance(result, BaseException) and not (i in cancelled and isinstance(result, asyncio.CancelledError)):
                raise result
        arbiter = self.arbiter
        return SimResult(
            policy=arbiter.policy.name, records=list(arbiter.ledger.records), charges=list(arbiter.ledger.charges),
            apps=self.apps, agents=self.agents, cost=arbiter.cost, bound=arbiter.dispatcher.bound(),
            end=self.clock.now, idle_with_backlog=self.idle_with_backlog,
            dispatch_order={m: list(f.started_order) for m, f in self.fakes.items()},
        )

    async def _settle(self) -> None:
        for _ in range(self.rounds):
            await asyncio.sleep(0)

    def _start_steps(self, now: float) -> None:
        """As the simulator: an idle engine admits what was handed to it and starts a step."""
        for m, sim in self.sims.items():
            fake = self.fakes[m]
            for rid in sim.running_ids:
                if rid not in fake.running:  # its caller left: the arbiter aborted it
                    sim.abort(rid)
            if sim.busy:
                continue
            for rid in fake.started_order[self.admitted[m]:]:
                if rid in fake.running:
                    item = self.workload.requests[fake.prompts[rid].data]
                    req = Request(rid, item.agent, m, item.prompt_tokens, item.max_tokens or item.output_tokens, item.at)
                    sim.admit(req, item.output_tokens)
            self.admitted[m] = len(fake.started_order)
            end = sim.start_step(now)
            if end is not None:
                self.push(end, self._STEP, m)
            elif self.arbiter.policy.queued(m) and (self.pool is None or self.arbiter.pool_running < self.pool):
                self.idle_with_backlog += 1
