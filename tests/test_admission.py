"""Statera admission (H-MAS Alg. 2): the conformal bound, the fence on the dispatcher, the two loops."""

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fairagents as fa
from fairagents.admission import ConformalBound, Statera, make_admission
from fairagents.dispatcher import Dispatcher

PROFILE = fa.ModelProfile(d_model=64, n_layers=1)
A, B = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))


def make(admission, *, slots=8, budget=1000, max_model_len=1000, policy="fcfs", block=1):
    cost = fa.UnifiedTokenCost(d_base=64)
    d = Dispatcher(fa.policies.make_policy(policy, cost), cost, admission=admission)
    d.add_model("m", PROFILE, slots=slots, token_budget=budget, max_model_len=max_model_len, block=block)
    return d


def req(id, who=A, prompt=10, max_tokens=200, arrival=0.0):
    return fa.Request(id, who, "m", prompt, max_tokens, arrival)


def teach(d, n, *, out=20, prompt=10, max_tokens=200, start=0.0):
    """Serve ``n`` requests one at a time, each producing ``out`` tokens."""
    for i in range(n):
        t = start + i
        d.arrive(req(f"teach{start}-{i}", prompt=prompt, max_tokens=max_tokens, arrival=t), t)
        d.progress(f"teach{start}-{i}", out, t)
        d.finish(f"teach{start}-{i}", t)


# -- the conformal bound ---------------------------------------------------------


def test_the_quantile_is_the_split_conformal_rank():
    bound = ConformalBound(epsilon=0.2)
    assert bound.needed == 4  # ⌈0.8 / 0.2⌉: with fewer, ⌈(n+1)·0.8⌉ > n
    for e in [5, -3, 9]:
        bound.observe(64, e)
    assert bound.quantile(64) is None
    bound.observe(64, 1)
    assert bound.quantile(64) == 9  # ⌈5 · 0.8⌉ = 4th smallest of [-3, 1, 5, 9]
    for e in range(10, 16):
        bound.observe(64, e)
    assert bound.quantile(64) == 14  # n = 10: ⌈11 · 0.8⌉ = 9th smallest


def test_buckets_are_powers_of_two_and_an_empty_bucket_borrows_from_all():
    bound = ConformalBound(epsilon=0.5)
    assert [ConformalBound.bucket(n) for n in (0, 1, 2, 3, 4, 1000, 1024)] == [0, 0, 1, 1, 2, 9, 10]
    for e in (100, 100):
        bound.observe(1000, e)
    for e in (1, 1):
        bound.observe(10, e)
    assert bound.quantile(1000) == 100
    assert bound.quantile(10) == 1
    assert bound.quantile(100_000) == 100  # borrowed: ⌈5 · 0.5⌉ = 3rd of [1, 1, 100, 100]


def test_upper_is_max_tokens_until_calibrated_and_is_clamped():
    bound = ConformalBound(epsilon=0.5)
    assert bound.upper(10, predicted=30, max_tokens=200) == 200
    for e in (-50, -50, -50):
        bound.observe(10, e)
    assert bound.upper(10, predicted=30, max_tokens=200) == 1  # never below one token
    for e in (500,) * 10:
        bound.observe(10, e)
    assert bound.upper(10, predicted=30, max_tokens=200) == 200  # never above max_tokens


@pytest.mark.parametrize("epsilon", [0.05, 0.1, 0.2])
def test_the_bound_covers_at_least_1_minus_epsilon_of_a_synthetic_stream(epsilon):
    """Coverage per bucket, measured before each length is learned, on a stream whose noise differs by bucket."""
    rng = random.Random(7)
    bound = ConformalBound(epsilon=epsilon, history=2000)
    seen = {b: [0, 0] for b in (3, 6, 9)}  # bucket -> [covered, total]
    widths = []
    for _ in range(12_000):
        prompt = rng.choice([10, 100, 1000])
        predicted = 50
        real = max(1, round(rng.lognormvariate(3.5, {10: 0.2, 100: 0.6, 1000: 1.0}[prompt])))
        upper = bound.upper(prompt, predicted, max_tokens=4000)
        if upper < 4000:  # calibrated
            b = ConformalBound.bucket(prompt)
            seen[b][0] += real <= upper
            seen[b][1] += 1
            widths.append(upper)
        bound.observe(prompt, real - predicted)
    for b, (covered, total) in seen.items():
        assert total > 3000
        assert covered / total >= 1 - epsilon - 0.02, (b, covered / total)
    # and it is a bound, not the worst case: far below max_tokens
    assert sum(widths) / len(widths) < 500


