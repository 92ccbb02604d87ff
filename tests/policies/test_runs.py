"""HMFSRuns: runs share their app by attained service, a stage's calls go together, and nothing starves."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fairagents as fa
from fairagents.policies import HMFSRuns

PROFILE = fa.ModelProfile(d_model=4096, n_layers=1)


def policy(**kwargs):
    return HMFSRuns(fa.UnifiedTokenCost({"m": PROFILE}), **kwargs)


def request(i, who, run, at, prompt=10):
    return fa.Request(str(i), who, "m", prompt, 4, at, run=run)


def drain(p, now, finish=True):
    """Dispatch (and finish) what waits, one at a time; the order."""
    order = []
    while (r := p.select("m", now)) is not None:
        p.on_dispatch(r, now)
        if finish:
            p.on_finish(r, fa.Outcome.FINISHED, now)
        order.append(r)
    return order


def test_a_run_that_received_more_goes_after_runs_that_received_less():
    p = policy()
    app = fa.App("a")
    writer = fa.Agent("w", app)
    p.on_arrival(request("big", writer, "long", 0.0, prompt=100), 0.0)
    p.on_arrival(request("small", writer, "short", 0.0, prompt=10), 0.0)
    assert [r.id for r in drain(p, 0.0, finish=False)] == ["big", "small"]  # equal tags: arrival order
    p.on_arrival(request("long-2", writer, "long", 1.0), 1.0)
    p.on_arrival(request("short-2", writer, "short", 1.0), 1.0)
    assert [r.id for r in drain(p, 1.0)] == ["short-2", "long-2"]
    assert p.run_tags("a")["long"] > p.run_tags("a")["short"]


def test_agent_weights_scale_what_a_call_costs_its_run():
    p = policy()
    app = fa.App("a")
    heavy, light = fa.Agent("heavy", app, weight=4.0), fa.Agent("light", app)
    p.on_arrival(request(1, heavy, "h", 0.0), 0.0)
    p.on_arrival(request(2, light, "l", 0.0), 0.0)
    drain(p, 0.0, finish=False)
    assert p.run_tags("a") == {"h": 2.5, "l": 10.0}


def test_apps_share_by_weight_as_in_hmfs():
    p = policy()
    big, small = fa.App("big", weight=3.0), fa.App("small")
    for i in range(40):
        p.on_arrival(request(f"b{i}", fa.Agent("x", big), f"rb{i}", 0.0), 0.0)
        p.on_arrival(request(f"s{i}", fa.Agent("x", small), f"rs{i}", 0.0), 0.0)
    first = [r.app for r in drain(p, 0.0)[:20]]
    assert first.count("big") == 15 and first.count("small") == 5


def test_requests_without_a_run_are_runs_of_their_own_and_are_forgotten():
    p = policy()
    who = fa.Agent("x", fa.App("a"))
    for i in range(5):
        p.on_arrival(request(i, who, None, 0.0), 0.0)
    drain(p, 0.0)
    assert p.run_tags("a") == {}


def test_idle_runs_are_forgotten_after_run_memory_and_past_max_runs():
    p = policy(run_memory=10.0, max_runs=3)
    who = fa.Agent("x", fa.App("a"))
    for i in range(3):
        p.on_arrival(request(i, who, f"r{i}", float(i)), float(i))
        drain(p, float(i))
    assert set(p.run_tags("a")) == {"r0", "r1", "r2"}
    p.on_arrival(request(9, who, "r9", 3.0), 3.0)  # a fourth: the longest idle goes
    assert set(p.run_tags("a")) == {"r1", "r2", "r9"}
    drain(p, 3.0)
    p.on_arrival(request(10, who, "r10", 20.0), 20.0)  # the rest idle for more than run_memory
    assert set(p.run_tags("a")) == {"r10"}


def test_bad_settings_are_refused():
    with pytest.raises(fa.InvalidParameterError):
        policy(run_memory=0)
    with pytest.raises(fa.InvalidParameterError):
        policy(max_runs=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 60), min_size=1, max_size=5), st.integers(1, 400))
def test_a_fan_out_cannot_hold_the_app_while_another_run_waits(widths, prompt):
    """A run arriving behind fan-outs waits at most about one call of each run ahead of it."""
    p = policy()
    who = fa.Agent("worker", fa.App("a"))
    for k, width in enumerate(widths):
        for j in range(width):
            p.on_arrival(request(f"{k}.{j}", who, f"fan{k}", float(k), prompt), float(k))
    p.on_arrival(request("late", who, "late", 99.0, prompt), 99.0)
    order = [r.id for r in drain(p, 99.0, finish=False)]
    assert order.index("late") <= len(widths)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 300)), min_size=2, max_size=40))
def test_a_run_that_received_less_goes_first(calls):
    """Between two runs waiting at once, the one whose tag (service asked so far) is lower goes first."""
    p = policy()
    who = fa.Agent("worker", fa.App("a"))
    for i, (run, prompt) in enumerate(calls):
        p.on_arrival(request(i, who, f"r{run}", 0.0, prompt), 0.0)
    tags = []
    while (r := p.select("m", 0.0)) is not None:
        tags.append(p._tag[r.id])
        p.on_dispatch(r, 0.0)
    assert tags == sorted(tags)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(50, 400))
def test_a_long_run_finishes_under_an_endless_stream_of_new_short_runs(seed, flood):
    """Aging: the long run's next call waits a bounded number of dispatches, however many new runs come."""
    import random

    rng = random.Random(seed)
    p = policy()
    app = fa.App("a")
    who = fa.Agent("x", app)
    p.on_arrival(request("L0", who, "long", 0.0, prompt=2000), 0.0)
    drain(p, 0.0)  # the long run has received 2000
    p.on_arrival(request("L1", who, "long", 1.0), 1.0)
    waited = 0
    for i in range(flood):  # one new short run arrives per dispatch: the queue never empties
        p.on_arrival(request(f"s{i}", who, f"s{i}", 1.0, prompt=rng.randint(5, 50)), 1.0)
        r = p.select("m", 1.0)
        p.on_dispatch(r, 1.0)
        p.on_finish(r, fa.Outcome.FINISHED, 1.0)
        if r.id == "L1":
            break
        waited += 1
    else:
        pytest.fail(f"the long run waited through {flood} new runs")
    assert waited <= 2000 / 5 + 2  # until the new runs, one at a time, received what it had


