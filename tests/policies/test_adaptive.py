"""H-MAS's meta controller: the rule map, the rollback guard, the bypass, and switching without losing a request."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fairagents as fa
from fairagents.policies.adaptive import Adaptive

POOL = ("fcfs", "edf", "sjf", "two_lane", "wfq")


def make(**kw):
    cost = fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=4096, n_layers=1)})
    return Adaptive(cost, **kw)


def serve(policy, req, start, first, end, tokens=4):
    """Dispatch ``req`` at ``start``, its first token at ``first``, the rest by ``end``."""
    policy.on_dispatch(req, start)
    policy.on_progress(req, 1, first)
    policy.on_progress(req, tokens - 1, end)
    policy.on_finish(req, fa.Outcome.FINISHED, end)


def agent(app, slo=None, weight=1.0):
    return fa.Agent("t", fa.App(app, weight=weight), slo=slo)


def test_deadline_misses_switch_to_edf_and_a_quiet_interval_back_to_sjf():
    policy = make(pool=POOL, interval=10.0, violation=0.1)
    assert policy.active.name == "sjf"
    strict = agent("a", fa.SLO(ttft=0.5))
    for i in range(5):  # two of five miss their 0.5 s TTFT
        req = fa.Request(f"r{i}", strict, "m", 8, 4, float(i))
        policy.on_arrival(req, float(i))
        serve(policy, req, i + 0.1, i + (2.0 if i < 2 else 0.2), i + 2.5)
    policy.on_arrival(fa.Request("late", strict, "m", 8, 4, 11.0), 11.0)
    assert policy.active.name == "edf" and policy.switches[-1].reason == "deadline misses"
    assert policy.select("m", 11.0).id == "late"  # the waiting request moved to the new order


def test_long_requests_with_misses_switch_to_two_lanes_and_unfair_shares_to_wfq():
    policy = make(pool=POOL, interval=10.0, violation=0.1, length_cv=0.5, bypass_violation=1.0)
    who = agent("a", fa.SLO(ttft=0.5))
    for i, tokens in enumerate([2, 2, 2, 200]):
        req = fa.Request(f"r{i}", who, "m", 8, 256, float(i))
        policy.on_arrival(req, float(i))
        serve(policy, req, i + 0.1, i + 1.0, i + 2.0, tokens)
    policy.on_arrival(fa.Request("x", who, "m", 8, 4, 10.5), 10.5)
    assert policy.active.name == "two_lane"

    fair = make(pool=POOL, interval=10.0)
    big, small = agent("big"), agent("small")
    for i in range(6):  # big gets everything, no SLOs are missed
        req = fa.Request(f"b{i}", big, "m", 100, 4, float(i))
        fair.on_arrival(req, float(i))
        serve(fair, req, i + 0.1, i + 0.2, i + 0.3)
    req = fa.Request("s0", small, "m", 1, 1, 1.0)
    fair.on_arrival(req, 1.0)
    serve(fair, req, 1.1, 1.2, 1.2, tokens=1)
    fair.on_arrival(fa.Request("y", small, "m", 8, 4, 10.5), 10.5)
    assert fair.active.name == "wfq" and fair.switches[-1].reason == "unfair shares"


def test_a_switch_that_makes_ttft_worse_is_rolled_back():
    policy = make(pool=POOL, interval=10.0, violation=0.1, rho=1.5, guard=10.0, bypass_violation=1.0)
    who = agent("a", fa.SLO(ttft=1.0))
    for i in range(4):  # interval 1: TTFT 2 s, all miss → edf
        req = fa.Request(f"a{i}", who, "m", 8, 4, float(i))
        policy.on_arrival(req, float(i))
        serve(policy, req, i + 0.1, i + 2.0, i + 2.2)
    for i in range(4):  # interval 2 (under edf): TTFT 6 s, three times worse
        t = 10.0 + 0.5 * i
        req = fa.Request(f"b{i}", who, "m", 8, 4, t)
        policy.on_arrival(req, t)
        serve(policy, req, t + 0.1, t + 6.0, t + 6.2)
    policy.on_arrival(fa.Request("c", who, "m", 8, 4, 20.5), 20.5)
    assert [s.to for s in policy.switches] == ["edf", "sjf"]
    assert policy.switches[-1].reason == "rollback (eq. 12)"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["arrive", "dispatch", "progress", "finish", "cancel", "switch"]),
                          st.sampled_from(POOL), st.integers(1, 50)), max_size=80))
def test_switching_keeps_every_request_exactly_once(steps):
    policy = make(pool=POOL, interval=1e9)  # only the switches the test makes
    apps = [agent("a", fa.SLO(ttft=1.0, tpot=0.1)), agent("b", weight=2.0), agent("c", fa.SLO(e2e=5.0))]
    waiting, running, dispatched, now, n = {}, {}, [], 0.0, 0
    for kind, name, size in steps:
        now += 0.1
        if kind == "arrive":
            n += 1
            req = fa.Request(f"r{n}", apps[n % 3], "m", size, size, now)
            policy.on_arrival(req, now)
            waiting[req.id] = req
        elif kind == "dispatch":
            req = policy.select("m", now)
            assert (req is None) == (not waiting)  # work conservation through every switch
            if req is not None:
                policy.on_dispatch(req, now)
                running[req.id] = waiting.pop(req.id)
                dispatched.append(req.id)
        elif kind == "progress" and running:
            policy.on_progress(next(iter(running.values())), 2, now)
        elif kind == "finish" and running:
            rid = next(iter(running))
            policy.on_finish(running.pop(rid), fa.Outcome.FINISHED, now)
        elif kind == "cancel" and waiting:
            rid = next(iter(waiting))
            policy.on_finish(waiting.pop(rid), fa.Outcome.CANCELLED, now)
        elif kind == "switch":
            policy.switch(name, now)
        assert policy.queued("m") == policy.active.queued("m") == len(waiting)
        assert policy.running() == len(running)
    while (req := policy.select("m", now)) is not None:  # drain: each waiting request exactly once
        policy.on_dispatch(req, now)
        dispatched.append(waiting.pop(req.id).id)
    assert not waiting and len(dispatched) == len(set(dispatched))


def test_an_interval_where_nearly_everything_misses_bypasses_to_fcfs():
    policy = make(pool=POOL, interval=10.0)
    who = agent("a", fa.SLO(ttft=0.5))
    for i in range(5):
        req = fa.Request(f"r{i}", who, "m", 8, 4, float(i))
        policy.on_arrival(req, float(i))
        serve(policy, req, i + 0.1, i + 3.0, i + 3.5)
    policy.on_arrival(fa.Request("x", who, "m", 8, 4, 10.5), 10.5)
    assert policy.active.name == "fcfs" and policy.switches[-1].reason == "emergency bypass"


def test_the_pool_and_parameters_are_checked():
    with pytest.raises(fa.InvalidParameterError, match="unknown policy 'adaptive'"):
        make(pool=("fcfs", "adaptive"))
    with pytest.raises(fa.InvalidParameterError, match="rho"):
        make(rho=1.0)
    with pytest.raises(fa.InvalidParameterError, match="not in the pool"):
        make(pool=("fcfs", "sjf")).switch("edf", 0.0)


def test_a_bypass_with_no_baseline_is_not_rolled_back_while_overloaded():
    policy = make(pool=POOL, interval=1.0, bypass_queue=3)
    who = agent("a", fa.SLO(ttft=0.5))
    for i in range(5):  # a burst: nothing finished in the first interval
        policy.on_arrival(fa.Request(f"r{i}", who, "m", 8, 4, 0.1 * i), 0.1 * i)
    policy.on_arrival(fa.Request("r5", who, "m", 8, 4, 1.0), 1.0)
    assert policy.active.name == "fcfs"
    for i in range(4):
        req = policy.select("m", 1.5)
        serve(policy, req, 1.5, 1.6, 1.7)
    policy.on_arrival(fa.Request("r6", who, "m", 8, 4, 2.05), 2.05)  # guard window: no baseline to exceed
    assert [s.reason for s in policy.switches] == ["emergency bypass"]
