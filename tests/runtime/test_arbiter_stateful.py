"""The live arbiter under random interleavings (hypothesis stateful): nothing leaks, nothing is charged twice.

Rules submit calls, cancel them (waiting or running), let engines produce tokens and
finish requests, fail single requests, kill engines, and close the arbiter with a
drain timeout of zero. After every step: no slot or token budget leaks, every request
ends exactly once, charges equal the input of the dispatched requests plus the output
actually produced, and no caller sees an exception that is not its own.
"""

import asyncio

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import fairagents as fa
from fairagents.records import TicketState
from fairagents.engines import Prompt
from fairagents.testing import FakeClock, FakeEngine, RecordingPolicy

MODELS = ("m", "n")
PROMPT = 3  # tokens of every prompt


class CountingPolicy(RecordingPolicy):
    """Counts every arrival and every end the arbiter reports, by request id."""

    def __init__(self, inner):
        super().__init__(inner)
        self.arrived: set[str] = set()
        self.ended: dict[str, int] = {}

    def on_arrival(self, req, now):
        self.inner.on_arrival(req, now)
        self.arrived.add(req.id)

    def on_finish(self, req, outcome, now):
        self.inner.on_finish(req, outcome, now)
        self.ended[req.id] = self.ended.get(req.id, 0) + 1


class ArbiterMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.tasks: list[asyncio.Task] = []
        self.cancelled: set[int] = set()  # task indexes the test cancelled
        self.injected: dict[int, BaseException] = {}  # task index -> the error its request's stream raised
        self.dead: set[str] = set()
        self.closed = False
        self.produced: dict[str, int] = {}  # request id -> tokens its engine emitted
        self.max_tokens: dict[int, int] = {}

    # -- set-up ---------------------------------------------------------------------------

    @initialize(
        policy=st.sampled_from(["hmfs", "vtc", "fcfs", "rr"]),
        in_flight=st.integers(1, 3),
        pool=st.none() | st.integers(1, 3),
        budget=st.none() | st.integers(8, 24),
    )
    def start(self, policy, in_flight, pool, budget):
        cost = fa.UnifiedTokenCost()
        self.policy = CountingPolicy(fa.policies.make_policy(policy, cost))
        self.engines = {m: FakeEngine(manual=True, token_capacity=budget, kv_block_size=2) for m in MODELS}
        self.arbiter = fa.Arbiter(self.policy, in_flight=in_flight, pool_in_flight=pool, clock=self.clock)
        for m, engine in self.engines.items():
            self.arbiter.add_model(m, engine)
        self.agents = [self.arbiter.app(app, weight=w).agent(agent) for app, w in (("a", 1.0), ("b", 2.0))
                       for agent in ("x", "y")]
        self.records = []
        self.arbiter.add_listener(self.records.append)
        self.run(self.arbiter.start())

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def settle(self):
        async def rounds():
            for _ in range(12):
                await asyncio.sleep(0)

        self.run(rounds())

    def teardown(self):
        try:
            if hasattr(self, "arbiter"):
                self.closed = True
                self.run(self.arbiter.close(timeout=0.0))
                self.settle()
                assert all(task.done() for task in self.tasks)
                self.check_every_invariant()
        finally:
            for task in self.tasks:
                task.cancel()

            async def drain():
                await asyncio.gather(*self.tasks, return_exceptions=True)

            self.loop.run_until_complete(drain())
            self.loop.close()

    # -- rules ------------------------------------------------------------------------------

    @rule(who=st.integers(0, 3), model=st.sampled_from(MODELS), max_tokens=st.integers(1, 12))
    def submit(self, who, model, max_tokens):
        index = len(self.tasks)
        self.max_tokens[index] = max_tokens
        prompt = Prompt(token_ids=tuple(range(PROMPT)), data=index)
        call = self.arbiter.complete(model, prompt, agent=self.agents[who], max_tokens=max_tokens)
        self.tasks.append(self.loop.create_task(call))
        self.clock.advance(0.01)
        self.settle()

    @precondition(lambda self: any(not t.done() for t in self.tasks))
    @rule(pick=st.integers(0, 10**6))
    def cancel(self, pick):
        pending = [i for i, t in enumerate(self.tasks) if not t.done()]
        index = pending[pick % len(pending)]
        self.cancelled.add(index)
        self.tasks[index].cancel()
        self.settle()

    def running(self):
        return sorted((m, rid) for m, e in self.engines.items() for rid in e.running)

    @precondition(lambda self: any(e.running for e in self.engines.values()))
    @rule(pick=st.integers(0, 10**6), tokens=st.integers(1, 3), finish=st.booleans())
    def produce(self, pick, tokens, finish):
        model, rid = self.running()[pick % len(self.running())]
        engine = self.engines[model]
        index = engine.prompts[rid].data
        left = self.max_tokens[index] - self.produced.get(rid, 0)
        tokens = min(tokens, left)
        self.produced[rid] = self.produced.get(rid, 0) + tokens
        engine.emit(rid, tokens, "stop" if finish or tokens == left else None)
        self.clock.advance(0.01)
        self.settle()

    @precondition(lambda self: any(e.running for e in self.engines.values()))
    @rule(pick=st.integers(0, 10**6), victim=st.integers(0, 10**6))
    def finish_one_as_a_waiting_caller_cancels(self, pick, victim):
        """A request finishes and a caller gives up in the same loop tick, before either is processed."""
        model, rid = self.running()[pick % len(self.running())]
        running = {self.engines[m].prompts[r].data for m, r in self.running()}
        waiting = [i for i, t in enumerate(self.tasks) if not t.done() and i not in running]
        engine = self.engines[model]
        self.produced[rid] = self.produced.get(rid, 0) + 1
        engine.emit(rid, 1, "stop")
        if waiting:
            index = waiting[victim % len(waiting)]
            self.cancelled.add(index)
            self.tasks[index].cancel()
        self.settle()

    @precondition(lambda self: any(e.running for e in self.engines.values()))
    @rule(pick=st.integers(0, 10**6))
    def fail_one_request(self, pick):
        model, rid = self.running()[pick % len(self.running())]
        error = fa.InvalidParameterError(f"the engine rejected {rid}")  # the request's own fault
        self.injected[self.engines[model].prompts[rid].data] = error
        self.engines[model].fail_request(rid, error)
        self.settle()

    @precondition(lambda self: len(self.tasks) >= 8)  # late, so that most runs see both engines at work
    @rule(model=st.sampled_from(MODELS))
    def kill_engine(self, model):
        self.dead.add(model)
        self.engines[model].fail()
        self.settle()

    @precondition(lambda self: not self.closed and len(self.tasks) >= 8)
    @rule()
    def close(self):
        self.closed = True
        self.run(self.arbiter.close(timeout=0.0))
        self.settle()

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def check_every_invariant(self):
        if not hasattr(self, "arbiter"):
            return
        self.no_slot_or_budget_leaks()
        self.every_request_ends_exactly_once()
        self.charges_are_input_dispatched_plus_output_produced()
        self.callers_see_only_their_own_errors()

    def no_slot_or_budget_leaks(self):
        d = self.arbiter.dispatcher
        live = [t for t in d.tickets() if t.state is TicketState.RUNNING]
        for name, state in d.models.items():
            mine = [t for t in live if t.request.model == name]
            assert state.running == len(mine) == len(self.engines[name].running)
            assert state.reserved == sum(t.reserved for t in mine)
            assert state.running <= state.slots
            assert state.token_budget is None or state.reserved <= state.token_budget
        assert d.pool_running == len(live)
        assert d.pool_slots is None or d.pool_running <= d.pool_slots

    def every_request_ends_exactly_once(self):
        assert all(n == 1 for n in self.policy.ended.values()), self.policy.ended
        ids = [r.id for r in self.records]
        assert len(ids) == len(set(ids)) == len(self.policy.ended)
        live = {t.request.id for t in self.arbiter.dispatcher.tickets()}
        assert set(ids) | live == self.policy.arrived and not set(ids) & live

    def charges_are_input_dispatched_plus_output_produced(self):
        cost = self.arbiter.cost
        expected = 0.0
        for r in self.records:
            assert r.output_tokens == self.produced.get(r.id, 0)
            expected += (cost.input_cost(r.model, r.prompt_tokens) if r.dispatched is not None else 0.0)
            expected += cost.output_cost(r.model, r.output_tokens)
        for t in self.arbiter.dispatcher.tickets():
            if t.state is TicketState.RUNNING:
                expected += cost.input_cost(t.request.model, t.request.prompt_tokens)
                expected += cost.output_cost(t.request.model, self.produced.get(t.request.id, 0))
        assert sum(c.amount for c in self.arbiter.ledger.charges) == pytest.approx(expected)

    def callers_see_only_their_own_errors(self):
        for index, task in enumerate(self.tasks):
            if not task.done():
                continue
            if task.cancelled():
                assert index in self.cancelled
                continue
            error = task.exception()
            if error is None:
                assert isinstance(task.result(), fa.Reply)
            elif index in self.injected and error is self.injected[index]:
                pass
            elif isinstance(error, fa.ContextLengthError):  # larger than the model's whole KV budget: its own
                need = self.arbiter.dispatcher.reservation(error.model, PROMPT, self.max_tokens[index])
                assert need > self.engines[error.model].token_capacity
            elif isinstance(error, fa.EngineError):
                assert error.model in self.dead
            else:
                assert isinstance(error, fa.ShutdownError) and self.closed, repr(error)


ArbiterMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_arbiter_under_random_interleavings = ArbiterMachine.TestCase