@settings(max_examples=40, deadline=None)
@given(st.integers(3, 120), st.integers(1, 3), st.integers(1, 800))
def test_streamed_output_does_not_push_a_new_run_behind_a_waiting_fan_out(width, running, output):
    """The virtual time ages with the service of running calls, but a new run never starts past a waiting call."""
    p = policy()
    who = fa.Agent("worker", fa.App("a"))
    for j in range(width):
        p.on_arrival(request(f"a{j}", who, "fan", 0.0), 0.0)
    started = []
    for _ in range(min(running, width - 1)):
        r = p.select("m", 0.0)
        p.on_dispatch(r, 0.0)
        started.append(r)
    for r in started:
        p.on_progress(r, output, 1.0)
    p.on_arrival(request("late", who, "late", 2.0), 2.0)
    order = [r.id for r in drain(p, 2.0, finish=False)]
    assert order.index("late") <= 1


def test_calls_withdrawn_while_waiting_leave_nothing_behind():
    p = policy()
    who = fa.Agent("worker", fa.App("a"))
    reqs = [request(i, who, f"r{i % 7}", 0.0) for i in range(1000)]
    for r in reqs:
        p.on_arrival(r, 0.0)
    for r in reqs:
        p.on_finish(r, fa.Outcome.CANCELLED, 1.0)
    assert p._heaps == {} and p._gone == set() and p._tag == {} and p.queued() == 0


def test_a_waiting_fan_out_keeps_its_turns_while_new_runs_keep_coming():
    """New runs go between the fan-out's calls, not ahead of all of them: the fan-out keeps a run's share."""
    p = policy()
    who = fa.Agent("worker", fa.App("a"))
    for j in range(50):
        p.on_arrival(request(f"fan{j}", who, "fan", 0.0), 0.0)
    served, since = 0, 0
    for i in range(400):  # one new short run per dispatch: the queue never empties, and its runs pile up
        p.on_arrival(request(f"new{i}", who, f"new{i}", 1.0), 1.0)
        runs_waiting = len({r.run for r in p.waiting_requests()})
        r = p.select("m", 1.0)
        p.on_dispatch(r, 1.0)
        p.on_finish(r, fa.Outcome.FINISHED, 1.0)
        since = 0 if r.run == "fan" else since + 1
        served += r.run == "fan"
        assert since <= runs_waiting + 2  # its next call waits about one call of each other run waiting
    assert served >= 25


def test_the_heaps_stay_bounded_when_calls_behind_the_first_are_withdrawn():
    p = policy()
    who = fa.Agent("worker", fa.App("a"))
    p.on_arrival(request("first", who, "first", 0.0), 0.0)
    for i in range(5000):
        r = request(f"c{i}", who, f"r{i}", 0.0)
        p.on_arrival(r, 0.0)
        p.on_finish(r, fa.Outcome.CANCELLED, 0.0)
    assert len(p._heaps[("a", "m")]) <= 2 * 1 + 33 and len(p._gone) <= 35


def test_a_withdrawn_call_costs_its_run_nothing():
    p = policy()
    who = fa.Agent("worker", fa.App("a"))
    calls = [request(f"c{j}", who, "run", 0.0) for j in range(10)]
    for r in calls:
        p.on_arrival(r, 0.0)
    for r in reversed(calls):
        p.on_finish(r, fa.Outcome.CANCELLED, 1.0)
    assert p.run_tags("a")["run"] == 0.0
