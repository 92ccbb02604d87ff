"""H-MAS's meta controller: the rule map, the rollback guard, the bypass, and switching without losing a request."""

import concurrent.futures
import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fairagents as fa
from fairagents.policies.adaptive import SOURCES, Adaptive, Switch

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


def drive(policy, steps, other=None):
    """Play ``steps`` (kind, policy name, size) on ``policy``, checking its queue; each request must run once."""
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
        elif kind == "switch" and name in POOL:
            policy.switch(name, now)
        elif other is not None:
            other(kind, name)
        assert policy.queued("m") == policy.active.queued("m") == len(waiting)
        assert policy.running() == len(running)
    while (req := policy.select("m", now)) is not None:  # drain: each waiting request exactly once
        policy.on_dispatch(req, now)
        dispatched.append(waiting.pop(req.id).id)
    assert not waiting and len(dispatched) == len(set(dispatched))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["arrive", "dispatch", "progress", "finish", "cancel", "switch"]),
                          st.sampled_from(POOL), st.integers(1, 50)), max_size=80))
def test_switching_keeps_every_request_exactly_once(steps):
    drive(make(pool=POOL, interval=1e9), steps)  # only the switches the test makes


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


# -- a model's decision (selector) --------------------------------------------------------------


class Asked:
    """A selector that records the views it is given and answers with ``answer(view)``."""

    def __init__(self, answer):
        self.answer, self.views = answer, []

    def __call__(self, view):
        self.views.append(view)
        return self.answer(view) if callable(self.answer) else self.answer


def quiet(policy, until, who=None, start=0.5):
    """One arrival at ``start``, then one at ``until`` (the first event past a boundary)."""
    who = who or agent("a")
    policy.on_arrival(fa.Request(f"q{start}", who, "m", 4, 4, start), start)
    policy.on_arrival(fa.Request(f"q{until}", who, "m", 4, 4, until), until)


def test_without_a_selector_decisions_are_the_rules_and_make_policy_still_builds_it():
    policy = fa.policies.make_policy("adaptive", fa.UnifiedTokenCost())
    assert isinstance(policy, Adaptive) and policy.selector is None
    policy = make(pool=POOL, initial="fcfs", interval=10.0)
    quiet(policy, 10.5)
    assert [(s.to, s.reason, s.source) for s in policy.switches] == [("sjf", "steady", "rules")]
    assert policy.selector_stats == type(policy.selector_stats)()


def test_a_text_answer_switches_to_the_models_choice_at_the_boundary():
    ask = Asked('{"policy": "wfq", "reason": "shares drift"}')
    policy = make(pool=POOL, interval=10.0, selector=ask)
    quiet(policy, 9.9)
    assert not ask.views and policy.active.name == "sjf"
    policy.on_arrival(fa.Request("x", agent("a"), "m", 4, 4, 10.5), 10.5)
    assert policy.switches == [Switch(10.5, "sjf", "wfq", "shares drift", "model")]
    [view] = ask.views
    assert view["arrivals"] == 2 and view["arrival_rate_per_s"] == round(2 / 10.5, 4) and view["queued"] == 2
    assert view["active"] == "sjf" and view["pool"] == list(POOL) and view["rules"] == {"policy": "sjf",
                                                                                      "reason": "steady"}
    assert {"finished", "violation_rate", "ttft_p99_s", "output_length_mean", "output_length_cv",
            "jain_index"} <= set(view)
    assert json.loads(json.dumps(view)) == view  # JSON-able
    assert policy.queued("m") == policy.active.queued("m") == 3
    assert policy.selector_stats.asked == policy.selector_stats.accepted == 1


def test_the_model_choosing_the_active_policy_switches_nothing():
    policy = make(pool=POOL, interval=10.0, selector=Asked('{"policy": "sjf"}'))
    quiet(policy, 10.5)
    assert policy.switches == [] and policy.selector_stats.accepted == 1


@pytest.mark.parametrize("answer, source", [
    ("EDF please", "fallback: malformed"),
    ('{"policy": "rr"}', "fallback: malformed"),  # registered, but not in the pool
    (None, "fallback: error"),  # neither text nor a future
    (42, "fallback: error"),
])
def test_an_invalid_answer_falls_back_to_the_rules(answer, source):
    policy = make(pool=POOL, initial="fcfs", interval=10.0, selector=Asked(answer))
    quiet(policy, 10.5)
    assert [(s.to, s.reason, s.source) for s in policy.switches] == [("sjf", "steady", source)]


