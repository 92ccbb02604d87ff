"""No number stops the policy layer: bad values are refused at the edge, and every call returns with counters finite.

Every numeric input a policy sees (weights, SLOs, token counts, a cost model's prices and
a model's shape) is drawn from all of float64 (subnormals, huge values, NaN, infinities)
and from ints far past any context. A value outside its documented range must be
refused where it is given, with an ``InvalidParameterError``; one inside it must leave
every policy, the pool's policy and the dispatcher answering, with finite counters.
The timeouts turn a loop without end into a failure rather than a hung suite.
"""

import math

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fairagents as fa
from fairagents.dispatcher import Dispatcher
from fairagents.errors import ProtocolError
from fairagents.identity import SLO_RANGE, WEIGHT_RANGE, agent_from_headers
from fairagents.policies._structures import CounterLevel, LazyMinHeap
from fairagents.policies.pooled import PoolPolicy

ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
EDGE_FLOATS = st.sampled_from([0.0, -0.0, 5e-324, 1e-320, 2.2250738585072014e-308, 1e-308, 1e-3, 1.0, 1e3, 1e300,
                               1.7976931348623157e308, math.inf, -math.inf, math.nan, -1.0])
NUMBERS = st.one_of(ANY_FLOAT, EDGE_FLOATS, st.integers(-(2**70), 2**70))
COUNTS = st.one_of(st.integers(0, 64), st.integers(-(2**70), 2**70), st.sampled_from([0, 1, 2**40, 2**40 + 1, 2**63]))
POLICY_NAMES = sorted(fa.policies.POLICIES)
EXAMPLES = min(60, settings.default.max_examples)


def _in_range(value, low, high):
    return not isinstance(value, bool) and math.isfinite(value) and low <= value <= high


def _agent_or_none(app_weight, agent_weight, slo):
    """The agent these numbers describe, or ``None`` after checking they are refused as they are out of range."""
    ok = _in_range(app_weight, *WEIGHT_RANGE) and _in_range(agent_weight, *WEIGHT_RANGE)
    ok = ok and all(v is None or _in_range(v, *SLO_RANGE) for v in slo)
    try:
        agent = fa.Agent("t", fa.App("a", weight=app_weight), weight=agent_weight,
                         slo=fa.SLO(*slo) if any(v is not None for v in slo) else None)
    except fa.InvalidParameterError:
        assert not ok, (app_weight, agent_weight, slo)
        return None
    assert ok, (app_weight, agent_weight, slo)
    return agent


def _counters(policy):
    """Every number a policy keeps per client, where it exposes them."""
    values = []
    if hasattr(policy, "app_counters"):
        values += policy.app_counters().values()
        for app in policy.app_counters():
            values += policy.agent_counters(app).values()
    return values


@pytest.mark.timeout(10)
def test_the_lazy_heap_ends_on_scores_that_equal_nothing():
    scores = {"a": 1.0, "b": 2.0}
    heap = LazyMinHeap(scores)
    heap.add("a")
    heap.add("b")
    scores["a"] = math.nan  # NaN != NaN: a re-key loop that waits for equality never ends
    assert heap.min() in {"a", "b"}
    assert heap.min() in {"a", "b"}


def test_a_counter_level_refuses_a_weight_whose_inverse_is_not_finite():
    level = CounterLevel()
    with pytest.raises(ProtocolError):
        level.enqueue("c", 1e-320, "m")  # 1 / 1e-320 is inf: every charge would be inf, or NaN for 0
    with pytest.raises(ProtocolError):
        level.touch("c", math.nan)


