import pytest

import fairagents as fa
from fairagents.engines import SimEngine
from fairagents.simulation import SimRequest, Workload, simulate

PROFILE = fa.ModelProfile(d_model=4096, n_layers=1)


def engines(**kwargs):
    return {"m": SimEngine(PROFILE, **kwargs)}


WHO = fa.Agent("t", fa.App("a"))


def test_records_and_charges_add_up():
    work = Workload().burst(WHO, "m", n=5, prompt=10, output=4)
    result = simulate(work, "hmfs", engines(max_running=2))
    assert len(result.records) == 5
    assert all(r.outcome is fa.Outcome.FINISHED and r.output_tokens == 4 for r in result.records)
    assert sum(c.amount for c in result.charges) == 5 * (10 + 2 * 4)
    for r in result.records:
        assert r.arrival <= r.dispatched < r.first_token <= r.finished


def test_deterministic():
    def run():
        work = Workload(seed=7).poisson(WHO, "m", rate=50, until=1.0, prompt=(1, 50), output=(1, 20))
        return simulate(work, "hmfs", engines(jitter=0.3, seed=2)).records

    assert run() == run()


def test_bad_workloads_fail_before_running():
    with pytest.raises(fa.UnknownModelError):
        simulate(Workload().burst(WHO, "x", n=1, prompt=1, output=1), "fcfs", engines())
    with pytest.raises(fa.ContextLengthError):
        simulate(Workload().burst(WHO, "m", n=1, prompt=100, output=10), "fcfs", engines(kv_capacity=64))
    with pytest.raises(fa.UnknownAppError):
        simulate(Workload().burst(WHO, "m", n=1, prompt=1, output=1), "fcfs", engines(), apps={"b": fa.App("b")})
    with pytest.raises(fa.UnknownAgentError):
        simulate(
            Workload().burst(WHO, "m", n=1, prompt=1, output=1), "fcfs", engines(), apps={"a": fa.App("a", weight=2)}
        )
    with pytest.raises(fa.InvalidParameterError):
        simulate(Workload([SimRequest(0.0, WHO, "m", 1, 5, max_tokens=3)]), "fcfs", engines())
    with pytest.raises(fa.InvalidParameterError):
        simulate(Workload(), "nope", engines())


def test_cancel_while_waiting_costs_nothing_and_while_running_only_what_was_produced():
    eng = engines(max_running=1, decode_base=0.01, decode_per_seq=0.0, prefill_per_token=0.0)
    work = Workload(
        [
            SimRequest(0.0, WHO, "m", 10, 100),  # runs 1 s
            SimRequest(0.0, WHO, "m", 10, 5, cancel_at=0.5),  # cancelled while waiting
            SimRequest(0.0, fa.Agent("u", fa.App("b")), "m", 10, 100, cancel_at=1.055),  # cancelled mid-run
        ]
    )
    result = simulate(work, "hmfs", eng)
    by_id = {r.id: r for r in result.records}
    assert by_id["r1"].outcome is fa.Outcome.CANCELLED and by_id["r1"].dispatched is None
    assert by_id["r2"].outcome is fa.Outcome.CANCELLED and 0 < by_id["r2"].output_tokens < 100
    charged_b = sum(c.amount for c in result.charges if c.app == "b")
    assert charged_b == 10 + 2 * by_id["r2"].output_tokens
    assert result.idle_with_backlog == 0


def test_hmfs_protects_a_victim_that_fcfs_starves():
    flood, victim = fa.Agent("t", fa.App("flood")), fa.Agent("t", fa.App("victim"))
    work = Workload(seed=3).burst(flood, "m", n=200, prompt=(50, 100), output=(10, 40))
    work.poisson(victim, "m", rate=5, until=5.0, prompt=(50, 100), output=(10, 40))

    def victim_p99_wait(policy):
        stats = {s.name: s for s in simulate(work, policy, engines(max_running=4)).app_stats()}
        return stats["victim"].wait_p99

    assert victim_p99_wait("hmfs") < victim_p99_wait("fcfs") / 5


