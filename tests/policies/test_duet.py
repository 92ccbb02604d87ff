"""DuetInfer's scheduler: worked examples of the key, Formula 1 and aging; properties on random workloads."""

import itertools
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fairagents as fa
from fairagents.engines import SimEngine
from fairagents.errors import ProtocolError
from fairagents.policies.duet import Duet
from fairagents.policies.predict import LengthPredictor
from fairagents.simulation import SimRequest, Workload, simulate

WHO = fa.Agent("t", fa.App("a"))
TEXT = fa.ModelProfile(d_model=64, n_layers=1)
VISION = fa.ModelProfile(d_model=64, n_layers=1, modality=fa.Modality.VISION)


def cost():
    return fa.UnifiedTokenCost({"m": TEXT, "vlm": VISION}, d_base=64)


def request(id, arrival, model="vlm", prompt=10, max_tokens=8, agent=WHO):
    return fa.Request(id=id, agent=agent, model=model, prompt_tokens=prompt, max_tokens=max_tokens, arrival=arrival)


def drain(policy, model, now):
    order = []
    while (r := policy.select(model, now)) is not None:
        policy.on_dispatch(r, now)
        order.append(r.id)
    return order


_history_ids = itertools.count()


def with_history(policy, waits, model="vlm"):
    """Dispatch one request per wait (entered at 0, dispatched at ``wait``): the history ``θ`` is drawn from."""
    for wait in waits:
        r = request(f"h{next(_history_ids)}", 0.0, model=model)
        policy.on_arrival(r, 0.0)
        policy.on_dispatch(r, float(wait))


# -- the priority key (§III-D) -------------------------------------------------------


def test_system_arrival_restores_the_order_vision_encoding_disturbed():
    """Fig. 6: image requests that arrived first but entered the LM queue after a text request go first."""
    p = Duet(cost())
    p.on_arrival(request("text", 1.0), 1.0)
    p.on_arrival(request("img2", 0.8), 1.5)
    p.on_arrival(request("img1", 0.2), 1.6)
    assert drain(p, "vlm", 1.6) == ["img1", "img2", "text"]


def test_formula_1_orders_requests_of_equal_arrival():
    """α=1, β=2, nothing learned (L̂_decode = max_tokens / 2): costs 164, 220, 60."""
    p = Duet(cost())
    reqs = [
        request("r1", 0.0, prompt=100, max_tokens=64),
        request("r2", 0.0, prompt=20, max_tokens=200),
        request("r3", 0.0, prompt=50, max_tokens=10),
    ]
    assert [p.estimate_cost(r) for r in reqs] == [164.0, 220.0, 60.0]
    for r in reqs:
        p.on_arrival(r, 0.0)
    assert [p.priority(r, 0.0) for r in reqs] == [(0.0, 164.0), (0.0, 220.0), (0.0, 60.0)]
    assert drain(p, "vlm", 0.0) == ["r3", "r1", "r2"]


def test_alpha_and_beta_weigh_prefill_against_decode():
    p = Duet(cost(), alpha=0.5, beta=3.0)
    assert p.estimate_cost(request("r", 0.0, prompt=100, max_tokens=64)) == 0.5 * 100 + 3.0 * 32
    raw = Duet(fa.RawTokenCost(w_input=1.0, w_output=4.0))
    assert (raw.alpha, raw.beta) == (1.0, 4.0)


def test_equal_keys_go_in_order_of_entry():
    p = Duet(cost())
    for i in range(5):
        p.on_arrival(request(f"r{i}", 0.0), 0.0)
    assert drain(p, "vlm", 0.0) == [f"r{i}" for i in range(5)]


# -- the length predictor (per-modality regression, fitted online) ---------------------------------