@given(st.lists(st.integers(-500, 500), min_size=1, max_size=300), st.integers(1, 40))
@settings(max_examples=50, deadline=None)
def test_the_window_keeps_exactly_the_last_history_errors(errors, history):
    bound = ConformalBound(epsilon=0.5, history=history)
    for e in errors:
        bound.observe(100, e)
    kept = sorted(errors[-history:])
    assert bound._sorted[ConformalBound.bucket(100)] == kept
    assert bound._sorted[None] == kept


def test_bad_parameters_are_refused():
    for bad in ({"epsilon": 0}, {"epsilon": 1}, {"frag": 1.0}, {"band": (0.9, 0.5)}, {"min_slots": 0},
                {"window": 0}, {"period": 0}, {"eta_budget": -1}, {"min_budget": 0}):
        with pytest.raises(fa.InvalidParameterError):
            Statera(**bad)
    with pytest.raises(ValueError, match="unknown admission"):
        make_admission("fast")
    assert make_admission(None) is None


# -- the fence on the dispatcher ---------------------------------------------------------


def test_it_starts_with_worst_case_reservations_and_admits_more_once_calibrated():
    plain, statera = make(None, budget=1000), make(Statera(frag=0.0), budget=1000)
    for d in (plain, statera):
        teach(d, 40, out=20)
        for i in range(20):
            d.arrive(req(f"r{i}", arrival=100.0), 100.0)
    # worst case: 210 tokens each, 4 fit in 1000; calibrated: ~30 tokens each, the 8 slots fill
    assert plain.model("m").running == 4
    assert statera.model("m").running == 8
    assert statera.ticket("r0").reserved < 60
    assert statera.ticket("r0").predicted == 20


def test_fresh_it_reserves_exactly_what_worst_case_admission_does():
    plain, statera = make(None, budget=500), make(Statera(frag=0.0), budget=500)
    for d in (plain, statera):
        for i in range(5):
            d.arrive(req(f"r{i}"), 0.0)
    assert [t.reserved for t in plain.tickets()] == [t.reserved for t in statera.tickets()] == [210] * 5
    assert plain.model("m").running == statera.model("m").running == 2


def test_a_request_that_outgrows_its_bound_raises_its_reservation_as_it_goes():
    d = make(Statera(frag=0.0), budget=1000, block=16)
    teach(d, 40, out=20)
    d.arrive(req("long"), 100.0)
    ticket = d.ticket("long")
    start = ticket.reserved
    assert start < 210
    d.progress("long", 150, 101.0)
    assert ticket.reserved == 160 == d.model("m").reserved  # 10 + 150, rounded up to the block
    assert ticket.reserved > start
    d.finish("long", 102.0)
    m = d.model("m")
    assert (m.running, m.reserved, m.used) == (0, 0, 0)


def test_finished_requests_calibrate_and_cancelled_ones_do_not():
    statera = Statera()
    d = make(statera)
    teach(d, 5, out=7)  # the predictor's first five: guesses, not calibrating
    assert statera.calibrated == 0 and statera.predictor.error.samples == 5
    d.arrive(req("a"), 10.0)
    assert d.ticket("a").predicted == 7
    d.progress("a", 3, 10.5)
    d.cancel("a", 11.0)
    assert statera.calibrated == 0 and statera.predictor.error.samples == 5
    d.arrive(req("b"), 11.0)
    d.progress("b", 7, 11.5)
    d.finish("b", 12.0)
    assert statera.calibrated == 1 and statera.covered == 1 and statera.predictor.error.samples == 6


