"""The arbiter's dispatcher and an in-engine scheduler's queue on one policy, under random interleavings.

Hypothesis drives what an arbiter and a vLLM engine do with a request handed over at
once: it arrives (the dispatcher hands it over, the engine queues it), the engine
takes the policy's choice into its batch (part of its prompt found in the prefix
cache), skips it (a grammar compiling; it is charged only once a step runs it, so a
skipped request that is cancelled costs nothing), preempts it, steps out tokens,
finishes it, the caller cancels it (waiting, skipped or running), the engine dies (its
requests fail; a restarted queue forgets them) and the arbiter closes. Requests with
``n > 1`` also arrive at the engine alone (as from ``vllm serve``): vLLM's children
``<i>_<id>`` share one prompt.
After every step: the policy holds exactly what the engine holds, every request ends
in the policy once, and the pool's charges are each dispatched request's prompt once
(its cached tokens at ``w_cached``; never again after a preemption; once for all the
choices of ``n > 1``) plus the output produced while it ran; the dispatcher's ledger
charges each request that produced output exactly what the engine charged it.
"""

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

pytest.importorskip("vllm")
from vllm import SamplingParams
from vllm.v1.request import Request as VllmRequest
from vllm.v1.request import RequestStatus

import fairagents as fa
from fairagents.dispatcher import Dispatcher
from fairagents.policies.pooled import PoolPolicy
from fairagents.testing import RecordingPolicy
from fairagents.vllm.queue import Binding, FairQueue
from fairagents.vllm.scheduler import FairScheduler

PROFILE = fa.ModelProfile(d_model=4096, n_layers=1)
APPS = ("a", "b", "c")