def run_to_end(p, r, produced, outcome=fa.Outcome.FINISHED, now=0.0):
    p.on_arrival(r, now)
    p.on_dispatch(r, now)
    for chunk in (produced // 2, produced - produced // 2):
        p.on_progress(r, chunk, now)
    p.on_finish(r, outcome, now)


def test_output_length_is_learned_per_modality_from_finished_requests_only():
    p = Duet(cost(), predictor=LengthPredictor(min_samples=2))
    # text requests follow output = 2·prompt + 5, image requests output = prompt / 10
    run_to_end(p, request("t1", 0.0, model="m", prompt=10, max_tokens=500), 25)
    run_to_end(p, request("t2", 0.0, model="m", prompt=20, max_tokens=500), 45)
    run_to_end(p, request("v1", 0.0, model="vlm", prompt=100, max_tokens=500), 10)
    run_to_end(p, request("v2", 0.0, model="vlm", prompt=300, max_tokens=500), 30)
    # cut short: not learned (they would bend both lines)
    run_to_end(p, request("x1", 0.0, model="m", prompt=10, max_tokens=500), 400, fa.Outcome.CANCELLED)
    run_to_end(p, request("x2", 0.0, model="vlm", prompt=100, max_tokens=500), 400, fa.Outcome.FAILED)
    assert p.predictor.error.samples == 4
    assert p.estimate_cost(request("t", 0.0, model="m", prompt=40, max_tokens=500)) == 40 + 2 * 85
    assert p.estimate_cost(request("v", 0.0, model="vlm", prompt=200, max_tokens=500)) == 200 + 2 * 20
    # a prediction never exceeds what the request may produce
    assert p.estimate_cost(request("t", 0.0, model="m", prompt=40, max_tokens=50)) == 40 + 2 * 50


def test_a_model_without_profile_is_text():
    c = fa.UnifiedTokenCost({"vlm": VISION}, d_base=64)
    p = Duet(c)
    assert p.modality("vlm") is fa.Modality.VISION and p.modality("other") is fa.Modality.TEXT


# -- aging (§III-D): threshold = p90 of historical waits, promotion step by step -------------


def test_threshold_is_the_p90_of_recent_dispatch_waits():
    p = Duet(cost(), min_history=10)
    with_history(p, range(1, 10))
    assert p.threshold("vlm") is None  # 9 waits: not enough history yet
    with_history(p, [10])
    assert p.threshold("vlm") == 9.0  # nearest rank: the 9th of 1..10
    assert p.threshold("m") is None  # per model


def test_threshold_forgets_old_waits_and_ignores_cancelled_ones():
    p = Duet(cost(), history=3, min_history=3)
    with_history(p, [1, 2, 30])
    assert p.threshold("vlm") == 30.0
    r = request("gone", 0.0)
    p.on_arrival(r, 0.0)
    p.on_finish(r, fa.Outcome.CANCELLED, 100.0)  # waited 100 s but was never served
    assert p.threshold("vlm") == 30.0
    with_history(p, [4, 5, 6])
    assert p.threshold("vlm") == 6.0


def aging_example(aging_step=1.0):
    """θ = 9 s. A text request T (arrival 20) waits; image requests V1 (arrival 17.5) and
    V2 (arrival 18.5) enter the queue at 31 after their vision encoding."""
    p = Duet(cost(), min_history=10, aging_step=aging_step)
    with_history(p, range(1, 11))
    t, v1, v2 = request("T", 20.0), request("V1", 17.5), request("V2", 18.5)
    p.on_arrival(t, 20.0)
    return p, t, v1, v2


def test_aging_worked_example_promotes_one_step_per_tick():
    p, t, v1, v2 = aging_example()
    assert p.threshold("vlm") == 9.0
    # T's effective arrival: unchanged until its wait exceeds θ at a tick (every 1 s), then 1 s earlier per tick
    steps = {29.0: 20.0, 29.5: 20.0, 30.0: 19.0, 30.5: 19.0, 31.0: 18.0, 32.0: 17.0, 33.5: 16.0}
    assert {now: p.priority(t, now)[0] for now in steps} == steps
    for v in (v1, v2):
        p.on_arrival(v, 31.0)
        assert p.priority(v, 31.0)[0] == v.arrival  # just entered: not aged
    # at 31, T (18) has been promoted past V2 (18.5) but not yet past V1 (17.5); one tick later, past both
    assert p.select("vlm", 31.0) is v1
    assert p.select("vlm", 32.0) is t
    assert drain(p, "vlm", 31.0) == ["V1", "T", "V2"]


def test_without_history_there_is_no_aging():
    p = Duet(cost(), min_history=10)
    t, v1, v2 = request("T", 20.0), request("V1", 17.5), request("V2", 18.5)
    p.on_arrival(t, 20.0)
    p.on_arrival(v1, 31.0)
    p.on_arrival(v2, 31.0)
    assert p.priority(t, 1000.0) == (20.0, p.estimate_cost(t))
    assert drain(p, "vlm", 31.0) == ["V1", "V2", "T"]


def test_continuous_aging():
    p, t, v1, v2 = aging_example(aging_step=0.0)
    assert [p.priority(t, now)[0] for now in (29.0, 29.25, 31.0, 32.0)] == [20.0, 19.75, 18.0, 17.0]
    p.on_arrival(v1, 31.0)
    p.on_arrival(v2, 31.0)
    assert drain(p, "vlm", 31.0) == ["V1", "T", "V2"]


def test_aged_requests_are_ranked_among_themselves_by_arrival_plus_entry():
    """Two aged text requests and an image request that entered late: order by effective arrival."""
    p = Duet(cost(), min_history=10, aging_step=1.0)
    with_history(p, [2] * 10)  # θ = 2
    a, b, late = request("a", 10.0), request("b", 11.0), request("late", 6.0)
    p.on_arrival(a, 10.0)
    p.on_arrival(b, 11.0)
    p.on_arrival(late, 20.0)
    # at 20: cut = 18; a: 10 + 10 − 18 = 2, b: 11 + 11 − 18 = 4, late: fresh, 6
    assert [p.priority(r, 20.0)[0] for r in (a, b, late)] == [2.0, 4.0, 6.0]
    assert drain(p, "vlm", 20.0) == ["a", "b", "late"]


# -- the contract -----------------------------------------------------------------------------


def test_contract():
    p = Duet(cost())
    assert isinstance(p, fa.policies.Policy) and p.name == "duet" and Duet.charges_unified_tokens
    r = request("r", 0.0)
    with pytest.raises(fa.UnknownModelError):
        p.on_arrival(request("x", 0.0, model="nope"), 0.0)
    with pytest.raises(ProtocolError):
        p.priority(r, 0.0)
    p.on_arrival(r, 0.0)
    assert p.select("vlm", 0.0) is p.select("vlm", 0.0) is r and p.queued("vlm") == 1
    assert p.select("m", 0.0) is None and p.select_among(["m"], 0.0) is None
    with pytest.raises(ProtocolError):
        p.on_progress(r, 1, 0.0)
    p.on_dispatch(r, 0.0)
    with pytest.raises(fa.InvalidParameterError):
        p.on_progress(r, -1, 0.0)
    p.on_finish(r, fa.Outcome.FINISHED, 0.0)
    assert p.queued() == 0 and p.running() == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alpha": -1.0},
        {"beta": math.nan},
        {"percentile": 0.0},
        {"percentile": True},
        {"history": 0},
        {"min_history": 2.5},
        {"history": 5, "min_history": 6},
        {"aging_step": -0.1},
    ],
)
def test_rejects_bad_parameters(kwargs):
    with pytest.raises(fa.InvalidParameterError):
        Duet(**kwargs)