def test_a_waiting_request_is_bounded_again_when_it_reaches_the_head():
    statera = Statera(frag=0.0)
    d = make(statera, slots=1)
    d.arrive(req("blocker"), 0.0)
    d.arrive(req("waits"), 0.0)
    assert d.ticket("waits").reserved == 210  # nothing known when it arrived
    for _ in range(40):  # meanwhile, the predictor and the bound learn (from another model's twin, say)
        statera.predictor.observe(A, fa.Modality.TEXT, 10, 20)
        statera.conformal.observe(10, 0)
    d.progress("blocker", 20, 1.0)
    d.finish("blocker", 1.0)
    ticket = d.ticket("waits")
    assert ticket.dispatched == 1.0 and ticket.reserved == 30 == d.model("m").reserved


def test_share_accounting_follows_a_grown_reservation():
    cost = fa.UnifiedTokenCost(d_base=64)
    d = Dispatcher(fa.policies.make_policy("fcfs", cost), cost, admission=Statera(frag=0.0), app_share=lambda app: 0.5)
    d.add_model("m", PROFILE, slots=8, token_budget=1000, max_model_len=1000)
    teach(d, 40, out=20)
    d.arrive(req("x"), 100.0)
    d.progress("x", 180, 100.5)
    assert d._held[("a", "m")] == [1, 190]
    d.finish("x", 101.0)
    assert ("a", "m") not in d._held


# -- the two loops -------------------------------------------------------------------------


def occupy(d, *, prompt, n, at, who=A):
    for i in range(n):
        d.arrive(fa.Request(f"o{at}-{i}", who, "m", prompt, 10, at), at)


def test_occupancy_above_the_band_tightens_budget_and_slots_and_below_it_they_recover():
    statera = Statera(frag=0.0, band=(0.5, 0.6), period=1.0, window=2, min_budget=0.2)
    d = make(statera, slots=10, budget=1000)
    m, state = d.model("m"), statera.states["m"]
    assert (m.slot_limit, m.budget_limit) == (10, 1000)
    occupy(d, prompt=90, n=10, at=0.0)  # 900 of 1000 held: ū = 0.9, e = 0.3
    assert m.used == 900
    for t in (1.0, 2.0, 3.0):
        d.arrive(fa.Request(f"probe{t}", B, "m", 1, 1, t), t)
    assert state.utilisation == pytest.approx(0.9, abs=0.01)
    assert m.budget_limit < 1000 and m.slot_limit < 10
    assert m.budget_limit >= 200 and m.slot_limit >= 1  # never below B_min, N_min
    for t in (3.5, 4.0):
        for rid in [tk.request.id for tk in d.tickets() if tk.dispatched is not None]:
            d.progress(rid, 1, t)
            d.finish(rid, t)
    for t in range(5, 40):
        d.arrive(fa.Request(f"idle{t}", B, "m", 1, 1, float(t)), float(t))
        d.progress(f"idle{t}", 1, float(t))
        d.finish(f"idle{t}", float(t))
    assert (m.slot_limit, m.budget_limit) == (10, 1000)  # an idle model goes back to B_max, N_max


SLOW = fa.Agent("chat", fa.App("c"), slo=fa.SLO(tpot=0.05))


def decode_slowly(statera):
    """Four requests of an agent with a 50 ms TPOT objective, decoding one token per 100 ms for 2 s."""
    d = make(statera, slots=8, budget=100_000)
    for i in range(4):
        d.arrive(fa.Request(f"s{i}", SLOW, "m", 10, 500, 0.0), 0.0)
    t = 0.0
    for _ in range(20):  # twice the TPOT objective
        t += 0.1
        for i in range(4):
            d.progress(f"s{i}", 1, t)
    return d, t


def test_slow_decoding_against_the_agents_tpot_throttles():
    statera = Statera(frag=0.0, period=0.5, window=1)
    d, t = decode_slowly(statera)
    d.arrive(fa.Request("late", SLOW, "m", 10, 10, t), t)
    state = statera.states["m"]
    assert state.tpot_ratio == pytest.approx(2.0, rel=0.05)
    assert state.utilisation > statera.band[1]
    assert d.model("m").slot_limit < 8