def test_a_selector_that_raises_falls_back_and_the_event_does_not_raise():
    def broken(view):
        raise ValueError("the model is down")

    policy = make(pool=POOL, initial="fcfs", interval=10.0, selector=broken)
    who = agent("a")
    req = fa.Request("r0", who, "m", 4, 4, 0.5)
    policy.on_arrival(req, 0.5)
    serve(policy, policy.select("m", 0.5), 0.5, 0.6, 10.5)  # the tick runs in the finish
    assert [(s.to, s.source) for s in policy.switches] == [("sjf", "fallback: error")]
    assert policy.selector_stats.errors == 1


def test_a_future_is_used_at_the_first_event_after_it_is_done():
    fut = concurrent.futures.Future()
    ask = Asked(fut)
    policy = make(pool=POOL, initial="fcfs", interval=10.0, selector_timeout=5.0, selector=ask)
    quiet(policy, 10.5)
    assert policy.switches == [] and policy.active.name == "fcfs"  # pending: the active policy stays
    policy.on_arrival(fa.Request("a", agent("a"), "m", 4, 4, 12.0), 12.0)
    assert policy.switches == []
    fut.set_result('```json\n{"policy": "edf", "reason": "deadlines"}\n```')
    assert policy.switches == []  # no event yet
    policy.on_arrival(fa.Request("b", agent("a"), "m", 4, 4, 13.0), 13.0)
    assert policy.switches == [Switch(13.0, "fcfs", "edf", "deadlines", "model")]
    assert len(ask.views) == 1 and policy.selector_stats.accepted == 1


def test_a_future_not_done_by_the_deadline_is_cancelled_and_the_rules_apply():
    fut = concurrent.futures.Future()
    policy = make(pool=POOL, initial="fcfs", interval=10.0, selector_timeout=5.0, selector=Asked(fut))
    quiet(policy, 10.5)
    policy.on_arrival(fa.Request("a", agent("a"), "m", 4, 4, 15.4), 15.4)
    assert policy.switches == [] and not fut.cancelled()
    req = policy.select("m", 15.5)
    serve(policy, req, 15.5, 15.55, 15.6)  # the finish at 15.6 ≥ 10.5 + 5 is the first event past it
    assert fut.cancelled()
    assert [(s.at, s.to, s.source) for s in policy.switches] == [(15.6, "sjf", "fallback: late")]
    fut2 = concurrent.futures.Future()
    fut2.set_exception(RuntimeError("boom"))
    policy = make(pool=POOL, initial="fcfs", interval=10.0, selector=Asked(fut2))
    quiet(policy, 10.5)  # a future that failed: the rules
    assert [(s.to, s.source) for s in policy.switches] == [("sjf", "fallback: error")]


def test_one_question_is_pending_at_a_time():
    futures = []

    def answer(view):
        futures.append(concurrent.futures.Future())
        return futures[-1]

    ask = Asked(answer)
    policy = make(pool=POOL, initial="fcfs", interval=1.0, selector_timeout=100.0, selector=ask)
    for i in range(5):  # five boundaries, one question
        policy.on_arrival(fa.Request(f"r{i}", agent("a"), "m", 4, 4, i + 0.5), i + 0.5)
    assert len(ask.views) == 1 and policy.switches == []
    futures[0].set_result('{"policy": "wfq"}')
    policy.on_arrival(fa.Request("x", agent("a"), "m", 4, 4, 4.7), 4.7)  # applied, not a boundary
    assert len(ask.views) == 1 and [s.to for s in policy.switches] == ["wfq"]
    policy.on_arrival(fa.Request("y", agent("a"), "m", 4, 4, 5.1), 5.1)  # the next boundary asks again
    assert len(ask.views) == 2


def test_a_late_answer_falls_back_to_the_latest_rules_choice():
    fut = concurrent.futures.Future()
    policy = make(pool=POOL, initial="fcfs", interval=10.0, violation=0.1, bypass_violation=1.0,
                  selector_timeout=15.0, selector=Asked(fut))
    strict = agent("a", fa.SLO(ttft=0.5))
    quiet(policy, 10.5, strict)  # quiet: the rules would say sjf; the question is pending
    for i in range(4):  # then deadline misses: the rules say edf at the next boundary
        req = fa.Request(f"s{i}", strict, "m", 4, 4, 11.0 + i)
        policy.on_arrival(req, 11.0 + i)
        serve(policy, req, 11.0 + i, 13.0 + i, 13.5 + i)
    policy.on_arrival(fa.Request("z", strict, "m", 4, 4, 20.5), 20.5)
    assert policy.switches == []
    policy.on_arrival(fa.Request("w", strict, "m", 4, 4, 26.0), 26.0)  # past 10.5 + 15, before a boundary
    assert fut.cancelled() and [(s.to, s.reason, s.source) for s in policy.switches] == [
        ("edf", "deadline misses", "fallback: late")]