def test_an_app_past_its_max_queued_has_its_arrivals_refused_and_counted():
    flood, other = fa.Agent("t", fa.App("flood")), fa.Agent("t", fa.App("other"))
    work = Workload().burst(flood, "m", n=10, prompt=10, output=4).burst(other, "m", n=10, prompt=10, output=4)
    result = simulate(work, "fcfs", engines(max_running=2), max_queued={"flood": 3})
    # two run at once, three wait: the other five flood arrivals are refused; the unbounded app queues all ten
    assert result.rejected == {("flood", "t"): 5}
    stats = {s.name: s for s in result.app_stats()}
    assert (stats["flood"].done, stats["flood"].rejected) == (5, 5)
    assert (stats["other"].done, stats["other"].rejected) == (10, 0)
    assert [s.rejected for s in result.agent_stats()] == [5, 0]
    assert len(result.records) == 15 and result.idle_with_backlog == 0
    with pytest.raises(fa.InvalidParameterError):
        simulate(work, "fcfs", engines(), max_queued={"flood": 0})


def test_workload_builders():
    work = Workload(seed=1).burst(WHO, "m", n=3, at=2.0, prompt=(1, 5), output=2)
    assert [r.at for r in work.requests] == [2.0] * 3
    assert all(1 <= r.prompt_tokens <= 5 for r in work.requests)
    with pytest.raises(fa.InvalidParameterError):
        Workload().poisson(WHO, "m", rate=0, until=1.0, prompt=1, output=1)


def test_slo_attainment_is_reported():
    fast = fa.Agent("t", fa.App("a"), slo=fa.SLO(ttft=0.001))
    result = simulate(Workload().burst(fast, "m", n=3, prompt=10, output=2), "fcfs", engines(max_running=1))
    (stats,) = result.agent_stats()
    assert stats.slo_attainment == 0.0


def peak_running(records):
    events = sorted([(r.dispatched, 1) for r in records if r.dispatched is not None] + [(r.finished, -1) for r in records
                                                                                       if r.dispatched is not None])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def two_models(**kwargs):
    return {m: SimEngine(PROFILE, max_running=4, **kwargs) for m in ("m", "n")}


def test_pool_running_bounds_requests_across_engines_and_is_validated():
    b = fa.Agent("t", fa.App("b"))
    work = Workload().burst(WHO, "m", n=20, prompt=10, output=(1, 9)).burst(b, "n", n=20, prompt=10, output=(1, 9))
    alone = simulate(work, "hmfs", two_models(max_model_len=64))
    pooled = simulate(work, "hmfs", two_models(max_model_len=64), pool_running=3)
    assert peak_running(alone.records) == 8 and peak_running(pooled.records) == 3
    assert len(pooled.records) == 40 and pooled.idle_with_backlog == 0
    assert pooled.bound < alone.bound
    for bad in (0, 1.5, True):
        with pytest.raises(fa.InvalidParameterError):
            simulate(work, "hmfs", two_models(), pool_running=bad)


def test_a_slot_given_to_a_busy_engine_waits_for_its_step_and_cancelling_frees_it():
    b = fa.Agent("t", fa.App("b"))
    work = Workload()
    work.add(SimRequest(0.0, WHO, "m", 10, 1))  # r0: done after one step of 'm'
    work.add(SimRequest(0.0, b, "n", 10, 50))  # r1: keeps 'n' busy
    work.add(SimRequest(0.001, b, "n", 10, 2, cancel_at=0.005))  # r2: gets r0's slot mid-step of 'n'
    work.add(SimRequest(0.002, WHO, "m", 10, 2))  # r3: waits for a slot
    models = {"m": SimEngine(PROFILE, decode_base=0.004), "n": SimEngine(PROFILE, decode_base=0.003)}
    result = simulate(work, "fcfs", models, pool_running=2)
    r = {rec.id: rec for rec in result.records}
    r0_done = r["r0"].finished
    assert r["r2"].dispatched == r0_done and r["r2"].first_token is None  # reserved, not yet in the batch
    assert r["r2"].outcome is fa.Outcome.CANCELLED and r["r2"].output_tokens == 0
    assert r["r3"].dispatched == 0.005  # the cancelled reservation's slot, at once
    assert peak_running(result.records) <= 2