@pytest.mark.parametrize("weight", [1e-320, 4e-324, 5e-309, 0.0, -1.0, math.inf, math.nan, 1e-4, 1e4, True])
def test_a_weight_out_of_range_is_refused_where_it_is_given(weight):
    with pytest.raises(fa.InvalidParameterError, match="weight"):
        fa.Agent("t", fa.App("a"), weight=weight)
    with pytest.raises(fa.InvalidParameterError, match="weight"):
        fa.App("a", weight=weight)
    with pytest.raises(fa.InvalidParameterError) as refused:
        agent_from_headers("a", "t", {"X-Fairagents-Agent-Weight": repr(weight)})
    assert refused.value.param == "X-Fairagents-Agent-Weight"
    with pytest.raises(fa.InvalidParameterError, match="fairagents_agent_weight"):
        from fairagents.vllm.args import check_args

        check_args({"fairagents_agent_weight": weight})


@pytest.mark.parametrize("seconds", [1e-320, 0.0, -1.0, math.inf, math.nan, 1e-4, 86_401.0])
def test_an_slo_out_of_range_is_refused(seconds):
    with pytest.raises(fa.InvalidParameterError, match="SLO ttft"):
        fa.SLO(ttft=seconds)
    with pytest.raises(fa.InvalidParameterError) as refused:
        agent_from_headers("a", "t", {"X-Fairagents-Agent-Slo": f"ttft={seconds!r}"})
    assert refused.value.param == "X-Fairagents-Agent-Slo"


def test_the_ranges_ends_are_accepted():
    for weight in WEIGHT_RANGE:
        assert fa.Agent("t", fa.App("a", weight=weight), weight=weight).weight == weight
    for seconds in SLO_RANGE:
        assert fa.SLO(ttft=seconds, tpot=seconds, e2e=seconds).ttft == seconds


def test_a_bad_header_is_not_echoed_whole():
    with pytest.raises(fa.InvalidParameterError) as refused:
        agent_from_headers("a", "t", {"X-Fairagents-Agent-Weight": "9" * 60_000})
    assert len(str(refused.value)) < 300 and "60000 characters" in str(refused.value)


@pytest.mark.parametrize("count", [-1, 2**40 + 1, 10**400])
def test_token_counts_past_any_context_are_refused(count):
    who = fa.Agent("t", fa.App("a"))
    with pytest.raises(fa.InvalidParameterError):
        fa.Request("r", who, "m", prompt_tokens=count, max_tokens=1, arrival=0.0)
    with pytest.raises(fa.InvalidParameterError):
        fa.UnifiedTokenCost({"m": fa.ModelProfile(4096, 1)}).output_cost("m", count)


@pytest.mark.parametrize("price", [1e308, math.inf, math.nan, -1.0, 1e4])
def test_a_cost_model_that_could_price_an_infinity_is_refused(price):
    with pytest.raises(fa.InvalidParameterError, match="w_output"):
        fa.UnifiedTokenCost(w_output=price)
    with pytest.raises(fa.InvalidParameterError, match="d_model"):
        fa.ModelProfile(d_model=10**400, n_layers=1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", POLICY_NAMES)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_policy_returns_with_finite_counters_on_any_numbers(name, data):
    cost = fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=4096, n_layers=32),
                                "v": fa.ModelProfile(d_model=1024, n_layers=2)})
    policy = fa.policies.make_policy(name, cost)
    agents = []
    for i in range(data.draw(st.integers(1, 4))):
        who = _agent_or_none(data.draw(NUMBERS), data.draw(NUMBERS),
                             [data.draw(st.one_of(st.none(), NUMBERS)) for _ in range(3)])
        if who is not None:
            agents.append(fa.Agent(f"t{i}", fa.App(f"a{i % 2}", weight=who.app.weight), weight=who.weight,
                                   slo=who.slo))
    if not agents:
        agents = [fa.Agent("t", fa.App("a"))]
    now, waiting, running = 0.0, [], []
    for step in range(data.draw(st.integers(1, 40))):
        now += data.draw(st.floats(0, 1e6))
        action = data.draw(st.sampled_from(["arrive", "arrive", "dispatch", "progress", "finish"]))
        if action == "arrive":
            prompt, most = data.draw(COUNTS), data.draw(COUNTS)
            try:
                r = fa.Request(f"r{step}", data.draw(st.sampled_from(agents)), data.draw(st.sampled_from("mv")),
                               prompt, most, arrival=now)
            except fa.InvalidParameterError:
                assert not (0 <= prompt <= 2**40 and 1 <= most <= 2**40)
                continue
            policy.on_arrival(r, now)
            waiting.append(r)
        elif action == "dispatch":
            r = policy.select(data.draw(st.sampled_from("mv")), now)
            if r is not None:
                policy.on_dispatch(r, now)
                waiting.remove(r)
                running.append(r)
        elif action == "progress" and running:
            tokens = data.draw(COUNTS)
            r = data.draw(st.sampled_from(running))
            try:
                policy.on_progress(r, tokens, now)
            except fa.InvalidParameterError:
                assert not 0 <= tokens <= 2**40
        elif action == "finish" and (waiting or running):
            r = data.draw(st.sampled_from(waiting + running))
            policy.on_finish(r, fa.Outcome.FINISHED if r in running else fa.Outcome.CANCELLED, now)
            (running if r in running else waiting).remove(r)
        assert all(math.isfinite(c) for c in _counters(policy)), _counters(policy)
    while (r := policy.select("m", now) or policy.select("v", now)) is not None:  # every waiting request drains
        policy.on_dispatch(r, now)
        waiting.remove(r)
    assert not waiting


