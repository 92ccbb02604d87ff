"""The dispatcher alone: admission by slots, pool slots and token budget; events; never raising into a bystander."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fairagents as fa
from fairagents.dispatcher import Dispatcher
from fairagents.errors import ProtocolError
from fairagents.records import TicketState
from fairagents.testing import RecordingPolicy

PROFILE = fa.ModelProfile(d_model=64, n_layers=1)
A, B = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))


def make(policy="hmfs", *, slots=4, budget=None, max_model_len=1000, block=1, pool=None, live=None, models=("m",),
         share=None, bound=None):
    cost = fa.UnifiedTokenCost(d_base=64)
    charges = []
    d = Dispatcher(fa.policies.make_policy(policy, cost), cost, pool_slots=pool,
                   charge=lambda now, r, amount: charges.append((r.id, amount)), is_live=live,
                   app_share=None if share is None else share.get, queue_bound=None if bound is None else bound.get)
    for m in models:
        d.add_model(m, PROFILE, slots=slots, token_budget=budget, max_model_len=max_model_len, block=block)
    return d, charges


def req(id, who=A, prompt=10, max_tokens=10, model="m", arrival=0.0):
    return fa.Request(id, who, model, prompt, max_tokens, arrival)


def started(changes):
    return [t.request.id for t in changes.started]


def test_a_request_reserves_prompt_plus_max_tokens_and_the_head_waits_for_kv():
    d, _ = make(budget=50)
    assert started(d.arrive(req("big", prompt=20, max_tokens=20), 0.0)) == ["big"]
    # 40 of 50 reserved: the next (20 tokens) waits although slots are free, and a
    # smaller request behind it does not jump ahead (the policy's order holds).
    assert started(d.arrive(req("next", A, 10, 10), 0.0)) == []
    assert started(d.arrive(req("small", A, 1, 1), 0.0)) == []
    assert (d.model("m").running, d.model("m").reserved) == (1, 40)
    assert started(d.finish("big", 1.0)) == ["next", "small"]
    assert d.model("m").reserved == 22


def test_reservations_round_up_to_the_kv_block():
    d, _ = make(budget=64, block=16)
    assert d.reservation("m", 10, 7) == 32
    d.arrive(req("r1", prompt=10, max_tokens=7), 0.0)
    d.arrive(req("r2", prompt=10, max_tokens=7), 0.0)
    assert started(d.arrive(req("r3", prompt=1, max_tokens=1), 0.0)) == []  # 32 + 32 = 64: full
    assert d.model("m").reserved == 64


def test_a_request_larger_than_the_whole_budget_is_bad_input_and_changes_nothing():
    d, charges = make(budget=50)
    with pytest.raises(fa.ContextLengthError, match="needs 60 tokens of KV cache; model 'm' holds 50") as err:
        d.arrive(req("huge", prompt=30, max_tokens=30), 0.0)
    assert isinstance(err.value, ValueError)
    assert (err.value.model, err.value.app, err.value.request_id) == ("m", "a", "huge")
    with pytest.raises(fa.ContextLengthError, match="context"):
        d.arrive(req("long", prompt=900, max_tokens=200), 0.0)
    assert d.tickets() == [] and charges == [] and d.policy.queued() == 0


def test_slots_bound_requests_in_flight():
    d, _ = make(slots=2)
    ids = [started(d.arrive(req(f"r{i}"), 0.0)) for i in range(4)]
    assert ids == [["r0"], ["r1"], [], []]
    assert started(d.cancel("r0", 1.0)) == ["r2"]


def test_pool_slots_bound_requests_across_models():
    d, _ = make(slots=4, pool=3, models=("m", "n"))
    for i in range(3):
        d.arrive(req(f"m{i}", model="m"), 0.0)
    assert started(d.arrive(req("n0", model="n"), 0.0)) == []
    assert d.pool_running == 3
    assert started(d.finish("m0", 1.0)) == ["n0"]  # the slot freed on m goes to the request waiting for n


def test_input_is_charged_at_dispatch_and_output_as_it_is_reported():
    d, charges = make()
    d.arrive(req("r1", prompt=7), 0.0)
    assert charges == [("r1", 7.0)]
    assert d.progress("r1", 3, 0.5) == 6.0 and d.progress("r1", 0, 0.6) == 0.0
    ticket = d.ticket("r1")
    assert (ticket.produced, ticket.charged, ticket.first_token) == (3, 13.0, 0.5)
    [ended] = d.finish("r1", 1.0).ended
    record = ended.record()
    assert (record.dispatched, record.first_token, record.finished, record.output_tokens) == (0.0, 0.5, 1.0, 3)
    assert record.outcome is fa.Outcome.FINISHED


def test_ending_twice_is_a_no_op_so_racing_ends_are_safe():
    d, _ = make(slots=1)
    d.arrive(req("a1"), 0.0)
    d.arrive(req("b1", B), 0.0)
    first = d.finish("a1", 1.0)
    assert started(first) == ["b1"]
    again = d.cancel("a1", 1.0)
    assert again.started == [] and again.ended == []
    assert d.model("m").running == 1


def test_a_caller_that_left_before_its_turn_is_cancelled_uncharged_and_the_next_goes():
    gone = {"b1"}
    d, charges = make(slots=1, live=lambda rid: rid not in gone)
    d.arrive(req("a1"), 0.0)
    d.arrive(req("b1", B), 0.0)
    d.arrive(req("a2"), 0.0)
    changes = d.finish("a1", 1.0)
    assert started(changes) == ["a2"]
    withdrawn = [t for t in changes.ended if t.request.id == "b1"]
    assert withdrawn and withdrawn[0].outcome is fa.Outcome.CANCELLED and withdrawn[0].dispatched is None
    assert "b1" not in [rid for rid, _ in charges]


def test_model_down_fails_its_waiting_requests_and_refuses_new_ones_until_up():
    d, _ = make(slots=1, models=("m", "n"))
    d.arrive(req("run"), 0.0)
    d.arrive(req("wait"), 0.0)
    d.arrive(req("other", model="n"), 0.0)
    err = fa.EngineError("boom", model="m")
    [ended] = d.model_down("m", err, 1.0).ended
    assert ended.request.id == "wait" and ended.outcome is fa.Outcome.FAILED
    assert isinstance(ended.error, fa.EngineError) and ended.error.request_id == "wait"
    assert d.ticket("run").state is TicketState.RUNNING  # it ends when its stream reports the failure
    with pytest.raises(fa.EngineError, match="down") as refused:
        d.arrive(req("late"), 1.0)
    assert refused.value.model == "m"
    d.fail("run", 1.0)
    assert started(d.model_up("m", 2.0)) == []
    assert started(d.arrive(req("back"), 2.0)) == ["back"]
    assert d.ticket("other").state is TicketState.RUNNING  # the other model never noticed


def test_close_fails_the_waiting_and_dispatches_nothing_more():
    d, _ = make(slots=1)
    d.arrive(req("run"), 0.0)
    d.arrive(req("wait"), 0.0)
    [ended] = d.close(1.0).ended
    assert isinstance(ended.error, fa.ShutdownError)
    assert d.finish("run", 2.0).started == []
    with pytest.raises(fa.ShutdownError):
        d.arrive(req("late"), 2.0)


def test_driver_bugs_are_protocol_errors_not_bad_input():
    d, _ = make(slots=1)
    d.arrive(req("run"), 0.0)
    d.arrive(req("wait"), 0.0)
    with pytest.raises(ProtocolError):
        d.progress("wait", 1, 0.0)
    with pytest.raises(ProtocolError):
        d.finish("wait", 0.0)
    with pytest.raises(ProtocolError):
        d.arrive(req("run"), 0.0)
    assert d.policy.queued() == 1 and d.model("m").running == 1


def test_a_full_queue_refuses_the_app_changing_nothing_until_a_request_starts_or_ends():
    d, charges = make("fcfs", slots=1, bound={"a": 2}, models=("m", "n"))
    d.arrive(req("run"), 0.0)
    d.arrive(req("w1"), 0.0)
    d.arrive(req("w2"), 0.0)
    d.arrive(req("b1", B), 0.0)  # another app, unbounded
    d.arrive(req("n1", model="n"), 0.0)  # the same app, another model
    assert d.queued("m", app="a") == 2 and d.queued(app="a") == 2
    before = (d.tickets(), d.queued("m"), list(charges))
    with pytest.raises(fa.OverloadedError, match="app 'a' has 2 requests queued for model 'm', its bound") as full:
        d.check_queue("a", "m")
    assert (full.value.retry_after, full.value.app, full.value.model) == (1.0, "a", "m")  # nothing finished yet
    with pytest.raises(fa.OverloadedError):
        d.arrive(req("w3"), 0.0)
    assert (d.tickets(), d.queued("m"), charges) == before and d.ticket("w3") is None
    d.cancel("w1", 0.5)  # a waiting request that ends stops counting
    d.arrive(req("w3"), 0.5)
    with pytest.raises(fa.OverloadedError):
        d.check_queue("a", "m")
    d.finish("run", 1.0)  # w2 starts: it stops counting
    assert d.queued("m", app="a") == 1
    d.check_queue("a", "m")


def test_requests_held_back_by_a_share_count_as_waiting():
    d, _ = make(slots=4, share={"a": 0.25}, bound={"a": 1})
    d.arrive(req("run"), 0.0)
    d.arrive(req("held"), 0.0)
    assert d.ticket("held").held_back and d.queued("m", app="a") == 1
    with pytest.raises(fa.OverloadedError):
        d.arrive(req("more"), 0.0)


def test_run_time_averages_finished_requests_and_sets_retry_after():
    d, _ = make(slots=1, bound={"a": 1})
    assert d.model("m").run_time is None
    d.arrive(req("r1"), 0.0)
    d.finish("r1", 2.0)
    assert d.model("m").run_time == 2.0
    d.arrive(req("r2"), 3.0)
    d.cancel("r2", 10.0)  # a cancelled request's run time says nothing
    d.arrive(req("r3"), 10.0)
    d.finish("r3", 17.0)
    assert d.model("m").run_time == pytest.approx(0.8 * 2.0 + 0.2 * 7.0)
    d.arrive(req("r4"), 17.0)
    d.arrive(req("r5"), 17.0)
    with pytest.raises(fa.OverloadedError) as full:
        d.arrive(req("r6"), 17.0)
    assert full.value.retry_after == pytest.approx(3.0)


def test_the_bound_counts_slots_budget_and_pool():
    d, _ = make(slots=4, max_model_len=100)
    assert d.bound() == 2 * 4 * 100  # w_output=2, scale 1, four requests of the longest size
    tight, _ = make(slots=4, budget=150, max_model_len=100)
    assert tight.bound() == 2 * 150
    assert tight.bound(10) == 2 * 40
    pooled, _ = make(slots=4, pool=1, max_model_len=100, models=("m", "n"))
    assert pooled.bound() == 2 * 100


def test_a_policy_with_its_own_unified_cost_learns_each_model():
    policy = fa.policies.HMFS()  # its own empty cost model
    d = Dispatcher(policy, fa.UnifiedTokenCost())
    d.add_model("m", fa.ModelProfile(d_model=4096, n_layers=2), slots=1, token_budget=None, max_model_len=100)
    d.arrive(req("r1"), 0.0)
    assert policy.app_counters() == {"a": 20.0}


# -- an app's share of a model ------------------------------------------------------------------


def test_a_capped_app_holds_at_most_its_share_of_slots_and_the_rest_go_to_others():
    d, _ = make(slots=4, share={"a": 0.5})
    flood = [started(d.arrive(req(f"f{i}", A), 0.0)) for i in range(6)]
    assert sum(flood, []) == ["f0", "f1"]  # ⌊0.5 × 4⌋ = 2 running; the other two slots stay free
    assert d.policy.queued("m") == 0 and d.queued("m") == 4  # held back: the policy has not seen them
    assert started(d.arrive(req("v", B), 0.0)) == ["v"]  # the victim runs at once
    assert started(d.finish("f0", 1.0)) == ["f2"]  # the flood's next, in arrival order
    assert [t.held_back for t in d.tickets() if t.state is TicketState.WAITING] == [True, True, True]


def test_a_capped_app_holds_at_most_its_share_of_the_token_budget():
    d, _ = make(slots=8, budget=100, share={"a": 0.5})
    assert started(d.arrive(req("f0", A, 20, 20), 0.0)) == ["f0"]
    assert started(d.arrive(req("f1", A, 10, 10), 0.0)) == []  # 40 + 20 > 50: held back
    assert started(d.arrive(req("v", B, 25, 25), 0.0)) == ["v"]  # the other half is the victim's
    assert started(d.finish("f0", 1.0)) == ["f1"]


def test_an_app_holding_nothing_may_always_run_one_request():
    d, _ = make(slots=4, budget=100, share={"a": 0.1})  # ⌊0.4⌋ slots, 10 tokens: still one request
    assert started(d.arrive(req("big", A, 40, 40), 0.0)) == ["big"]
    assert started(d.arrive(req("next", A, 1, 1), 0.0)) == []


class _Told(RecordingPolicy):
    """Records which requests the policy was told of, and how."""

    def __init__(self, inner):
        super().__init__(inner)
        self.events = []

    def on_arrival(self, req, now):
        self.events.append(("arrival", req.id))
        super().on_arrival(req, now)

    def on_finish(self, req, outcome, now):
        self.events.append(("finish", req.id))
        super().on_finish(req, outcome, now)


def test_held_back_requests_cancel_and_fail_uncharged_without_the_policy():
    policy = _Told(fa.policies.FCFS())
    cost = fa.UnifiedTokenCost(d_base=64)
    charges = []
    d = Dispatcher(policy, cost, charge=lambda now, r, amount: charges.append(r.id), app_share={"a": 0.25}.get)
    d.add_model("m", PROFILE, slots=4, token_budget=None, max_model_len=1000)
    d.arrive(req("f0", A), 0.0)
    d.arrive(req("f1", A), 0.0)
    d.arrive(req("f2", A), 0.0)
    assert d.cancel("f1", 1.0).ended[0].outcome is fa.Outcome.CANCELLED
    assert [e for e in policy.events if e[1] in ("f1", "f2")] == []  # never shown, never told
    ended = d.model_down("m", fa.EngineError("dead"), 2.0).ended
    assert [t.request.id for t in ended] == ["f2"] and charges == ["f0"]
    assert d.queued() == 0 and len(d.tickets()) == 1


@settings(max_examples=200, deadline=None)
@given(
    slots=st.integers(1, 6),
    share=st.floats(0.05, 1.0),
    events=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 40), st.sampled_from(["arrive", "end"])),
                    max_size=60),
)
def test_no_app_ever_holds_more_than_its_share_and_every_request_is_shown_in_order(slots, share, events):
    d, _ = make(slots=slots, budget=200, share={"a": share, "b": share})
    cap_slots = max(1, int(share * slots))
    shown_order = {}
    n = 0
    for app, size, kind in events:
        running = [t for t in d.tickets() if t.state is TicketState.RUNNING]
        if kind == "end" and running:
            d.finish(running[0].request.id, float(n))
        else:
            n += 1
            d.arrive(req(f"r{n}", fa.Agent("t", fa.App(app)), size, size), float(n))
        for name in ("a", "b"):
            mine = [t for t in d.tickets() if t.request.app == name and t.state is TicketState.RUNNING]
            if len(mine) > 1:  # one request may always run
                assert len(mine) <= cap_slots
                assert sum(t.reserved for t in mine) <= share * 200 + 1e-9
            for t in d.tickets():
                if t.request.app == name and not t.held_back:
                    shown_order.setdefault(name, [])
                    if t.request.id not in shown_order[name]:
                        shown_order[name].append(t.request.id)
    for ids in shown_order.values():  # shown to the policy in arrival order
        assert ids == sorted(ids, key=lambda i: int(i[1:]))
    assert d.queued() == sum(t.state is TicketState.WAITING for t in d.tickets())
    for name in ("a", "b", "c"):  # what the queue bound counts
        assert d.queued("m", app=name) == sum(t.state is TicketState.WAITING and t.request.app == name
                                              for t in d.tickets())


def test_cancelling_a_held_back_request_shows_the_one_behind_it_if_it_fits():
    d, _ = make(slots=4, budget=200, share={"a": 0.5}, policy="fcfs")  # the app: 2 slots, 100 tokens
    assert started(d.arrive(req("r1", A, 30, 30), 0.0)) == ["r1"]
    assert started(d.arrive(req("big", A, 50, 50), 0.0)) == []  # 60 + 100 > 100: held back
    assert started(d.arrive(req("small", A, 15, 15), 0.0)) == []  # behind it, in arrival order
    assert started(d.cancel("big", 1.0)) == ["small"]  # 60 + 30 ≤ 100: it runs now


def test_a_policy_that_refuses_a_held_back_request_fails_that_request_not_the_bystander():
    class Picky(fa.policies.FCFS):
        def on_arrival(self, req, now):
            if req.id == "picky":
                raise RuntimeError("no")
            super().on_arrival(req, now)

    cost = fa.UnifiedTokenCost(d_base=64)
    d = Dispatcher(Picky(), cost, app_share={"a": 0.25}.get)
    d.add_model("m", PROFILE, slots=4, token_budget=None, max_model_len=1000)
    assert started(d.arrive(req("first", A), 0.0)) == ["first"]
    assert started(d.arrive(req("picky", A), 0.0)) == []  # held back: the policy is not asked yet
    changes = d.finish("first", 1.0)  # shows "picky", which the policy refuses
    picky = [t for t in changes.ended if t.request.id == "picky"]
    assert picky and picky[0].outcome is fa.Outcome.FAILED and isinstance(picky[0].error, ProtocolError)
    assert d.tickets() == [] and d.queued() == 0


# -- models whose engine schedules by the policy itself (in-engine) -------------------------


def in_engine(*, kv=1000, slots=4, share=None, bound=None):
    """A dispatcher with one in-engine model ``m``: the engine's scheduler, not the dispatcher, drives the policy."""
    cost = fa.UnifiedTokenCost(d_base=64)
    charges = []
    policy = fa.policies.make_policy("hmfs", cost)
    d = Dispatcher(policy, cost, charge=lambda now, r, amount: charges.append((r.id, amount)),
                   app_share=None if share is None else share.get, queue_bound=None if bound is None else bound.get)
    d.add_model("m", PROFILE, slots=slots, token_budget=500, max_model_len=1000, in_engine=True, kv_tokens=kv)
    return d, policy, charges