def test_runs_in_the_simulator():
    engines = {
        "m": SimEngine(TEXT, max_running=2, kv_capacity=400),
        "vlm": SimEngine(VISION, max_running=2, kv_capacity=400),
    }
    policy = Duet(cost(), min_history=3, aging_step=0.05)
    work = Workload(seed=3)
    for i in range(60):
        work.add(SimRequest(i * 0.01, WHO, ("m", "vlm")[i % 2], 20 + i, 1 + i % 30, max_tokens=40))
    result = simulate(work, policy, engines, pool_running=3)
    assert len(result.records) == 60 and policy.queued() == 0 and policy.running() == 0
    assert policy.predictor.error.samples == 60
    assert policy.threshold("m") is not None


# -- properties on random workloads ------------------------------------------------------------


def examples(n):
    return min(n, settings.default.max_examples)


class Reference:
    """DuetInfer's rule by brute force over the waiting requests, from first principles."""

    def __init__(self, percentile, history, min_history, step):
        self.percentile, self.history, self.min_history, self.step = percentile, history, min_history, step
        self.waiting = {}  # id -> (req, entered, cost, seq)
        self.waits = {}
        self.seq = 0

    def snap(self, t):
        return self.step * math.floor(t / self.step) if self.step else t

    def theta(self, model):
        waits = self.waits.get(model, [])[-self.history :]
        if len(waits) < self.min_history:
            return None
        return sorted(waits)[max(0, math.ceil(self.percentile * len(waits) - 1e-9) - 1)]

    def key(self, rid, now, thetas):
        req, entered, cost, seq = self.waiting[rid]
        theta = thetas[req.model]
        if theta is not None:
            cut = self.snap(now - theta)
            ticks = round((cut - self.snap(entered)) / self.step) if self.step else cut - entered
            if entered < cut:
                assert ticks > 0
                return req.arrival + self.snap(entered) - cut, cost, seq
        return req.arrival, cost, seq

    def select(self, models, now):
        thetas = {model: self.theta(model) for model in models}
        keys = [(self.key(rid, now, thetas), rid) for rid, (r, *_) in self.waiting.items() if r.model in models]
        return min(keys)[1] if keys else None