class Ends(RecordingPolicy):
    """Counts the arrivals and ends the policy is told of, by request id (a preempted request arrives again)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.arrived: dict[str, int] = {}
        self.ended: dict[str, int] = {}

    def on_arrival(self, req, now):
        self.inner.on_arrival(req, now)
        self.arrived[req.id] = self.arrived.get(req.id, 0) + 1

    def on_finish(self, req, outcome, now):
        self.inner.on_finish(req, outcome, now)
        self.ended[req.id] = self.ended.get(req.id, 0) + 1

    def queued(self, model=None):
        return self.inner.queued(model)


class HandedOver(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        cost = fa.UnifiedTokenCost()
        self.policy = Ends(fa.policies.make_policy("hmfs", cost))
        self.seat = PoolPolicy(self.policy, cost)
        self.seat.register("m", PROFILE)
        self.dispatcher = Dispatcher(self.policy, cost, lock=self.seat.lock)
        self.dispatcher.add_model("m", PROFILE, slots=2, token_budget=None, max_model_len=4096, in_engine=True,
                                  kv_tokens=4096)
        self.twins = {}
        self.sched = object.__new__(FairScheduler)  # its _twin_of, for requests the arbiter did not hand over
        self.sched.weights, self.sched.metrics, self.sched._twins = None, None, {}
        self.sched.binding = Binding(self.seat, "m")
        self.queue = FairQueue(Binding(self.seat, "m"), self._twin_of)
        self.charged_by = {}  # request id -> what the engine charged it (prompt at admission, output)
        self.hits = {}  # request id -> prompt tokens it found in the prefix cache at its first admission
        self.engine = {}  # id -> vLLM request the engine holds
        self.running = []
        self.expected_charge = 0.0
        self.prompt_charged = set()
        self.n = 0
        self.closed = False

    def _twin_of(self, r):
        twin = self.twins.get(r.request_id)
        if twin is None:
            twin = self.seat.expected("m", r.request_id)
            if twin is None:  # not handed over: built from its arguments, as FairScheduler does
                assert "_" in r.request_id, "the engine takes the arbiter's own request"
                twin = self.sched._twin_of(r)
            self.twins[r.request_id] = twin
        return twin

    def _end_in_engine(self, r, outcome):
        self.engine.pop(r.request_id, None)
        if r in self.running:
            self.running.remove(r)
        self.queue.remove_request(r) if outcome is fa.Outcome.CANCELLED else None
        self.seat.engine_end("m", r.request_id, outcome)
        self.twins.pop(r.request_id, None)
        self.sched._twins.pop(r.request_id, None)

    def _ledger(self, rid):
        """The dispatcher's ticket of a request the arbiter handed over (``None`` for one it did not)."""
        return None if "_" in rid else self.dispatcher.ticket(rid)

    @precondition(lambda self: not self.closed)
    @rule(app=st.sampled_from(APPS), prompt=st.integers(1, 40))
    def arrive(self, app, prompt):
        rid = f"r{self.n}"
        self.n += 1
        request = fa.Request(rid, fa.Agent("t", fa.App(app)), "m", prompt, 64, arrival=float(self.n))
        changes = self.dispatcher.arrive(request, float(self.n))
        assert [t.request.id for t in changes.started] == [rid]  # handed over at once
        self.seat.expect(request)
        vreq = VllmRequest(rid, list(range(prompt)), SamplingParams(max_tokens=64), None, arrival_time=float(self.n))
        self.engine[rid] = vreq
        self.queue.add_request(vreq)

    @precondition(lambda self: not self.closed)
    @rule(app=st.sampled_from(APPS), prompt=st.integers(1, 40), n=st.integers(2, 3))
    def arrive_with_n(self, app, prompt, n):
        """A request with ``n`` choices straight to the engine: vLLM adds its children ``<i>_<id>`` at once."""
        parent = f"p{self.n}"
        self.n += 1
        for i in range(n):
            rid = f"{i}_{parent}"
            params = SamplingParams(max_tokens=64, extra_args={"fairagents_app": app})
            vreq = VllmRequest(rid, list(range(prompt)), params, None, arrival_time=float(self.n))
            self.engine[rid] = vreq
            self.queue.add_request(vreq)

    @precondition(lambda self: bool(self.queue))
    @rule(skip=st.booleans(), data=st.data())
    def schedule(self, skip, data):
        r = self.queue.pop_request()
        if skip:  # vLLM puts it back unscheduled this step: it keeps its turn, and costs nothing yet
            self.queue.prepend_requests([r])
            self.queue.admit_scheduled(lambda rid: False)
            self.queue.new_step()
            return
        rid = r.request_id
        hits = data.draw(st.integers(0, r.num_prompt_tokens), label="prefix-cache hit")
        if r.status == RequestStatus.WAITING and rid not in self.prompt_charged:
            self.prompt_charged.add(rid)  # charged as the step runs it, never again
            self.hits[rid] = hits
            if not (rid[0] != "0" and "_" in rid):  # a later choice of n > 1 shares its first choice's prompt
                charge = (r.num_prompt_tokens - hits) + 0.1 * hits
                self.expected_charge += charge
                self.charged_by[rid] = charge
        r.status = RequestStatus.RUNNING
        self.running.append(r)
        self.queue.admit_scheduled(lambda other: other == rid, {rid: hits})

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def preempt(self, data):
        r = data.draw(st.sampled_from(self.running))
        self.queue.new_step()  # vLLM preempts in a step after the one that scheduled it
        self.running.remove(r)
        r.status = RequestStatus.PREEMPTED
        r.num_preemptions += 1
        self.queue.prepend_request(r)

    @precondition(lambda self: bool(self.running))
    @rule(tokens=st.integers(1, 5))
    def step(self, tokens):
        self.queue.new_step()
        self.seat.engine_progress("m", [(r.request_id, tokens) for r in self.running])
        for r in self.running:
            rid = r.request_id
            if self._ledger(rid) is not None:
                self.dispatcher.progress(rid, tokens, 0.0, self.hits[rid])  # vLLM reports the first prefill's hit
            self.expected_charge += 2 * tokens
            self.charged_by[rid] = self.charged_by.get(rid, 0.0) + 2 * tokens

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def finish(self, data):
        r = data.draw(st.sampled_from(self.running))
        r.status = RequestStatus.FINISHED_STOPPED
        self._end_in_engine(r, fa.Outcome.FINISHED)
        ticket = self._ledger(r.request_id)
        if ticket is not None:
            self.dispatcher.end(r.request_id, fa.Outcome.FINISHED if ticket.first_token else fa.Outcome.CANCELLED,
                                0.0)

    @precondition(lambda self: bool(self.engine))
    @rule(data=st.data())
    def cancel(self, data):
        rid = data.draw(st.sampled_from(sorted(self.engine)))
        r = self.engine[rid]
        r.status = RequestStatus.FINISHED_ABORTED
        self._end_in_engine(r, fa.Outcome.CANCELLED)
        if self._ledger(rid) is not None:
            self.dispatcher.cancel(rid, 0.0)

    @precondition(lambda self: len(self.engine) > 2)
    @rule()
    def engine_dies_and_restarts(self):
        for rid in list(self.engine):
            if self._ledger(rid) is not None:
                self.dispatcher.fail(rid, 0.0)
        self.engine.clear()
        self.running.clear()
        self.twins.clear()
        self.sched._twins.clear()
        self.seat.forget("m")
        self.queue = FairQueue(Binding(self.seat, "m"), self._twin_of)

    @precondition(lambda self: not self.closed and self.n > 12)
    @rule()
    def close(self):
        self.closed = True
        self.dispatcher.close(0.0)

    @rule()
    def wait(self):
        """Nothing happens (after a close, once the engine is empty, nothing else can)."""

    @invariant()
    def the_policy_holds_what_the_engine_holds(self):
        waiting = [r for r in self.engine.values() if r.status != RequestStatus.RUNNING]
        assert self.policy.queued("m") == len([r for r in waiting if r not in self.queue._chosen])
        assert self.seat.held("m") == len(self.engine)
        assert len(self.queue) == len(waiting)
        assert {t.request.id for t in self.dispatcher.tickets()} == {rid for rid in self.engine if "_" not in rid}

    @invariant()
    def every_request_ends_in_the_policy_once_per_arrival(self):
        for rid, arrived in self.policy.arrived.items():
            assert self.policy.ended.get(rid, 0) == arrived - (rid in self.engine), rid

    @invariant()
    def charges_are_each_prompt_once_plus_the_output_produced(self):
        assert sum(self.seat.charged.values()) == pytest.approx(self.expected_charge)

    @invariant()
    def the_ledger_charges_what_the_engine_charged(self):
        for ticket in self.dispatcher.tickets():
            if ticket.first_token is not None:
                assert ticket.charged == pytest.approx(self.charged_by[ticket.request.id]), ticket.request.id


HandedOver.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])
test_the_arbiter_and_an_in_engine_queue_share_one_policy_without_leaks = HandedOver.TestCase