def test_an_in_engine_model_is_handed_every_request_at_once_and_the_dispatcher_leaves_the_policy_to_it():
    d, policy, charges = in_engine(slots=2)
    handed = [started(d.arrive(req(f"r{i}"), 0.0)) for i in range(6)]
    assert handed == [[f"r{i}"] for i in range(6)]  # past the batch's 2 sequences: no reservation, no queue here
    assert d.model("m").token_budget is None and d.model("m").running == 6
    assert policy.queued() == policy.running() == 0  # the engine's scheduler tells the policy, not the dispatcher
    assert d.queued("m", app="a") == 6  # waiting in the engine until their first token
    assert d.progress("r0", 2, 1.0) == 4.0
    assert charges == [("r0", 10.0), ("r0", 4.0)]  # its prompt charged as it produced its first token
    assert d.queued("m", app="a") == 5
    d.finish("r0", 2.0)
    d.cancel("r1", 2.0)  # never produced: its prompt is not charged
    assert d.queued("m", app="a") == 4 and d.model("m").running == 4
    assert policy.queued() == policy.running() == 0 and [c for c in charges if c[0] == "r1"] == []


def test_an_in_engine_requests_prompt_found_in_the_prefix_cache_is_charged_at_w_cached_as_in_its_engine():
    d, _, charges = in_engine()
    d.arrive(req("r0"), 0.0)  # a prompt of 10 unified tokens
    d.progress("r0", 1, 1.0, cached=8)  # its engine read 8 of them from the prefix cache
    assert charges == [("r0", pytest.approx(2 + 0.1 * 8)), ("r0", 2.0)]
    d.progress("r0", 1, 1.5, cached=8)  # reported on every event: the prompt is charged once
    assert len(charges) == 3 and d.ticket("r0").charged == pytest.approx(2.8 + 4.0)
    d.arrive(req("r1"), 2.0)
    d.progress("r1", 1, 2.5, cached=10**6)  # an engine's count beyond the prompt is read as the whole prompt
    assert charges[-2] == ("r1", pytest.approx(1.0))