@pytest.mark.timeout(120)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weights=st.lists(st.tuples(NUMBERS, NUMBERS), min_size=1, max_size=4),
       steps=st.lists(st.tuples(st.integers(0, 3), COUNTS), max_size=30))
def test_the_pool_policy_and_the_dispatcher_return_with_finite_counters_on_any_numbers(weights, steps):
    cost = fa.UnifiedTokenCost()
    seat = PoolPolicy(fa.policies.make_policy("hmfs", cost), cost)
    dispatcher = Dispatcher(fa.policies.make_policy("hmfs", fa.UnifiedTokenCost()), fa.UnifiedTokenCost())
    seat.register("e", fa.ModelProfile(d_model=4096, n_layers=1))
    dispatcher.add_model("d", fa.ModelProfile(d_model=4096, n_layers=1), slots=2, token_budget=None,
                         max_model_len=2**41)
    agents = [a for i, (aw, tw) in enumerate(weights) if (a := _agent_or_none(aw, tw, [None] * 3)) is not None]
    agents = [fa.Agent(f"t{i}", fa.App(f"a{i}", weight=a.app.weight), weight=a.weight) for i, a in enumerate(agents)]
    if not agents:
        return
    now = 0.0
    for n, (who, tokens) in enumerate(steps):
        now += 0.5
        agent = agents[who % len(agents)]
        if not 1 <= tokens <= 2**40:
            with pytest.raises(fa.InvalidParameterError):
                fa.Request(f"x{n}", agent, "e", tokens, tokens, arrival=now)
            continue
        engine_req = fa.Request(f"e{n}", agent, "e", tokens, 1, arrival=now)
        seat.engine_arrive(engine_req)
        head = seat.engine_select("e")
        seat.engine_dispatch("e", head.id)
        seat.engine_progress("e", [(head.id, tokens)])
        seat.engine_end("e", head.id, fa.Outcome.FINISHED)
        started = dispatcher.arrive(fa.Request(f"d{n}", agent, "d", tokens, tokens, arrival=now), now).started
        for ticket in started:
            dispatcher.progress(ticket.request.id, tokens, now)
            dispatcher.finish(ticket.request.id, now)
        assert all(math.isfinite(v) for v in seat.charged.values())
        assert all(math.isfinite(v) for v in _counters(seat.policy) + _counters(dispatcher.policy))


