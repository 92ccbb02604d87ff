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


# Workflow runs: stages in order, fan-outs together, every run finishes.

from collections import defaultdict  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fairagents.simulation import Call, Shape, Workflows, simulate_workflows  # noqa: E402

NEWS = fa.App("news")


def stages_of(result):
    """run id → stage → the records of its calls."""
    out = defaultdict(lambda: defaultdict(list))
    for r in result.records:
        run, call = r.id.split("/")
        out[run][int(call.split(".")[0])].append(r)
    return out


def test_a_chains_stages_run_in_order():
    chain = Shape.chain(fa.Agent("bot", NEWS), "m", 6, prompt=(8, 32), output=(2, 8))
    other = Shape.chain(fa.Agent("job", fa.App("batch")), "m", prompt=64, output=32, label="long")
    flows = Workflows(seed=3).users(chain, n=4, until=2.0).users(other, n=4, until=2.0)
    result = simulate_workflows(flows, "hmfs", engines(max_running=3))
    runs = stages_of(result)
    assert {r.label for r in result.runs} == {"chain6", "long"}
    for record in result.runs:
        stages = runs[record.id]
        assert sorted(stages) == list(range(record.calls)) if record.label == "chain6" else [0]
        assert min(r.arrival for r in stages[0]) == record.start
        for k in range(1, len(stages)):
            assert min(r.arrival for r in stages[k]) >= max(r.finished for r in stages[k - 1])
        assert max(r.finished for r in stages[len(stages) - 1]) == record.end


def test_fan_out_calls_of_a_stage_arrive_together_and_the_join_waits_for_all():
    fan = Shape.fanout(fa.Agent("writer", NEWS), fa.Agent("editor", NEWS), "m", 5, prompt=(8, 32), output=(2, 12),
                       entry=fa.Agent("desk", NEWS))
    result = simulate_workflows(Workflows(seed=1).users(fan, n=3, until=1.0), "fcfs", engines(max_running=4))
    assert result.runs
    for run, stages in stages_of(result).items():
        entry, branches, join = stages[0], stages[1], stages[2]
        assert [len(entry), len(branches), len(join)] == [1, 5, 1]
        assert len({r.arrival for r in branches}) == 1
        assert branches[0].arrival == entry[0].finished
        assert join[0].arrival == max(r.finished for r in branches)
        assert {r.agent for r in branches} == {"writer"} and join[0].agent == "editor"


def test_runs_record_their_calls_service_and_user():
    flows = Workflows().users(Shape.chain(fa.Agent("bot", NEWS), "m", 2, prompt=10, output=4), n=2, until=0.5,
                              think=0.1).run(Shape.chain(fa.Agent("bot", NEWS), "m", prompt=10, output=4), at=0.2)
    result = simulate_workflows(flows, "fcfs", engines())
    opened = [r for r in result.runs if r.user is None]
    assert [(r.id, r.start, r.calls) for r in opened] == [("o0", 0.2, 1)]
    assert all(r.service == (10 + 2 * 4) * r.calls and r.end > r.start for r in result.runs)  # every call charged
    assert {r.user for r in result.runs} == {None, "news0.0", "news0.1"}
    by_user = defaultdict(list)
    for r in result.runs:
        by_user[r.user].append(r)
    for user, runs in by_user.items():
        if user is not None:
            runs.sort(key=lambda r: r.start)
            assert all(b.start == pytest.approx(a.end + 0.1) for a, b in zip(runs, runs[1:]))
            assert runs[-1].end + 0.1 >= 0.5  # no run started after until


def test_every_policy_plays_the_same_runs():
    mix = [(0.5, Shape.chain(fa.Agent("bot", NEWS), "m", 2, prompt=(1, 40), output=(1, 9))),
           (0.5, Shape.fanout(fa.Agent("w", NEWS), fa.Agent("e", NEWS), "m", 3, prompt=(1, 40), output=(1, 9)))]
    flows = Workflows(seed=5).users(mix, n=3, until=1.0)
    a, b = (simulate_workflows(flows, p, engines(max_running=2)) for p in ("fcfs", "hmfs"))
    shapes = [{r.id: (r.label, r.calls) for r in x.runs} for x in (a, b)]
    lengths = [{r.id: (r.prompt_tokens, r.output_tokens) for r in x.records} for x in (a, b)]
    assert all(shapes[0][k] == shapes[1][k] for k in shapes[0].keys() & shapes[1].keys())
    assert all(lengths[0][k] == lengths[1][k] for k in lengths[0].keys() & lengths[1].keys())
    assert len(shapes[0].keys() & shapes[1].keys()) >= 6