def test_max_queued_answers_overloaded_on_the_in_engine_path():
    d, _, _ = in_engine(bound={"a": 2})
    for i in range(2):
        d.arrive(req(f"r{i}"), 0.0)
    with pytest.raises(fa.OverloadedError, match="2 requests queued"):
        d.arrive(req("r2"), 0.0)
    d.arrive(req("b0", who=B), 0.0)  # another app's bound is its own
    d.progress("r0", 1, 1.0)  # r0 left the engine's queue: a place is free
    assert started(d.arrive(req("r2"), 1.0)) == ["r2"]


def test_an_apps_share_holds_back_what_it_may_not_hand_to_an_in_engine_model():
    d, _, _ = in_engine(slots=4, share={"a": 0.5})
    assert [started(d.arrive(req(f"r{i}"), 0.0)) for i in range(3)] == [["r0"], ["r1"], []]
    assert started(d.arrive(req("b0", who=B), 0.0)) == ["b0"]
    assert started(d.finish("r0", 1.0)) == ["r2"]  # handed as the app's share frees


def test_an_in_engine_request_larger_than_the_engines_kv_cache_is_refused():
    d, _, _ = in_engine(kv=100)
    with pytest.raises(fa.ContextLengthError, match="holds 100 in all"):
        d.arrive(req("big", prompt=60, max_tokens=50), 0.0)
    assert d.tickets() == []


def test_the_bound_of_an_in_engine_model_is_what_its_kv_cache_holds():
    d, _, _ = in_engine(kv=300, slots=8)
    cost = d.cost
    assert d.bound() == fa.service_bound(cost, {"m": 300}, longest={"m": 1000})