def test_the_bypass_is_the_rules_alone_and_drops_a_pending_question():
    ask = Asked('{"policy": "sjf"}')
    policy = make(pool=POOL, initial="sjf", interval=1.0, bypass_queue=1, selector=ask)
    policy.on_arrival(fa.Request("a", agent("a"), "m", 4, 4, 0.2), 0.2)
    quiet(policy, 1.5)  # two waiting at the boundary: bypass, the selector is not asked
    assert not ask.views and policy.selector_stats.asked == 0
    assert [(s.to, s.reason, s.source) for s in policy.switches] == [("fcfs", "emergency bypass", "bypass")]

    fut = concurrent.futures.Future()
    policy = make(pool=POOL, initial="sjf", interval=1.0, bypass_queue=2, selector_timeout=100.0,
                  selector=Asked(fut))
    quiet(policy, 1.5)  # two waiting: asked, pending
    for t in (2.1, 2.2):
        policy.on_arrival(fa.Request(f"b{t}", agent("a"), "m", 4, 4, t), t)
    policy.on_arrival(fa.Request("c", agent("a"), "m", 4, 4, 3.0), 3.0)  # four waiting: bypass
    assert fut.cancelled() and policy.selector_stats.dropped == 1
    assert [(s.to, s.source) for s in policy.switches] == [("fcfs", "bypass")]
    policy.on_arrival(fa.Request("d", agent("a"), "m", 4, 4, 3.5), 3.5)  # nothing pending any more
    assert [s.to for s in policy.switches] == ["fcfs"] and policy._pending is None


def test_a_bad_model_decision_is_rolled_back():
    ask = Asked('{"policy": "wfq", "reason": "my hunch"}')
    policy = make(pool=POOL, interval=10.0, violation=0.1, rho=1.5, guard=10.0, bypass_violation=1.0, selector=ask)
    who = agent("a", fa.SLO(ttft=1.0))
    for i in range(4):  # interval 1: TTFT 2 s; the model picks wfq
        req = fa.Request(f"a{i}", who, "m", 8, 4, float(i))
        policy.on_arrival(req, float(i))
        serve(policy, req, i + 0.1, i + 2.0, i + 2.2)
    for i in range(4):  # interval 2 (under wfq): TTFT 6 s, three times worse
        t = 10.0 + 0.5 * i
        req = fa.Request(f"b{i}", who, "m", 8, 4, t)
        policy.on_arrival(req, t)
        serve(policy, req, t + 0.1, t + 6.0, t + 6.2)
    policy.on_arrival(fa.Request("c", who, "m", 8, 4, 20.5), 20.5)
    assert [(s.to, s.source) for s in policy.switches] == [("wfq", "model"), ("sjf", "rollback")]
    assert ask.views[0]["rules"] == {"policy": "edf", "reason": "deadline misses"}
    assert len(ask.views) == 1  # the rollback decides that boundary; nothing is asked


def test_the_selector_parameters_are_checked():
    with pytest.raises(fa.InvalidParameterError, match="selector must be callable"):
        make(selector="edf")
    with pytest.raises(fa.InvalidParameterError, match="selector_timeout"):
        make(selector=Asked("x"), selector_timeout=-1.0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["arrive", "dispatch", "progress", "finish", "cancel", "answer", "switch"]),
                          st.sampled_from([*POOL, "junk"]), st.integers(1, 50)), max_size=80),
       st.booleans())
def test_a_models_switches_keep_every_request_exactly_once(steps, immediate):
    futures, texts = [], itertools.cycle([*(f'{{"policy": "{p}"}}' for p in POOL), "junk"])

    def answer(view):  # a text at once, or a future the steps answer
        if immediate:
            return next(texts)
        futures.append(concurrent.futures.Future())
        return futures[-1]

    def answer_now(kind, name):
        if kind == "answer" and futures and not futures[-1].done():
            futures[-1].set_result(f'{{"policy": "{name}"}}')

    policy = make(pool=POOL, interval=0.35, selector_timeout=0.5, selector=answer)
    drive(policy, steps, answer_now)
    stats = policy.selector_stats
    pending = 1 if policy._pending is not None else 0
    assert stats.asked == stats.accepted + stats.malformed + stats.late + stats.errors + stats.dropped + pending
    assert all(s.source in SOURCES for s in policy.switches)