def test_a_model_with_nothing_running_always_takes_the_next_request():
    statera = Statera(frag=0.0)
    d = make(statera, slots=4, budget=1000)
    m = d.model("m")
    m.slot_limit, m.budget_limit = 1, 1  # as tight as the loops could ever make it
    statera.states["m"].slots, statera.states["m"].budget = 1.0, 1.0
    d.arrive(req("first", max_tokens=500), 0.0)
    assert m.running == 1
    d.arrive(req("second", max_tokens=5), 0.0)
    assert m.running == 1  # the tightened limits hold while something runs
    d.progress("first", 1, 0.01)
    d.finish("first", 0.01)
    assert m.running == 1 and d.ticket("second").dispatched is not None


@given(
    st.lists(st.tuples(st.integers(1, 200), st.integers(1, 300), st.integers(1, 300), st.sampled_from(["a", "b"]),
                       st.sampled_from(["finish", "cancel", "fail"])), min_size=1, max_size=60),
    st.sampled_from(["fcfs", "hmfs", "vtc", "sjf", "edf"]),
    st.integers(1, 6),
    st.sampled_from([1, 16]),
)
@settings(max_examples=60, deadline=None)
def test_no_slot_or_token_leaks_and_every_request_ends_once(items, policy, slots, block):
    """Any policy, any mix of outcomes: the fence never leaks and never starves a model."""
    statera = Statera(period=0.01, window=2)
    d = make(statera, slots=slots, budget=2000, max_model_len=1000, policy=policy, block=block)
    ended, now = [], 0.0
    for i, (prompt, max_tokens, out, app, how) in enumerate(items):
        now += 0.003
        who = A if app == "a" else B
        if prompt + max_tokens > 1000:
            continue
        ended += d.arrive(fa.Request(f"r{i}", who, "m", prompt, max_tokens, now), now).ended
        outputs = {f"r{i}": (min(out, max_tokens), how)}
        for t in [t for t in d.tickets() if t.dispatched is not None]:
            rid = t.request.id
            o, h = outputs.get(rid, (min(out, t.request.max_tokens), how))
            now += 0.002
            if t.produced < o:
                d.progress(rid, o - t.produced, now)
            ended += (d.finish(rid, now) if h == "finish" else d.end(rid, fa.Outcome.CANCELLED if h == "cancel"
                                                                     else fa.Outcome.FAILED, now)).ended
    while d.tickets():
        m = d.model("m")
        assert m.running >= 1  # work-conserving: waiting requests never leave it idle
        for t in [t for t in d.tickets() if t.dispatched is not None]:
            now += 0.002
            d.progress(t.request.id, 1, now)
            ended += d.finish(t.request.id, now).ended
    m = d.model("m")
    assert (m.running, m.reserved, m.used, d.pool_running) == (0, 0, 0, 0)
    ids = [t.request.id for t in ended]
    assert len(ids) == len(set(ids))
    state = statera.states["m"]
    assert 1 <= m.slot_limit <= slots
    assert state.budget_max is not None and statera.min_budget * state.budget_max <= state.budget <= state.budget_max


def test_the_fairness_bound_drops_the_token_budget_under_admission():
    plain, statera = make(None, slots=8, budget=500), make(Statera(), slots=8, budget=500)
    assert statera.bound(400) > plain.bound(400)


# -- through the arbiter and the configuration -------------------------------------------


async def test_the_arbiter_serves_under_statera_with_any_policy():
    from fairagents.testing import FakeEngine

    for policy in ("hmfs", "edf", "adaptive"):
        arbiter = fa.Arbiter(policy=policy, admission="statera", in_flight=4, token_budget=600)
        arbiter.add_model("chat", FakeEngine(tokens_per_reply=5))
        app = arbiter.app("a")
        async with arbiter:
            bot = app.agent("bot")
            hello = [{"role": "user", "content": "hello"}]
            replies = []
            for _ in range(3):
                replies += await asyncio.gather(*(arbiter.chat("chat", hello, agent=bot, max_tokens=100)
                                                  for _ in range(8)))
        assert all(r.usage.completion_tokens == 5 for r in replies)
        assert arbiter.admission.calibrated >= 16  # learned after the first round
        assert arbiter.admission.covered == arbiter.admission.calibrated  # always 5 tokens: always covered