class _Broken:
    """A cost model with a bug: it prices one model's tokens at NaN."""

    def __init__(self):
        self.inner = fa.UnifiedTokenCost({"m": fa.ModelProfile(4096, 1), "bad": fa.ModelProfile(4096, 1)})

    def input_cost(self, model, n):
        return math.nan if model == "bad" else self.inner.input_cost(model, n)

    def output_cost(self, model, n):
        return math.nan if model == "bad" else self.inner.output_cost(model, n)


def test_a_charge_that_is_not_finite_fails_its_request_alone_and_moves_no_counter():
    policy = fa.policies.HMFS(_Broken())
    cost = fa.UnifiedTokenCost()
    dispatcher = Dispatcher(policy, cost)
    for model in ("m", "bad"):
        dispatcher.add_model(model, fa.ModelProfile(4096, 1), slots=1, token_budget=None, max_model_len=1000)
    a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
    first = dispatcher.arrive(fa.Request("ok-1", b, "m", 10, 10, arrival=0.0), 0.0).started
    with structlog.testing.capture_logs() as logs:
        changes = dispatcher.arrive(fa.Request("bad-1", a, "bad", 10, 10, arrival=0.0), 0.0)
    assert [t.request.id for t in first] == ["ok-1"] and changes.started == []
    [failed] = changes.ended
    assert failed.outcome is fa.Outcome.FAILED and isinstance(failed.error, ProtocolError)
    assert any(entry["event"] == "fairagents.dispatcher.dispatch_refused" for entry in logs)
    assert all(math.isfinite(c) for c in _counters(policy)) and policy.queued() == 0
    # the pool goes on: the same app's next request on a sound model runs
    dispatcher.finish("ok-1", 1.0)
    assert [t.request.id for t in dispatcher.arrive(fa.Request("ok-2", a, "m", 10, 10, arrival=1.0), 1.0).started] \
        == ["ok-2"]


def test_in_an_engine_a_refused_charge_leaves_the_request_uncharged_and_the_engine_serving():
    seat = PoolPolicy(fa.policies.HMFS(_Broken()), fa.UnifiedTokenCost())
    seat.register("m", fa.ModelProfile(4096, 1))
    seat.register("bad", fa.ModelProfile(4096, 1))
    who = fa.Agent("t", fa.App("a"))
    seat.engine_arrive(fa.Request("r", who, "bad", 10, 10, arrival=0.0))
    with structlog.testing.capture_logs() as logs:
        assert not seat.engine_dispatch("bad", "r")
    assert [entry["event"] for entry in logs] == ["fairagents.policy.refused"]
    assert seat.held() == 0 and seat.policy.queued() == 0 and seat.charged == {}
    seat.engine_progress("bad", [("r", 5)])  # its output, reported on: charged to nobody
    assert all(math.isfinite(c) for c in _counters(seat.policy))
    seat.engine_arrive(fa.Request("s", who, "m", 10, 10, arrival=0.0))
    assert seat.engine_dispatch("m", "s") and seat.charged == {"a": 10.0}


@pytest.mark.parametrize("huge", [10**400, 10**5000, -(10**5000)], ids=["400 digits", "5000 digits", "-5000 digits"])
def test_an_integer_too_large_for_a_float_is_refused_with_a_message_that_can_be_written(huge):
    """A float cannot hold it and, past 4,300 digits, Python cannot write it: it is refused all the same."""
    checks = [lambda: fa.App("a", weight=huge), lambda: fa.Agent("t", fa.App("a"), weight=huge),
              lambda: fa.SLO(e2e=huge), lambda: fa.UnifiedTokenCost(w_input=huge),
              lambda: fa.ModelProfile(d_model=huge, n_layers=1),
              lambda: fa.Request("r", fa.Agent("t", fa.App("a")), "m", huge, 1, arrival=0.0)]
    for check in checks:
        with pytest.raises(fa.InvalidParameterError) as refused:
            check()
        assert len(str(refused.value)) < 200