KINDS = ["arrive", "dispatch", "progress", "finish", "cancel"]


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 2**32),
    st.integers(20, 300),
    st.sampled_from([0.2, 0.35, 0.5]),
    st.sampled_from([0.5, 0.9, 1.0]),
    st.integers(1, 6),
    st.integers(0, 8),
    st.sampled_from([0.0, 0.25, 1.0]),
)
def test_property_matches_the_rule_is_work_conserving_and_starvation_free(
    seed, n_ops, dispatch_share, percentile, min_history, extra, step
):
    """On random workloads (late entries, cancellations, learning, aging, overload):

    - every decision is the brute-force least key (Formula 1 and aging from first principles);
    - ``select`` is pure and returns a request whenever one waits;
    - starvation freedom: a request is only passed over by requests that arrived before it
      entered the queue (+ aging_step / 2), so future arrivals never delay it; and the queue drains.
    """
    rnd = random.Random(seed)
    weights = [1.0 - dispatch_share - 0.25, dispatch_share, 0.1, 0.1, 0.05]
    ops = [
        (
            rnd.choices(KINDS, weights)[0],
            rnd.choice([0.0, 0.0, 0.25, 0.5, 1.5]),
            rnd.choice([0.0, 0.25, 1.0, 3.0]),
            rnd.randint(0, 200),
            rnd.randint(1, 64),
            rnd.randint(0, 1000),
        )
        for _ in range(n_ops)
    ]
    models = ["m", "vlm"]
    p = Duet(
        cost(),
        predictor=LengthPredictor(min_samples=2),
        percentile=percentile,
        history=min_history + extra,
        min_history=min_history,
        aging_step=step,
    )
    ref = Reference(percentile, min_history + extra, min_history, step)
    running, produced = [], {}
    now = 0.0
    agents = [fa.Agent(f"t{i}", fa.App(f"a{i % 2}")) for i in range(3)]

    def dispatch(chosen, at):
        r = ref.waiting[chosen.id][0]
        assert chosen is r
        del ref.waiting[r.id]
        entered = ref_entered[r.id]
        ref.waits.setdefault(r.model, []).append(at - entered)
        for other, *_ in ref.waiting.values():  # starvation freedom: nothing that arrived later than they entered
            if other.model == r.model:
                assert r.arrival <= ref_entered[other.id] + step / 2
        p.on_dispatch(r, at)
        running.append(r)
        produced[r.id] = 0

    ref_entered = {}
    for i, (kind, dt, delay, prompt, max_tokens, pick) in enumerate(ops):
        now += dt
        model = models[pick % 2]
        if kind == "arrive":
            r = request(f"r{i}", now - delay, model=model, prompt=prompt, max_tokens=max_tokens, agent=agents[pick % 3])
            cost_now = p.estimate_cost(r)
            p.on_arrival(r, now)
            ref.seq += 1
            ref.waiting[r.id] = (r, now, cost_now, ref.seq)
            ref_entered[r.id] = now
        elif kind == "dispatch":
            chosen = p.select(model, now)
            assert chosen is p.select(model, now)  # pure
            assert (chosen is None) == (p.queued(model) == 0)  # work conserving
            assert (chosen.id if chosen else None) == ref.select([model], now)
            among = p.select_among(models, now)
            assert (among.id if among else None) == ref.select(models, now)
            if chosen is not None:
                dispatch(chosen, now)
        elif kind == "progress" and running:
            r = running[pick % len(running)]
            n = min(prompt % 7, r.max_tokens - produced[r.id])
            p.on_progress(r, n, now)
            produced[r.id] += n
        elif kind == "finish" and running:
            r = running.pop(pick % len(running))
            p.on_finish(
                r, [fa.Outcome.FINISHED, fa.Outcome.FINISHED, fa.Outcome.CANCELLED, fa.Outcome.FAILED][pick % 4], now
            )
        elif kind == "cancel" and ref.waiting:
            rid = sorted(ref.waiting)[pick % len(ref.waiting)]
            r = ref.waiting.pop(rid)[0]
            p.on_finish(r, fa.Outcome.CANCELLED, now)
    # drain: every waiting request is served, each decision still the rule's
    while ref.waiting:
        now += 0.25
        chosen = p.select_among(models, now)
        assert chosen is not None and chosen.id == ref.select(models, now)
        dispatch(chosen, now)
    assert p.select_among(models, now) is None and p.queued() == 0


def test_large_queue_matches_the_rule_through_compactions():
    """10,000 requests in and out of one model's queue (slots compacted many times), spot-checked."""
    rnd = random.Random(7)
    p = Duet(cost(), min_history=5, aging_step=0.5)
    ref = Reference(0.9, 1000, 5, 0.5)
    now = 0.0
    for i in range(10_000):
        now += rnd.choice([0.0, 0.25])
        r = request(f"r{i}", now - rnd.choice([0.0, 0.5, 4.0]), prompt=rnd.randint(0, 50), max_tokens=8)
        ref.seq += 1
        ref.waiting[r.id] = (r, now, p.estimate_cost(r), ref.seq)
        p.on_arrival(r, now)
        if rnd.random() < 0.45:
            chosen = p.select("vlm", now)
            if i % 97 == 0:
                assert chosen.id == ref.select(["vlm"], now)
            ref.waits.setdefault("vlm", []).append(now - ref.waiting.pop(chosen.id)[1])
            p.on_dispatch(chosen, now)
    assert p.queued() == len(ref.waiting) > 4000
    assert p.select("vlm", now).id == ref.select(["vlm"], now)