def test_workflows_beside_an_open_loop_workload():
    work = Workload().burst(WHO, "m", n=4, prompt=10, output=4)
    flows = Workflows().run(Shape.chain(fa.Agent("bot", NEWS), "m", 3, prompt=10, output=4))
    result = simulate_workflows(flows, "hmfs", engines(max_running=2), workload=work)
    assert len(result.records) == 7 and len(result.runs) == 1
    assert simulate(work, "hmfs", engines(max_running=2)).runs == []


def test_bad_workflows_are_refused_before_anything_runs():
    bot = fa.Agent("bot", NEWS)
    with pytest.raises(fa.errors.UnknownModelError):
        simulate_workflows(Workflows().run(Shape.chain(bot, "nope", prompt=1, output=1)), "fcfs", engines())
    with pytest.raises(fa.errors.ContextLengthError):
        simulate_workflows(Workflows().run(Shape.chain(bot, "m", prompt=(1, 9000), output=1)), "fcfs", engines())
    with pytest.raises(fa.errors.InvalidParameterError):
        Shape("mixed", ((Call(bot, "m", 1, 1), Call(fa.Agent("x", fa.App("other")), "m", 1, 1)),))
    with pytest.raises(fa.errors.InvalidParameterError):
        Call(bot, "m", prompt=1, output=0)
    with pytest.raises(fa.errors.InvalidParameterError):
        Workflows().users(Shape.chain(bot, "m", prompt=1, output=1), n=0, until=1.0)


lengths = st.one_of(st.integers(1, 40), st.tuples(st.integers(1, 20), st.integers(20, 40)))
calls = st.builds(lambda agent, prompt, output: (agent, prompt, output), st.sampled_from(["a", "b"]), lengths,
                  st.integers(1, 12))
shapes = st.lists(st.lists(calls, min_size=1, max_size=4), min_size=1, max_size=3)


@settings(deadline=None)
@given(
    apps=st.lists(st.tuples(st.lists(shapes, min_size=1, max_size=2), st.integers(1, 3),
                            st.floats(0.0, 0.05), st.floats(0.1, 0.4)), min_size=1, max_size=3),
    opened=st.lists(st.tuples(shapes, st.floats(0.0, 0.5)), max_size=3),
    policy=st.sampled_from(["fcfs", "hmfs", "hmfs_runs"]),
    slots=st.integers(1, 4),
)
def test_every_run_finishes(apps, opened, policy, slots):
    def shape(app, stages):
        return Shape("s", tuple(tuple(Call(fa.Agent(agent, app), "m", prompt, output)
                                      for agent, prompt, output in stage) for stage in stages))

    flows = Workflows(seed=1)
    for i, (mix, n, think, until) in enumerate(apps):
        app = fa.App(f"app{i}", weight=1.0 + i)
        flows.users([(1.0, shape(app, s)) for s in mix], n=n, until=until, think=think)
    for stages, at in opened:
        flows.run(shape(fa.App("open"), stages), at=at)
    result = simulate_workflows(flows, policy, engines(max_running=slots, kv_capacity=256))
    assert all(r.outcome is fa.Outcome.FINISHED for r in result.records)
    assert len(result.records) == sum(r.calls for r in result.runs)
    assert {r.id for r in result.runs} >= {f"o{i}" for i in range(len(opened))}
    groups = flows.user_names()
    last: dict[str, float] = {}
    for r in result.runs:
        assert r.end >= r.start and r.service > 0
        if r.user is not None:
            last[r.user] = max(last.get(r.user, 0.0), r.end)
    for group, name in groups:  # every user ran until its last run ended past until
        assert last[name] + group.think >= group.until


@pytest.mark.parametrize("policy", ["fcfs", "hmfs", "hmfs_runs"])
def test_a_fan_out_is_dispatched_at_once_before_a_later_run_when_the_batch_has_room(policy):
    fan = Shape.fanout(fa.Agent("worker", NEWS), fa.Agent("join", NEWS), "m", 6, prompt=(8, 32), output=(2, 8))
    ask = Shape.chain(fa.Agent("worker", NEWS), "m", prompt=(8, 32), output=(2, 8), label="ask")
    flows = Workflows(seed=2).run(fan, at=0.0).run(ask, at=0.0001)
    result = simulate_workflows(flows, policy, engines(max_running=8))
    fan_id = next(r.id for r in result.runs if r.label == "fanout6")
    branches = [r for r in result.records if r.run == fan_id and r.agent == "worker"]
    (later,) = [r for r in result.records if r.run != fan_id]
    assert len(branches) == 6 and len({r.dispatched for r in branches}) == 1  # together
    assert later.dispatched >= branches[0].dispatched  # not before them, nor between


