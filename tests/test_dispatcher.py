"""The dispatcher alone: admission by slots, pool slots and token budget; events; never raising into a bystander."""

import pytest

import fairagents as fa
from fairagents.dispatcher import Dispatcher, TicketState
from fairagents.errors import ProtocolError

PROFILE = fa.ModelProfile(d_model=64, n_layers=1)
A, B = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))


def make(policy="hmfs", *, slots=4, budget=None, max_model_len=1000, block=1, pool=None, live=None, models=("m",)):
    cost = fa.UnifiedTokenCost(d_base=64)
    charges = []
    d = Dispatcher(fa.policies.make_policy(policy, cost), cost, pool_slots=pool,
                   charge=lambda now, r, amount: charges.append((r.id, amount)), is_live=live)
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
