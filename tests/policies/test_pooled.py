"""The pool's policy seat: what engines tell the policy, once each; what they held, forgotten with them."""

import threading

import pytest

import fairagents as fa
from fairagents.policies.pooled import EngineTally, PoolPolicy

PROFILE = fa.ModelProfile(d_model=4096, n_layers=1)
A, B = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b", weight=2.0))


def seat(policy="hmfs"):
    cost = fa.UnifiedTokenCost()
    pool = PoolPolicy(fa.policies.make_policy(policy, cost), cost)
    pool.register("m", PROFILE)
    return pool


def req(rid, who=A, prompt=10, model="m"):
    return fa.Request(rid, who, model, prompt, 8, arrival=0.0)


def test_the_arbiters_request_is_the_one_the_engine_takes_once():
    pool = seat()
    r = req("r1")
    pool.expect(r)
    assert pool.expected("m", "r1") is r and pool.expected("m", "r1") is None
    pool.expect(req("r2"))
    pool.unexpect("m", "r2")  # it failed before its engine took it
    assert pool.expected("m", "r2") is None


def test_an_engine_that_stops_takes_its_requests_out_of_the_policy():
    pool = seat()
    for rid in ("w", "r"):
        pool.engine_arrive(req(rid))
    pool.engine_dispatch("m", "r")
    pool.expect(req("later"))
    assert pool.held("m") == 2 and pool.policy.queued() == 1 and pool.policy.running() == 1
    assert pool.forget("m") == 2
    assert pool.held() == 0 and pool.policy.queued() == pool.policy.running() == 0
    assert pool.expected("m", "later") is None
    pool.engine_end("m", "r", fa.Outcome.FINISHED)  # a late end from the stopped engine: nothing


def test_a_preempted_request_is_never_charged_its_prompt_again():
    pool = seat()
    pool.engine_arrive(req("r1", prompt=100))
    assert pool.engine_dispatch("m", "r1") and pool.charged == {"a": 100.0}
    twin = pool.engine_arrive(req("r1", prompt=100))  # preempted: back in the queue
    assert twin.prompt_tokens == 0 and pool.policy.queued() == 1 and pool.policy.running() == 0
    assert pool.engine_dispatch("m", "r1") and pool.charged == {"a": 100.0}
    assert not pool.engine_dispatch("m", "r1")  # already running: nothing happens
    pool.engine_progress("m", [("r1", 4)])
    assert pool.charged == {"a": 108.0} and pool.tally("m").prefilled == 100


def test_without_counters_of_its_own_the_policy_is_ranked_by_the_service_charged_over_weights():
    pool = seat("fcfs")
    assert not pool.orders_by_service
    for rid, who in (("x", A), ("y", B)):
        pool.engine_arrive(req(rid, who, prompt=20))
        pool.engine_dispatch("m", rid)
    assert pool.served(A) == (20.0, 20.0) and pool.served(B) == (10.0, 20.0)
    counted = seat("hmfs")
    assert counted.orders_by_service and counted.served(A) == (0.0, 0.0)


def test_a_request_the_policy_holds_but_no_engine_serves_is_discarded():
    pool = seat()
    stray = req("stray")
    pool.policy.on_arrival(stray, 0.0)
    pool.discard(stray)
    assert pool.policy.queued() == 0


def test_the_recompute_tax_is_recomputed_over_all_prefilled_tokens():
    assert EngineTally().recompute_tax == 0.0
    assert EngineTally(prefilled=300, recomputed=100).recompute_tax == pytest.approx(0.25)


def test_engine_threads_and_the_arbiter_share_one_lock():
    pool = seat()
    errors = []

    def engine(prefix):
        try:
            for i in range(500):
                rid = f"{prefix}{i}"
                pool.engine_arrive(req(rid, prompt=1))
                pool.engine_dispatch("m", rid)
                pool.engine_progress("m", [(rid, 1)])
                pool.engine_end("m", rid, fa.Outcome.FINISHED)
        except Exception as err:  # surfaced below
            errors.append(err)

    def arbiter():
        for _ in range(500):
            with pool.lock:
                pool.policy.app_counters()

    threads = [threading.Thread(target=engine, args=(p,)) for p in "xy"] + [threading.Thread(target=arbiter)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and pool.charged == {"a": 1000 * 3.0} and pool.held() == 0


@pytest.mark.parametrize("policy", ["hmfs", "vtc"])
def test_a_step_charged_once_per_client_charges_what_each_request_would(policy):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    agents = [A, B, fa.Agent("u", fa.App("a")), fa.Agent("t", fa.App("b", weight=3.0))]  # b at two weights

    @settings(max_examples=30, deadline=None)
    @given(st.lists(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 4)), max_size=12), min_size=1, max_size=5))
    def check(steps):
        cost = fa.UnifiedTokenCost()
        per_request = fa.policies.make_policy(policy, cost)
        per_request.charges_by_client = False  # charged request by request, as any other policy is
        pools = [seat(policy), PoolPolicy(per_request, cost)]
        pools[1].register("m", PROFILE)
        assert pools[0]._by_client and not pools[1]._by_client
        for pool in pools:
            for i in range(8):
                pool.engine_arrive(req(f"r{i}", agents[i % 4]))
                pool.engine_dispatch("m", f"r{i}")
            pool.engine_end("m", "r7", fa.Outcome.FINISHED)  # its late tokens are not charged
        for outputs in steps:
            for pool in pools:
                pool.engine_progress("m", [(f"r{i}", n) for i, n in outputs])
        grouped, single = pools
        assert grouped.charged == pytest.approx(single.charged) and grouped.service == pytest.approx(single.service)
        for who in agents:
            assert grouped.served(who) == pytest.approx(single.served(who))

    check()


def test_leads_over_many_clients_are_each_clients_lead():
    pool = seat()
    others = [A, B, fa.Agent("u", fa.App("a")), fa.Agent("x", fa.App("c"))]
    for i, who in enumerate(others):
        pool.engine_arrive(req(f"r{i}", who))
        pool.engine_dispatch("m", f"r{i}")
        pool.engine_progress("m", [(f"r{i}", 3 * i)])
    for head in others:
        assert pool.leads(head, others) == [pool.lead(head, other) for other in others]