@pytest.mark.parametrize("policy", ["hmfs", "hmfs_runs"])
def test_apps_share_by_weight_while_their_runs_keep_them_backlogged(policy):
    from fairagents.bench.workflows import run_scenario

    shares = {app: s["share"] for app, s in run_scenario("weighted", policy, seconds=20.0)["apps"].items()}
    assert shares["gold"] == pytest.approx(2 / 3, abs=0.03) and shares["silver"] == pytest.approx(1 / 3, abs=0.03)


# -- devices: several engines of one device take one order ---------------------------------------------------------


def _two_engine_load(devices):
    """App a keeps 'chat' and 'image' busy, app b only 'chat' (one request at a time each): service by (app, model)."""
    engines = {m: SimEngine(fa.ModelProfile(d_model=4096, n_layers=1), max_running=1, kv_capacity=400)
               for m in ("chat", "image")}
    a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
    work = Workload(seed=1)
    work.burst(a, "chat", n=200, prompt=20, output=10).burst(a, "image", n=200, prompt=20, output=10)
    work.burst(b, "chat", n=200, prompt=20, output=10)
    result = simulate(work, "hmfs", engines, devices=devices)
    until = 0.5 * result.end  # all three bursts still backlogged
    served = {}
    for c in result.charges:
        if c.time <= until:
            served[(c.app, c.model)] = served.get((c.app, c.model), 0.0) + c.amount
    return result, served


def test_engines_of_one_device_take_one_order_and_separate_devices_do_not_interfere():
    one, served = _two_engine_load({"chat": "gpu", "image": "gpu"})
    a = served[("a", "chat")] + served.get(("a", "image"), 0.0)
    assert a == pytest.approx(served[("b", "chat")], rel=0.02)  # a's images count in its share of the device
    apart, served = _two_engine_load({"chat": "gpu0", "image": "gpu1"})
    assert one.end > 1.4 * apart.end  # one device runs one engine's step at a time; two run theirs in parallel
    assert served[("a", "chat")] == pytest.approx(served[("b", "chat")], rel=0.02)  # images cost a nothing on chat
    chat = served[("a", "chat")] + served[("b", "chat")]
    assert served[("a", "image")] == pytest.approx(chat, rel=0.05)  # the image engine never idles, as the LLM
    assert one.idle_with_backlog == apart.idle_with_backlog == 0 and len(one.records) == len(apart.records) == 600
    with pytest.raises(fa.InvalidParameterError, match="devices must name the device of every model"):
        _two_engine_load({"chat": "gpu"})


@settings(max_examples=30, deadline=None)
@given(
    demand=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["m0", "m1", "m2"]),
                              st.integers(1, 60), st.integers(1, 20)),
                    min_size=2, max_size=6, unique_by=lambda d: (d[0], d[1])),
    slots=st.lists(st.integers(1, 3), min_size=3, max_size=3),
)
def test_a_device_of_several_engines_keeps_backlogged_apps_within_2U(demand, slots):
    from fairagents.metrics import max_service_gap

    engines = {f"m{i}": SimEngine(fa.ModelProfile(d_model=2048, n_layers=2), max_running=n, kv_capacity=400)
               for i, n in enumerate(slots)}
    work = Workload(seed=3)
    for app, model, prompt, output in demand:
        work.burst(fa.Agent("t", fa.App(app)), model, n=30, prompt=prompt, output=output)
    result = simulate(work, "hmfs", engines, devices=dict.fromkeys(engines, "gpu"))
    assert result.idle_with_backlog == 0 and len(result.records) == len(work)  # no idle engine holds a runnable one
    weights = result.app_weights()
    assert max_service_gap(result.records, result.charges, weights, "app") <= 2 * result.bound * (1 + 1e-9)


# -- the default path: engines that schedule by their device's seat of the policy ---------------------------------


def _fair_engines(slots, kv="reserve", schedulers=("fair", "fair", "fair")):
    return {f"m{i}": SimEngine(fa.ModelProfile(d_model=2048, n_layers=2), max_running=n, kv_capacity=400,
                               scheduler=scheduler, kv=kv if scheduler == "fair" else "reserve")
            for i, (n, scheduler) in enumerate(zip(slots, schedulers, strict=True))}


