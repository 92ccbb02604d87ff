"""ExFairS: worked examples of Algorithms 1 and 2 and of eqs. 1–6, and no starvation on random workloads."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fairagents as fa
from fairagents.engines import SimEngine
from fairagents.policies.exfairs import (
    EXCHANGE_RULES,
    ExFairS,
    credit_exchange,
    exchange_alg1,
    exchange_code,
    exchange_eq6,
    insert_position,
)
from fairagents.simulation import SimRequest, Workload, simulate

# -- Algorithm 2: proportional priority insertion ------------------------------------


@pytest.mark.parametrize(
    ("queue_length", "cache", "priority", "multiplier", "max_forward", "expected"),
    [
        # Empty cache (lines 1-2): the tail.
        (0, {}, 5, 2, 50, 0),
        # Queue of 10: six of priority 0, four of priority 2.
        #   p=-1: N_h=0, N_total=3, r=0, N_o=10, P_b=10, P_f=min(20, 50, 10, 10)=10 -> the head.
        (10, {0: 6, 2: 4}, -1, 2, 50, 0),
        #   p=0 (present): N_h=0, N_total=2, r=0, N_o=4, P_b=4, P_f=min(8, 50, 4, 10)=4 -> 6.
        (10, {0: 6, 2: 4}, 0, 2, 50, 6),
        #   p=1 (new, between): N_h=1, N_total=3, r=1/3, N_o=4, P_b=⌊8/3⌋=2, P_f=min(4, 50, 4, 10)=4 -> 6.
        (10, {0: 6, 2: 4}, 1, 2, 50, 6),
        #   ... with M=1: P_f=min(2, 50, 4, 10)=2 -> 8.
        (10, {0: 6, 2: 4}, 1, 1, 50, 8),
        #   p=2 and p=3: nothing of lower priority queued (N_o=0, line 14) -> the tail.
        (10, {0: 6, 2: 4}, 2, 2, 50, 10),
        (10, {0: 6, 2: 4}, 3, 2, 50, 10),
        # {0:2, 1:3, 3:5}, p=2: N_h=2, N_total=4, r=1/2, N_o=5, P_b=⌊2.5⌋=2, P_f=min(4, 50, 5, 10)=4 -> 6.
        (10, {0: 2, 1: 3, 3: 5}, 2, 2, 50, 6),
        # P_max binds: 200 of priority 0, p=-5: P_b=200, P_f=min(400, 50, 200, 200)=50 -> 150.
        (200, {0: 200}, -5, 2, 50, 150),
        # ... and P_max = 3.
        (200, {0: 200}, -5, 2, 3, 197),
        # {0:1, 1:1, 2:3}, p=1: N_h=1, N_total=3, N_o=3, ⌊3·(1 − 1/3)⌋ = 2 exactly, P_f=min(4, 50, 3, 5)=3 -> 2.
        (5, {0: 1, 1: 1, 2: 3}, 1, 2, 50, 2),
        # ⌊N_o·A⌋ = 0: {0:3, 1:1, 2:1, 3:1}, p=2: N_h=2, N_total=4, N_o=1, ⌊1·0.5⌋=0 -> the tail.
        (6, {0: 3, 1: 1, 2: 1, 3: 1}, 2, 2, 50, 6),
        # Zero counts in the cache are not queued priorities.
        (3, {0: 0, 4: 3}, 1, 2, 50, 0),
    ],
)
def test_alg2_insert_positions(queue_length, cache, priority, multiplier, max_forward, expected):
    assert insert_position(queue_length, cache, priority, multiplier=multiplier, max_forward=max_forward) == expected


def _arrive(policy, who, rid, now, prompt=10, model="m"):
    r = fa.Request(id=rid, agent=who, model=model, prompt_tokens=prompt, max_tokens=8, arrival=now)
    policy.on_arrival(r, now)
    return r


def test_alg2_on_the_policy_queue_and_cache():
    """Resources set by hand; the queue and its priority cache as Algorithm 2 builds them."""
    p = ExFairS(period=1e9)
    who = {name: fa.Agent("t", fa.App(name)) for name in "abcd"}
    p._resource.update({"a": 0, "b": -2, "c": 1, "d": 5})  # priorities 0, 2, -1, -5
    for i in range(6):
        _arrive(p, who["a"], f"a{i}", 0.0)
    for i in range(4):
        _arrive(p, who["b"], f"b{i}", 0.0)  # priority 2: nothing lower queued, the tail each time
    assert [r.id for r in p.queue("m")] == ["a0", "a1", "a2", "a3", "a4", "a5", "b0", "b1", "b2", "b3"]
    # c (p=-1) as in the first worked example: past all ten.
    _arrive(p, who["c"], "c0", 0.0)
    assert p.queue("m")[0].id == "c0"
    # a (p=0): cache {0:6, 2:4, -1:1}: N_h=1, N_total=3, N_o=4, ⌊4·2/3⌋=2, P_f=min(4, 50, 4, 11)=4 -> 7.
    _arrive(p, who["a"], "a6", 0.0)
    assert [r.id for r in p.queue("m")].index("a6") == 7
    # Dispatching the head takes its priority out of the cache: c0 (p=-1) gone, d (p=-5) next.
    p.on_dispatch(p.select("m", 0.0), 0.0)
    assert p._caches["m"] == {0: 7, 2: 4}
    _arrive(p, who["d"], "d0", 0.0)
    assert p.queue("m")[0].id == "d0"  # N_o = 11, P_f = min(22, 50, 11, 11) = 11


def test_equal_priorities_are_served_in_arrival_order(req):
    p = ExFairS()
    agents = [fa.Agent("t", fa.App(n)) for n in "xyz"]
    rs = [req(agents[i % 3]) for i in range(9)]
    for r in rs:
        p.on_arrival(r, 0.0)
    out = []
    while (r := p.select("m", 0.0)) is not None:
        p.on_dispatch(r, 0.0)
        out.append(r)
    assert out == rs


# -- the exchange value R: eq. 6, Algorithm 1, the authors' code ----------------------


@pytest.mark.parametrize(
    ("gap", "eq6", "alg1", "code"),
    [
        (0.1, 0, 1, 1),  # at β: eq. 6 trades nothing; round(0.5) is 1 (half up)
        (0.15, 0, 1, 1),
        (0.2, 1, 1, 2),
        (0.3, 1, 2, 3),
        (0.5, 2, 3, 5),
        (0.7, 3, 4, 5),  # the code caps Δ at 0.5
        (1.0, 5, 5, 5),
    ],
)
def test_exchange_value_R(gap, eq6, alg1, code):
    assert (exchange_eq6(gap), exchange_alg1(gap), exchange_code(gap)) == (eq6, alg1, code)
    assert EXCHANGE_RULES["eq6"] is exchange_eq6


def test_R_is_robust_to_floating_point_gaps():
    assert 0.7 - 0.5 < 0.2  # 0.19999999999999996
    assert exchange_eq6(0.7 - 0.5) == exchange_alg1(0.7 - 0.5) == 1
    assert exchange_code(0.7 - 0.5) == 2
    assert credit_exchange({"a": 0.35, "b": 0.25}, {}) == [("a", "b", 0)]  # 0.09999999999999998 reaches β = 0.1


# -- Algorithm 1: who trades -----------------------------------------------------------


def test_alg1_pairs_from_both_ends_while_the_gap_is_at_least_beta():
    safi = {"a": 0.7, "b": 0.6, "c": 0.3, "d": 0.0}
    assert credit_exchange(safi, {}) == [("a", "d", 3), ("b", "c", 1)]
    assert credit_exchange(safi, {}, amount=exchange_alg1) == [("a", "d", 4), ("b", "c", 2)]
    assert credit_exchange(safi, {}, pairs="extremes") == [("a", "d", 3)]
    # The loop stops at the first pair below β (line 17), even if a later one would trade.
    assert credit_exchange({"a": 0.9, "b": 0.5, "c": 0.45, "d": 0.1}, {}) == [("a", "d", 4)]
    # Exactly β trades (line 7, ≥), with R = 0 under eq. 6.
    assert credit_exchange({"a": 0.35, "b": 0.25}, {}) == [("a", "b", 0)]
    assert credit_exchange({"a": 0.35, "b": 0.26}, {}) == []
    # An odd client out, and a lone client.
    assert credit_exchange({"a": 1.0, "b": 0.5, "c": 0.0}, {}) == [("a", "c", 5)]
    assert credit_exchange({"a": 1.0}, {}) == []


def test_alg1_orders_equal_safi_by_credit_descending():
    safi = {"x": 0.5, "y": 0.5, "z": 0.5, "w": 0.1}
    credit = {"x": -2, "y": 3, "z": 0}
    assert credit_exchange(safi, credit) == [("y", "w", 2)]  # y, z, x, w: y has the most credit
    assert credit_exchange(safi, credit, beta=0.0) == [("y", "w", 2), ("z", "x", 0)]


# -- eqs. 1-4 and the period on the policy ------------------------------------------------


def _serve(policy, who, rid, arrival, *, prompt, output, ttft, end, outcome=fa.Outcome.FINISHED):
    r = fa.Request(id=rid, agent=who, model="m", prompt_tokens=prompt, max_tokens=max(output, 1), arrival=arrival)
    policy.on_arrival(r, arrival)
    policy.on_dispatch(r, arrival)
    if output:
        policy.on_progress(r, 1, arrival + ttft)
        if output > 1:
            policy.on_progress(r, output - 1, end)
    else:
        policy.on_progress(r, 0, end)
    policy.on_finish(r, outcome, end)
    return r


def test_safi_eq4_over_a_period_and_the_exchange_it_triggers():
    p = ExFairS(period=10.0)
    slo = fa.SLO(e2e=2.0)
    a, b, c = (fa.Agent("t", fa.App(n, slo=s)) for n, s in (("A", slo), ("B", slo), ("C", None)))
    # A: two requests, one late -> SLO_A = 1/2; service 2·(10 + 2·5) = 40.
    _serve(p, a, "a1", 0.0, prompt=10, output=5, ttft=0.1, end=1.0)
    _serve(p, a, "a2", 0.0, prompt=10, output=5, ttft=0.1, end=5.0)
    # B: one request on time -> SLO_B = 0; service 30 + 2·10 = 50.
    _serve(p, b, "b1", 0.0, prompt=30, output=10, ttft=0.1, end=1.0)
    # C: no SLO (not counted); service 100, the most.
    _serve(p, c, "c1", 0.0, prompt=100, output=0, ttft=0.0, end=1.0)
    assert p.safi() == {}  # the period has not ended
    _arrive(p, c, "c2", 10.0)  # the first event at or after t = 10 closes it
    # Usage: A 40/100, B 50/100, C 1. SAFI = 0.7·SLO + 0.3·Usage.
    assert p.safi() == pytest.approx({"A": 0.7 * 0.5 + 0.3 * 0.4, "B": 0.3 * 0.5, "C": 0.3})
    assert list(p.safi()) == ["A", "C", "B"]  # worst first
    # A (0.47) and B (0.15): Δ = 0.32, R = ⌊1.6⌋ = 1; C is left alone in the middle.
    assert p.exchanges() == [("A", "B", 1)]
    assert p.resources() == {"A": 1, "B": -1} and p.credits() == {"A": -1, "B": 1}
    assert (p.priority("A"), p.priority("B"), p.priority("C")) == (-1, 1, 0)


def test_the_period_runs_lazily_from_events_and_never_from_select():
    p = ExFairS(period=10.0)
    late, fine = fa.Agent("t", fa.App("late", slo=fa.SLO(e2e=1.0))), fa.Agent("t", fa.App("fine"))
    _serve(p, late, "l1", 5.0, prompt=10, output=2, ttft=0.1, end=8.0)  # the period starts at 5.0, ends at 15.0
    _serve(p, fine, "f1", 5.0, prompt=10, output=2, ttft=0.1, end=8.0)
    r = _arrive(p, fine, "f2", 14.9)
    assert p.safi() == {}
    assert p.select("m", 100.0) is r and p.safi() == {}  # select changes nothing
    p.on_dispatch(r, 15.0)  # 15.0 closes [5, 15)
    assert p.exchanges() == [("late", "fine", 3)]  # SAFI 1.0 vs 0.3
    # A stretch of idle periods closes as one: the next event, at 47, closes [15, 25) and skips to [45, 55).
    p.on_progress(r, 1, 47.0)
    assert p.exchanges() == []  # only "fine" was active in [15, 25)
    assert p._period_end == 55.0
    p.on_finish(r, fa.Outcome.FINISHED, 54.0)
    assert not p._live  # per-request bookkeeping is dropped at the finish


def test_ttft_and_tpot_count_where_declared():
    p = ExFairS(period=10.0)
    ttft = fa.Agent("t", fa.App("ttft", slo=fa.SLO(ttft=0.5, e2e=100.0)))
    tpot = fa.Agent("t", fa.App("tpot", slo=fa.SLO(tpot=0.1)))
    ok = fa.Agent("t", fa.App("ok", slo=fa.SLO(ttft=0.5, tpot=0.1, e2e=100.0)))
    _serve(p, ttft, "x", 0.0, prompt=10, output=2, ttft=1.0, end=1.05)  # first token late
    _serve(p, tpot, "y", 0.0, prompt=10, output=11, ttft=0.1, end=2.1)  # 0.2 s per token after the first
    _serve(p, ok, "z", 0.0, prompt=10, output=11, ttft=0.1, end=1.0)
    _arrive(p, ok, "z2", 10.0)
    safi = p.safi()
    usage = 0.3 * (10 + 2 * 2) / (10 + 2 * 11)
    assert safi == pytest.approx({"ttft": 0.7 + usage, "tpot": 1.0, "ok": 0.3})


def test_failed_counts_as_a_violation_cancelled_and_slo_less_do_not():
    p = ExFairS(period=10.0)
    slo = fa.SLO(e2e=5.0)
    failed, cancelled = fa.Agent("t", fa.App("failed", slo=slo)), fa.Agent("t", fa.App("cancelled", slo=slo))
    _serve(p, failed, "f", 0.0, prompt=10, output=1, ttft=0.1, end=0.5, outcome=fa.Outcome.FAILED)
    r = _arrive(p, cancelled, "c", 0.0)
    p.on_finish(r, fa.Outcome.CANCELLED, 1.0)  # cancelled while waiting: no service, not judged
    _arrive(p, failed, "g", 10.0)
    assert p.safi() == pytest.approx({"failed": 1.0})  # nothing judged or served: "cancelled" was not active
    no_slo = fa.Agent("t", fa.App("no-slo"))
    _serve(p, no_slo, "n", 10.0, prompt=10, output=1, ttft=0.1, end=19.0)  # 9 s, but no SLO to miss
    _arrive(p, no_slo, "n2", 20.0)
    # "g" has waited 10 s, past its 5 s: overdue. "no-slo" had nothing judged: SLO 0, the most service.
    assert p.safi() == pytest.approx({"failed": 0.7, "no-slo": 0.3})


def test_a_request_stuck_past_its_deadline_counts_once_at_the_period_end():
    slo = fa.SLO(e2e=3.0)
    for count_overdue, first in ((True, 0.7), (False, 0.0)):
        p = ExFairS(period=10.0, count_overdue=count_overdue)
        stuck = fa.Agent("t", fa.App("stuck", slo=slo))
        s = _arrive(p, stuck, "s", 0.0)  # waits the whole period
        _arrive(p, stuck, "s2", 10.0)  # closes [0, 10): "s" is 10 s old, past its 3 s
        assert p.safi() == pytest.approx({"stuck": first})  # no service: Usage 0
        p.on_dispatch(p.select("m", 10.0), 10.0)
        p.on_progress(s, 1, 11.0)
        p.on_finish(s, fa.Outcome.FINISHED, 11.0)  # late: counted here only if not counted already
        _arrive(p, stuck, "s3", 20.0)  # closes [10, 20)
        judged = p._judged, p._violated  # reset for the new period
        assert judged == ({}, {})
        # With count_overdue: "s2" (waiting, overdue) is this period's one violation; without: "s" is.
        assert p.safi() == pytest.approx({"stuck": 1.0})


def test_overdue_is_judged_once_whatever_follows():
    p = ExFairS(period=10.0)
    stuck, fine = fa.Agent("t", fa.App("stuck", slo=fa.SLO(e2e=3.0))), fa.Agent("t", fa.App("fine"))
    s = _arrive(p, stuck, "s", 0.0)
    _arrive(p, fine, "f", 10.0)  # closes [0, 10): "s" overdue
    p.on_dispatch(s, 10.0)
    p.on_progress(s, 1, 11.0)
    p.on_finish(s, fa.Outcome.FINISHED, 11.0)
    _serve(p, stuck, "ok", 12.0, prompt=10, output=1, ttft=0.1, end=12.5)  # on time
    _arrive(p, fine, "f2", 20.0)  # closes [10, 20): "s" is not judged again, "ok" met its SLO
    assert p.safi()["stuck"] == pytest.approx(0.3)  # SLO 0/1, and the most service


def test_clients_are_agents_when_asked():
    p = ExFairS(client="agent", period=10.0)
    app = fa.App("studio", slo=fa.SLO(e2e=1.0))
    slow, quick = fa.Agent("slow", app), fa.Agent("quick", app)
    _serve(p, slow, "s", 0.0, prompt=10, output=5, ttft=0.1, end=4.0)
    _serve(p, quick, "q", 0.0, prompt=10, output=5, ttft=0.1, end=0.5)
    _arrive(p, quick, "q2", 10.0)
    assert p.safi() == pytest.approx({("studio", "slow"): 1.0, ("studio", "quick"): 0.3})
    assert p.exchanges() == [(("studio", "slow"), ("studio", "quick"), 3)]


def test_unified_tokens_when_given_a_unified_cost(unit_cost):
    p = ExFairS(unit_cost, period=10.0)
    big, small = fa.Agent("t", fa.App("big")), fa.Agent("t", fa.App("small"))
    r1 = fa.Request(id="b", agent=big, model="big", prompt_tokens=10, max_tokens=1, arrival=0.0)
    r2 = fa.Request(id="s", agent=small, model="m", prompt_tokens=10, max_tokens=1, arrival=0.0)
    for r in (r1, r2):
        p.on_arrival(r, 0.0)
        p.on_dispatch(r, 0.0)
    assert p._served == {"big": 40.0, "small": 10.0}  # 'big' has scale 4


def test_select_among_takes_the_earliest_head(req):
    p = ExFairS()
    who = fa.Agent("t", fa.App("a"))
    late, early = req(who, model="m", arrival=2.0), req(who, model="n", arrival=1.0)
    p.on_arrival(late, 2.0)
    p.on_arrival(early, 2.0)
    assert p.select_among(["m", "n"], 2.0) is early
    assert p.select("m", 2.0) is late and p.select("zzz", 2.0) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"client": "team"},
        {"alpha": 1.5},
        {"beta": -0.1},
        {"multiplier": 1.5},
        {"max_forward": -1},
        {"period": 0.0},
        {"exchange": "nope"},
        {"exchange": 3},
        {"pairs": "some"},
    ],
)
def test_rejects_bad_parameters(kwargs):
    with pytest.raises(fa.InvalidParameterError):
        ExFairS(**kwargs)


def test_custom_exchange_function():
    p = ExFairS(period=1.0, exchange=lambda gap: 7)
    a, b = fa.Agent("t", fa.App("a", slo=fa.SLO(e2e=0.1))), fa.Agent("t", fa.App("b"))
    _serve(p, a, "a", 0.0, prompt=1, output=1, ttft=0.5, end=0.5)
    _serve(p, b, "b", 0.0, prompt=1, output=1, ttft=0.5, end=0.5)
    _arrive(p, b, "b2", 1.0)
    assert p.resources() == {"a": 7, "b": -7}


# -- no starvation (Theorem 2), on random workloads -------------------------------------------


@st.composite
def event_runs(draw):
    """A policy of random parameters, 2-4 apps with random SLOs on 1-2 models, and a random event sequence."""
    policy = ExFairS(
        period=draw(st.sampled_from([0.2, 0.5, 1.0])),
        multiplier=draw(st.integers(1, 3)),
        max_forward=draw(st.sampled_from([1, 2, 3, 50])),
        exchange=draw(st.sampled_from(sorted(EXCHANGE_RULES))),
        pairs=draw(st.sampled_from(["all", "extremes"])),
        client=draw(st.sampled_from(["app", "agent"])),
        beta=draw(st.sampled_from([0.0, 0.1])),
    )
    agents = []
    for i in range(draw(st.integers(2, 4))):
        slo = draw(st.sampled_from([None, fa.SLO(e2e=0.3), fa.SLO(e2e=3.0), fa.SLO(ttft=0.1, e2e=2.0)]))
        app = fa.App(f"app{i}", slo=slo)
        agents += [fa.Agent(f"agent{j}", app) for j in range(draw(st.integers(1, 2)))]
    if draw(st.booleans()):  # start from resources already traded, as after earlier periods
        for who in agents:
            policy._resource[who.app.name if policy.client == "app" else who.key] = draw(st.integers(-6, 6))
    models = ["m", "n"][: draw(st.integers(1, 2))]
    ops = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["arrive"] * 4 + ["dispatch"] * 2 + ["progress", "finish", "cancel"]),
                st.integers(0, 1000),
                st.floats(0.0, 0.3),
                st.integers(0, 3),
            ),
            min_size=30,
            max_size=150,
        )
    )
    return policy, agents, models, ops


def _check_queues(policy, models, now):
    for model in models:
        queue = policy.queue(model)
        assert policy.queued(model) == len(queue)
        assert policy.select(model, now) is (queue[0] if queue else None)  # work conserving, head first
        assert policy.queue(model) == queue  # select changed nothing


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_runs())
def test_no_starvation_on_random_event_sequences(run):
    """Theorem 2, made precise: a waiting request is passed only by a request arriving later, only while
    fewer than P_max requests wait behind it; otherwise the queue is served in order, so once arrivals
    stop every request leaves within as many dispatches as there are requests ahead of it."""
    policy, agents, models, ops = run
    now, ids, priority = 0.0, 0, {}
    for kind, pick, dt, n in ops:
        now += dt
        _check_queues(policy, models, now)
        model = models[pick % len(models)]
        before = policy.queue(model)
        if kind == "arrive":
            who = agents[pick % len(agents)]
            r = fa.Request(id=f"r{ids}", agent=who, model=model, prompt_tokens=1 + pick % 50, max_tokens=4, arrival=now)
            ids += 1
            cache = {}
            for q in before:
                cache[priority[q.id]] = cache.get(priority[q.id], 0) + 1
            policy.on_arrival(r, now)
            client = who.app.name if policy.client == "app" else who.key
            priority[r.id] = policy.priority(client)  # the period, if it ended, closed inside on_arrival
            after = policy.queue(model)
            at = after.index(r)
            assert after[:at] + after[at + 1 :] == before  # nobody else moved
            assert at == insert_position(
                len(before), cache, priority[r.id], multiplier=policy.multiplier, max_forward=policy.max_forward
            )  # Algorithm 2
            for i in range(at, len(before)):  # every request it passed had fewer than P_max behind it
                assert len(before) - 1 - i < policy.max_forward
        elif kind == "dispatch" and before:
            policy.on_dispatch(policy.select(model, now), now)
            assert policy.queue(model) == before[1:]
        elif kind in ("progress", "finish") and policy._running:
            r = sorted(policy._running.values(), key=lambda q: q.id)[pick % len(policy._running)]
            if kind == "progress":
                policy.on_progress(r, n, now)
            else:
                policy.on_finish(r, [fa.Outcome.FINISHED, fa.Outcome.FAILED][n % 2], now)
            assert policy.queue(model) == before
        elif kind == "cancel" and before:
            gone = before[pick % len(before)]
            policy.on_finish(gone, fa.Outcome.CANCELLED, now)
            assert policy.queue(model) == [q for q in before if q is not gone]
    # Arrivals stop: each queue drains in order, one dispatch per waiting request, across period ends.
    for model in models:
        queue = policy.queue(model)
        for expected in queue:
            now += 0.7
            _check_queues(policy, models, now)
            chosen = policy.select(model, now)
            assert chosen is expected
            policy.on_dispatch(chosen, now)
            policy.on_progress(chosen, 2, now + 0.1)
            policy.on_finish(chosen, fa.Outcome.FINISHED, now + 0.2)
        assert policy.queued(model) == 0
    for r in list(policy._running.values()):
        policy.on_finish(r, fa.Outcome.FINISHED, now + 1.0)
    assert not policy._live and policy.running() == 0


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.sampled_from([None, 2]))
def test_every_request_runs_on_the_simulator(seed, pool):
    """Random SLO'd clients, some flooding, on 1-2 simulated models: everything runs, no model idles with a backlog."""
    rng = random.Random(seed)
    engines = {
        m: SimEngine(
            fa.ModelProfile(d_model=1024, n_layers=rng.randint(1, 8)),
            max_running=rng.randint(1, 4),
            kv_capacity=400,
            seed=seed,
        )
        for m in ["m", "n"][: rng.randint(1, 2)]
    }
    work = Workload(seed=seed)
    for i in range(rng.randint(2, 4)):
        who = fa.Agent("bot", fa.App(f"app{i}", slo=fa.SLO(e2e=rng.choice([0.05, 0.2, 1.0]))))
        for model in engines:
            work.burst(who, model, n=rng.randint(1, 40), at=rng.uniform(0, 0.5), prompt=(10, 60), output=(1, 20))
            for k in range(rng.randint(0, 5)):
                work.add(SimRequest(rng.uniform(0, 2.0), who, model, 20, 5, cancel_at=rng.choice([None, 0.3, 3.0])))
    result = simulate(work, ExFairS(period=0.2, max_forward=rng.choice([1, 5, 50])), engines, pool_running=pool)
    assert len(result.records) == len(work)
    assert result.idle_with_backlog == 0
    assert all(r.dispatched is not None for r in result.records if r.outcome is fa.Outcome.FINISHED)