def test_the_configuration_names_it():
    from fairagents.server.config import Config, build_arbiter
    from fairagents.testing import FakeEngine

    config = Config.model_validate({"admission": {"epsilon": 0.2}, "server": {"auth": False}})
    arbiter = build_arbiter(config, engines={"chat": FakeEngine()})
    assert isinstance(arbiter.admission, Statera) and arbiter.admission.epsilon == 0.2
    assert build_arbiter(Config.model_validate({"server": {"auth": False}}), engines={"chat": FakeEngine()}).admission is None
    with pytest.raises(ValueError, match="band"):
        Config.model_validate({"admission": {"band": [0.9, 0.5]}})


# -- in the simulator --------------------------------------------------------------------


def sim_engines(kv="paged", capacity=4000, running=16):
    return {"m": fa.engines.SimEngine(PROFILE, max_running=running, kv_capacity=capacity, kv=kv)}


def generous(seed=0, n=150, heavy=False):
    """Two apps whose callers ask max_tokens=800 and use 20–60 tokens (a heavy tail if ``heavy``)."""
    from fairagents.simulation import SimRequest, Workload

    rng = random.Random(seed)
    work = Workload(seed=seed)
    for i in range(n):
        out = rng.randint(20, 60) if not heavy or rng.random() > 0.1 else rng.randint(400, 800)
        work.add(SimRequest(i * 0.01, A if i % 3 else B, "m", rng.randint(50, 150), out, max_tokens=800))
    return work


def test_the_simulator_needs_paged_engines_for_it():
    from fairagents.simulation import simulate

    with pytest.raises(fa.InvalidParameterError, match="kv='paged'"):
        simulate(generous(n=3), "hmfs", sim_engines(kv="reserve"), admission="statera")


def test_in_the_simulator_it_runs_more_at_once_and_keeps_every_request_whole():
    from fairagents.simulation import simulate

    work = generous()
    off = simulate(work, "hmfs", sim_engines())
    on = simulate(work, "hmfs", sim_engines(), admission="statera")
    assert on.end < off.end * 0.8  # worst case: 4 of 16 slots fit the KV; calibrated: the batch fills
    planned = {f"r{i}": item.output_tokens for i, item in enumerate(work.requests)}
    for result in (off, on):
        assert len(result.records) == len(work.requests)
        assert all(r.outcome is fa.Outcome.FINISHED and r.output_tokens == planned[r.id] for r in result.records)
    assert off.preemptions == 0
    assert on.admission is not None and on.admission.calibrated >= len(work.requests) - 10
    assert on.max_app_gap() <= 2 * on.bound


def test_a_heavy_tail_beyond_the_bound_is_preempted_and_still_completes():
    from fairagents.simulation import simulate

    work = generous(seed=3, n=300, heavy=True)
    result = simulate(work, "fcfs", sim_engines(capacity=3000), admission=Statera(epsilon=0.2, frag=0.0))
    assert result.preemptions > 0  # ε = 0.2 with a 10 % tail: the engine ran out and preempted
    assert len(result.records) == 300 and all(r.outcome is fa.Outcome.FINISHED for r in result.records)
    assert result.admission.covered / result.admission.calibrated >= 0.75


def test_bench_admission_reports_both_modes():
    from fairagents.bench import admission

    result = admission.run(["hmfs"], seconds=10.0)
    rows = result["hmfs"]
    assert set(rows) == {"off", "statera"}
    for row in rows.values():
        assert {"slo_attainment", "goodput", "ttft_p99", "gap_over_2u", "esg", "makespan", "preemptions",
                "coverage"} <= set(row)
    assert rows["off"]["coverage"] is None and 0 < rows["statera"]["coverage"] <= 1
    assert len(admission.render(result).rows) == 2


def test_a_slowdown_that_has_passed_does_not_keep_the_model_throttled():
    d, t = decode_slowly(Statera(frag=0.0, period=0.5, window=1))
    for i in range(4):
        d.finish(f"s{i}", t)
    assert d.model("m").slot_limit < 8
    for k in range(40):  # plain requests without a TPOT objective, one after another
        t += 0.1
        d.arrive(req(f"p{k}", prompt=10, max_tokens=20, arrival=t), t)
        d.progress(f"p{k}", 5, t)
        d.finish(f"p{k}", t)
    assert d.model("m").slot_limit == 8  # no TPOT samples: the stale ratio is gone, the limit recovers