@settings(max_examples=30, deadline=None)
@given(
    demand=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["x", "y"]),
                              st.sampled_from(["m0", "m1", "m2"]), st.integers(1, 60), st.integers(1, 20),
                              st.sampled_from([0.0, 0.0, 0.5, 2.0])),
                    min_size=2, max_size=8, unique_by=lambda d: (d[0], d[1], d[2])),
    slots=st.lists(st.integers(1, 3), min_size=3, max_size=3),
    kv=st.sampled_from(["reserve", "paged"]),
    schedulers=st.lists(st.sampled_from(["fair", "fair", "vllm"]), min_size=3, max_size=3),
    policy=st.sampled_from(["hmfs", "hmfs_credit"]),
)
def test_in_engine_schedulers_of_one_device_keep_apps_and_agents_within_the_bound_and_never_idle(
    demand, slots, kv, schedulers, policy,
):
    """The default path on one device of three engines: both levels of the hierarchy, and work conservation.

    Engines that schedule themselves beside ones the dispatcher feeds (as the image engine is), in one order;
    bursts that start later bring apps back from idle: apps within ``2U`` (``3U`` with the idle credit),
    agents of an app within ``2U``.
    """
    from fairagents.metrics import max_service_gap

    engines = _fair_engines(slots, kv, schedulers)
    work = Workload(seed=3)
    for app, agent, model, prompt, output, at in demand:
        work.burst(fa.Agent(agent, fa.App(app)), model, n=30, at=at, prompt=prompt, output=output)
    result = simulate(work, policy, engines, devices=dict.fromkeys(engines, "gpu"))
    assert result.idle_with_backlog == 0  # no engine idles holding a request it may run
    assert len(result.records) == len(work) and all(r.outcome is fa.Outcome.FINISHED for r in result.records)
    units = 3 if policy == "hmfs_credit" else 2
    assert max_service_gap(result.records, result.charges, result.app_weights(), "app") <= units * result.bound * (
        1 + 1e-9)
    assert max_service_gap(result.records, result.charges, result.agent_weights(), "agent") <= 2 * result.bound * (
        1 + 1e-9)


@settings(max_examples=20, deadline=None)
@given(
    mine=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 40), st.integers(1, 12)), min_size=1,
                  max_size=4),
    theirs=st.lists(st.tuples(st.sampled_from(["a", "c"]), st.integers(1, 40), st.integers(1, 12)), min_size=1,
                    max_size=4),
    scheduler=st.sampled_from(["fair", "vllm"]),
)
def test_separate_devices_are_independent(mine, theirs, scheduler):
    """What one device serves, and when, does not change with the load on another device (apps in both included)."""

    def run(with_theirs):
        engines = {m: SimEngine(fa.ModelProfile(d_model=2048, n_layers=2), max_running=2, kv_capacity=300,
                                scheduler=scheduler) for m in ("chat", "image")}
        work = Workload(seed=5)
        for app, prompt, output in mine:
            work.burst(fa.Agent("t", fa.App(app)), "chat", n=10, prompt=prompt, output=output)
        if with_theirs:
            for app, prompt, output in theirs:
                work.burst(fa.Agent("t", fa.App(app)), "image", n=10, prompt=prompt, output=output, at=0.01)
        result = simulate(work, "hmfs", engines, devices={"chat": "gpu0", "image": "gpu1"})
        return [(c.time, c.app, c.amount) for c in result.charges if c.model == "chat"]

    assert run(True) == run(False)


def test_the_default_path_preempts_for_a_client_owed_service_and_the_dispatcher_path_does_not():
    flood, late = fa.Agent("t", fa.App("flood")), fa.Agent("t", fa.App("late"))
    work = Workload(seed=1).burst(flood, "m", n=40, prompt=16, output=200).burst(late, "m", n=4, prompt=16, output=4,
                                                                                 at=0.05)
    first = {}
    for scheduler in ("fair", "vllm"):
        result = simulate(work, "hmfs", {"m": SimEngine(PROFILE, max_running=4, scheduler=scheduler)})
        first[scheduler] = min(r.first_token for r in result.records if r.app == "late")
        assert (result.fair_preemptions > 0) == (scheduler == "fair")
        assert len(result.records) == 44 and result.idle_with_backlog == 0
    assert first["fair"] < 0.1 < first["vllm"]  # the late app does not wait for a flood's request to end


def test_engines_that_schedule_themselves_refuse_the_dispatchers_admission_options():
    work = Workload().burst(WHO, "m", n=1, prompt=1, output=1)
    for option in ({"pool_running": 2}, {"admission": "statera"}):
        with pytest.raises(fa.InvalidParameterError, match="scheduler='fair'"):
            simulate(work, "hmfs", engines(scheduler="fair", kv="paged"), **option)
