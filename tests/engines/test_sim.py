import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fairagents as fa
from fairagents.engines import SimEngine
from fairagents.errors import ProtocolError

PROFILE = fa.ModelProfile(d_model=64, n_layers=1)
WHO = fa.Agent("t", fa.App("a"))


def request(i, prompt=10, max_tokens=5):
    return fa.Request(f"r{i}", WHO, "m", prompt, max_tokens, 0.0)


def run_to_end(engine, now=0.0):
    events = []
    while (end := engine.start_step(now)) is not None:
        now = end
        events.append((now, engine.finish_step(now)))
    return events


def test_continuous_batching_one_token_per_step():
    engine = SimEngine(PROFILE, decode_base=0.01, decode_per_seq=0.0, prefill_per_token=0.0)
    engine.admit(request(1), output_tokens=3)
    engine.admit(request(2), output_tokens=1)
    steps = run_to_end(engine)
    assert [round(t, 6) for t, _ in steps] == [0.01, 0.02, 0.03]
    first = {p.request.id: (p.first, p.finished) for p in steps[0][1]}
    assert first == {"r1": (True, False), "r2": (True, True)}
    assert engine.running == 0 and engine.kv_used == 0


def test_step_time_grows_with_batch_and_prefill():
    engine = SimEngine(PROFILE, decode_base=0.01, decode_per_seq=0.002, prefill_per_token=0.001)
    engine.admit(request(1, prompt=10), output_tokens=2)
    engine.admit(request(2, prompt=20), output_tokens=2)
    end = engine.start_step(0.0)
    assert end == pytest.approx(0.01 + 2 * 0.002 + 30 * 0.001)
    engine.finish_step(end)
    assert engine.start_step(end) - end == pytest.approx(0.01 + 2 * 0.002)  # decode only


def test_capacity_slots_and_kv():
    engine = SimEngine(PROFILE, max_running=2, kv_capacity=40)
    assert engine.fits(request(1, prompt=10, max_tokens=10))
    engine.admit(request(1, prompt=10, max_tokens=10), 10)
    assert not engine.fits(request(2, prompt=15, max_tokens=10))  # 20 + 25 > 40
    engine.admit(request(3, prompt=5, max_tokens=5), 5)
    assert not engine.fits(request(4, prompt=1, max_tokens=1))  # no slot
    with pytest.raises(ProtocolError):
        engine.admit(request(4, prompt=1, max_tokens=1), 1)


def test_context_length_is_bad_input():
    engine = SimEngine(PROFILE, kv_capacity=100, max_model_len=50)
    with pytest.raises(fa.ContextLengthError):
        engine.check(request(1, prompt=45, max_tokens=6))
    with pytest.raises(fa.ContextLengthError):
        engine.admit(request(1, prompt=45, max_tokens=6), 1)
    assert engine.running == 0


def test_abort_frees_slot_and_kv():
    engine = SimEngine(PROFILE)
    engine.admit(request(1), 5)
    assert engine.abort("r1") and not engine.abort("r1")
    assert engine.running == 0 and engine.kv_used == 0


def test_requests_join_between_steps_only():
    engine = SimEngine(PROFILE)
    engine.admit(request(1), 5)
    engine.start_step(0.0)
    with pytest.raises(ProtocolError, match="between steps"):
        engine.admit(request(2), 5)


def test_jitter_is_deterministic_under_a_seed():
    def durations(seed):
        engine = SimEngine(PROFILE, jitter=0.5, seed=seed)
        engine.admit(request(1, max_tokens=20), 20)
        return [t for t, _ in run_to_end(engine)]

    assert durations(3) == durations(3)
    assert durations(3) != durations(4)


@pytest.mark.parametrize(
    "kwargs",
    [{"max_running": 0}, {"kv_capacity": -1}, {"jitter": 1.0}, {"decode_base": -0.1}, {"decode_base": 0, "decode_per_seq": 0}],
)
def test_parameters_are_validated(kwargs):
    with pytest.raises(fa.InvalidParameterError):
        SimEngine(PROFILE, **kwargs)


def test_output_tokens_must_fit_max_tokens():
    engine = SimEngine(PROFILE)
    with pytest.raises(fa.InvalidParameterError):
        engine.admit(request(1, max_tokens=5), output_tokens=6)


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 2**64, True, 1.5])
def test_a_seed_outside_64_bits_is_bad_input(seed):
    """An engine seeds a 64-bit generator: a larger seed would overflow inside its step, for every request."""
    from fairagents.engines import GenerationParams

    with pytest.raises(fa.InvalidParameterError, match="seed"):
        GenerationParams(8, seed=seed)
    assert GenerationParams(8, seed=2**63 - 1).seed == 2**63 - 1



# Paged KV: a request holds prompt + generated tokens, waits while it does not fit, and is preempted
# (to be recomputed) when the batch outgrows the cache.


def paged(**kwargs):
    kwargs = {"decode_base": 1.0, "decode_per_seq": 0.0, "prefill_per_token": 0.01, **kwargs}
    return SimEngine(PROFILE, kv="paged", **kwargs)


def drive(engine, admissions, limit=10_000):
    """Run ``engine`` to the end, admitting ``admissions[k]`` (pairs of request and output) before step k.

    Checks the engine's invariants at every step. Returns a record of each step (its batch and
    queue once started, start and end, preemptions it caused) and each request's progress.
    """
    admissions = {k: list(v) for k, v in admissions.items()}
    log, prompt, steps, last_batch, now, k = {}, {}, [], [], 0.0, 0

    def held(rid):
        return prompt[rid] + sum(p.new_tokens for p in log[rid])

    while admissions or engine.running or engine.waiting:
        assert k < limit, "the engine makes no progress"
        for req, output in admissions.pop(k, []):
            engine.admit(req, output)
            log[req.id], prompt[req.id] = [], req.prompt_tokens
        k += 1
        had_work = engine.running + engine.waiting > 0
        preempted_before = engine.preemptions
        end = engine.start_step(now)
        assert (end is None) == (not had_work)  # work-conserving: never idle while requests wait
        if end is None:
            continue
        batch, waiting = engine.running_ids, engine.waiting_ids
        assert len(batch) <= engine.max_running
        assert engine.kv_used == sum(held(r) for r in batch)
        assert engine.kv_used + len(batch) <= engine.kv_capacity  # the step's growth fits too
        joined = [r for r in batch if r not in last_batch]
        prefill = sum(held(r) for r in joined)  # a resumed request recomputes its prompt and output so far
        assert end - now == pytest.approx(
            engine.decode_base + engine.decode_per_seq * len(batch) + engine.prefill_per_token * prefill
        )
        preempted = engine.preemptions - preempted_before
        if preempted:  # the most recently joined, back at the head of the queue with the oldest first
            assert not joined
            assert batch == last_batch[:-preempted]
            assert waiting[:preempted] == last_batch[-preempted:]
        progress = engine.finish_step(end)
        assert [p.request.id for p in progress] == batch
        for p in progress:
            log[p.request.id].append(p)
        assert engine.kv_used <= engine.kv_capacity
        last_batch = [p.request.id for p in progress if not p.finished]
        steps.append({"batch": batch, "waiting": waiting, "start": now, "end": end, "preempted": preempted})
        now = end
    assert engine.kv_used == 0 and engine.running == 0 and engine.waiting == 0
    return steps, log


def assert_complete(log, outputs):
    """Each request produced exactly its output tokens, its first token once, and finished once, last."""
    assert set(log) == set(outputs)
    for rid, progress in log.items():
        assert sum(p.new_tokens for p in progress) == outputs[rid], rid
        assert [p.first for p in progress] == [True] + [False] * (len(progress) - 1), rid
        assert [p.finished for p in progress] == [False] * (len(progress) - 1) + [True], rid


def test_reserve_mode_never_preempts_or_queues():
    engine = SimEngine(PROFILE, max_running=2, kv_capacity=40)
    assert engine.kv == "reserve"
    engine.admit(request(1, prompt=10, max_tokens=10), 10)
    engine.admit(request(2, prompt=10, max_tokens=10), 10)
    assert engine.kv_used == 40  # reserved up front, not held
    with pytest.raises(ProtocolError, match="does not fit"):
        engine.admit(request(3, prompt=1, max_tokens=1), 1)
    run_to_end(engine)
    assert engine.preemptions == 0 and engine.waiting == 0 and engine.waiting_ids == []


def test_paged_admits_more_than_the_worst_case():
    """Prompts of 10, max_tokens of 80, outputs of 5 on 100 tokens of cache: reserving runs one at a time."""
    outputs = {f"r{i}": 5 for i in range(5)}
    reserve = SimEngine(PROFILE, kv_capacity=100)
    reserve.admit(request(0, prompt=10, max_tokens=80), 5)
    assert [reserve.fits(request(i, prompt=10, max_tokens=80)) for i in range(1, 5)] == [False] * 4

    engine = paged(kv_capacity=100)
    for i in range(5):
        assert engine.fits(request(i, prompt=10, max_tokens=80))
        engine.admit(request(i, prompt=10, max_tokens=80), 5)
    assert engine.running == 5 and engine.waiting == 0 and engine.kv_used == 50

    engine = paged(kv_capacity=100)
    steps, log = drive(engine, {0: [(request(i, prompt=10, max_tokens=80), 5) for i in range(5)]})
    assert len(steps) == 5 and all(s["batch"] == list(outputs) for s in steps)  # all five together
    assert engine.preemptions == 0
    assert_complete(log, outputs)


def test_paged_queues_what_does_not_fit_first_come_first_served():
    engine = paged(kv_capacity=30, max_running=8)
    engine.admit(request(1, prompt=20, max_tokens=5), 5)
    engine.admit(request(2, prompt=5, max_tokens=5), 5)  # 20 + 1 (r1's next token) + 5 + 1 <= 30: joins
    engine.admit(request(3, prompt=15, max_tokens=5), 5)  # 25 + 2 + 15 + 1 > 30: waits
    engine.admit(request(4, prompt=1, max_tokens=1), 1)  # 25 + 2 + 1 + 1 <= 30, but waits behind r3
    assert (engine.running_ids, engine.waiting_ids, engine.waiting) == (["r1", "r2"], ["r3", "r4"], 2)
    assert engine.kv_used == 25
    assert not engine.fits(request(3, prompt=15, max_tokens=5)) and engine.fits(request(4, prompt=1, max_tokens=1))


def test_paged_preempts_the_newest_request_and_recomputes_it():
    engine = paged(kv_capacity=40, max_running=4)
    big, small = request("big", prompt=12, max_tokens=20), request("small", prompt=4, max_tokens=20)
    late = request("late", prompt=10, max_tokens=10)
    outputs = {"rbig": 20, "rsmall": 20, "rlate": 3}
    steps, log = drive(engine, {0: [(big, 20), (small, 20)], 7: [(late, 3)]})

    assert [s["batch"] for s in steps[:12]] == [["rbig", "rsmall"]] * 12  # 16 + 2 a step, up to 40 tokens
    assert steps[7]["waiting"] == ["rlate"]  # 30 + 2 + 10 + 1 > 40
    # The 13th step would need 42 tokens: the newest, small, is preempted (not big, which holds more)
    # and goes back ahead of late; big runs alone, with no prefill.
    assert steps[12]["preempted"] == 1 and engine.preemptions == 1
    assert (steps[12]["batch"], steps[12]["waiting"]) == (["rbig"], ["rsmall", "rlate"])
    assert steps[12]["end"] - steps[12]["start"] == pytest.approx(1.0)
    # Once big is done, small rejoins first and recomputes its prompt and 12 tokens, beside late's prefill.
    resumed = steps[20]
    assert [s["batch"] for s in steps[13:20]] == [["rbig"]] * 7
    assert resumed["batch"] == ["rsmall", "rlate"]
    assert resumed["end"] - resumed["start"] == pytest.approx(1.0 + 0.01 * ((4 + 12) + 10))
    assert [p.first for p in log["rsmall"]][12] is False  # no second first token
    assert_complete(log, outputs)


def test_paged_preempts_as_many_as_the_step_needs_newest_first():
    engine = paged(kv_capacity=20, max_running=5)
    old = request("old", prompt=10, max_tokens=10)
    tiny = [request(f"t{i}", prompt=1, max_tokens=10) for i in range(1, 5)]
    outputs = {"rold": 9, **{t.id: 5 for t in tiny}}
    steps, log = drive(engine, {0: [(old, 9)], 1: [(t, 5) for t in tiny]})
    assert steps[1]["batch"] == ["rold", "rt1", "rt2", "rt3", "rt4"]  # 15 tokens, 20 after the step
    # The next step needs 25: t4 goes (22), then t3 (19); t3 waits ahead of t4, as it joined first.
    assert steps[2]["preempted"] == 2
    assert (steps[2]["batch"], steps[2]["waiting"]) == (["rold", "rt1", "rt2"], ["rt3", "rt4"])
    assert_complete(log, outputs)


def test_a_lone_request_is_never_preempted():
    engine = paged(kv_capacity=20)
    steps, log = drive(engine, {0: [(request(1, prompt=5, max_tokens=15), 15)]})
    assert len(steps) == 15 and engine.preemptions == 0
    assert_complete(log, {"r1": 15})


def test_paged_abort_frees_what_a_request_holds():
    engine = paged(kv_capacity=30)
    engine.admit(request(1, prompt=10, max_tokens=10), 10)
    engine.admit(request(2, prompt=10, max_tokens=10), 10)
    engine.admit(request(3, prompt=10, max_tokens=10), 10)  # 20 + 2 + 11 > 30: waits
    engine.finish_step(engine.start_step(0.0))
    assert (engine.running_ids, engine.waiting_ids, engine.kv_used) == (["r1", "r2"], ["r3"], 22)
    assert engine.abort("r3") and not engine.abort("r3")  # waiting: holds nothing
    assert (engine.waiting, engine.kv_used) == (0, 22)
    engine.admit(request(3, prompt=10, max_tokens=10), 10)
    assert engine.abort("r2")  # running: frees its prompt and its token so far
    assert engine.kv_used == 11
    engine.start_step(1.0)  # r3 now fits: 11 + 1 + 10 + 1 <= 30
    assert (engine.running_ids, engine.waiting_ids, engine.kv_used) == (["r1", "r3"], [], 21)


def test_a_preempted_request_can_be_aborted_while_it_waits():
    engine = paged(kv_capacity=24)
    engine.admit(request(1, prompt=10, max_tokens=10), 10)
    engine.admit(request(2, prompt=10, max_tokens=10), 10)
    now = engine.start_step(0.0)
    while not engine.preemptions:  # 20 tokens, then 22, then 24 + 2 > 24: r2 is preempted
        engine.finish_step(now)
        now = engine.start_step(now)
    assert (engine.running_ids, engine.waiting_ids, engine.kv_used) == (["r1"], ["r2"], 12)
    assert engine.abort("r2")
    assert (engine.waiting, engine.kv_used) == (0, 12)
    assert sum(p.new_tokens for p in engine.finish_step(now)) == 1
    assert len(run_to_end(engine, now)) == 7  # r1's last 7 tokens, alone
    assert engine.kv_used == 0 and engine.start_step(now) is None


@given(
    capacity=st.integers(4, 60),
    max_running=st.integers(1, 8),
    shapes=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.integers(0, 25)),
                    min_size=1, max_size=16),
)
@settings(max_examples=200, deadline=None)
def test_paged_invariants(capacity, max_running, shapes):
    """Random caches, prompts, outputs and arrivals: the cache is never exceeded, nothing idles while
    requests wait, the newest is preempted, and every request ends with exactly its output tokens."""
    engine = paged(kv_capacity=capacity, max_running=max_running, decode_per_seq=0.1, prefill_per_token=0.001)
    admissions, outputs = {}, {}
    for i, (p, m, o, at) in enumerate(shapes):
        prompt = 1 + int(p * p * (capacity - 2))  # 1 .. capacity - 1, mostly short
        max_tokens = 1 + int(m * (capacity - prompt - 1))  # prompt + max_tokens <= capacity
        output = max_tokens - int(o * o * (max_tokens - 1))  # mostly long: the batch outgrows the cache
        admissions.setdefault(at, []).append((request(i, prompt=prompt, max_tokens=max_tokens), output))
        outputs[f"r{i}"] = output
    _, log = drive(engine, admissions)
    assert_complete(log, outputs)


@pytest.mark.parametrize("kv", ["Paged", "vllm", None, 1])
def test_kv_mode_is_validated(kv):
    with pytest.raises(fa.InvalidParameterError, match="kv must be"):
        SimEngine(PROFILE, kv=kv)
    with pytest.raises(ValueError):
        SimEngine(PROFILE, kv=kv)


@pytest.mark.parametrize("kv", ["reserve", "paged"])
def test_a_request_is_admitted_once(kv):
    engine = SimEngine(PROFILE, kv=kv)
    engine.admit(request(1), 5)
    with pytest.raises(ProtocolError, match="already"):
        engine.admit(request(1), 5)
    assert engine.running == 1 and engine.kv_used == (15 if kv == "reserve" else 10)


def test_the_simulator_runs_on_a_paged_engine():
    from fairagents.simulation import Workload, simulate

    work = Workload(seed=2).burst(WHO, "m", n=30, prompt=(10, 40), output=(1, 30))
    engines = {"m": SimEngine(PROFILE, max_running=4, kv_capacity=256, kv="paged")}
    result = simulate(work, "fcfs", engines)
    assert len(result.records) == 30
    assert engines["m"].kv_used == 0 and engines["m"].waiting == 0


# -- scheduler="fair": the default path's in-engine scheduler ----------------------------------------------------


def fair_engine(**kwargs):
    from fairagents.policies.pooled import PoolPolicy

    engine = SimEngine(PROFILE, scheduler="fair", decode_base=0.01, decode_per_seq=0.0, prefill_per_token=0.0,
                       **kwargs)
    seat = PoolPolicy(fa.policies.make_policy("hmfs", fa.UnifiedTokenCost()), clock=lambda: 0.0)
    seat.register("m", PROFILE)
    engine.bind(seat, "m")
    return engine, seat


def ask(i, app, prompt=10, max_tokens=5, agent="t"):
    return fa.Request(f"{app}{i}", fa.Agent(agent, fa.App(app)), "m", prompt, max_tokens, 0.0)


def test_a_fair_engine_must_be_bound_and_only_a_fair_engine_binds():
    with pytest.raises(ProtocolError, match="bind"):
        SimEngine(PROFILE, scheduler="fair").admit(request(1), output_tokens=1)
    with pytest.raises(ProtocolError, match="scheduler='fair'"):
        SimEngine(PROFILE).bind(object(), "m")
    with pytest.raises(fa.InvalidParameterError, match="scheduler"):
        SimEngine(PROFILE, scheduler="edf")


def test_a_fair_engine_fills_its_batch_in_the_policys_order_and_charges_as_requests_join():
    engine, seat = fair_engine(max_running=2)
    for i in range(3):
        engine.admit(ask(i, "a"), output_tokens=5)
    engine.admit(ask(0, "b"), output_tokens=5)
    engine.start_step(0.0)
    assert engine.running_ids == ["a0", "b0"] and engine.waiting_ids == ["a1", "a2"]  # b is owed a turn before a's 2nd
    assert seat.charged == {"a": 10 * 64 / 4096, "b": 10 * 64 / 4096}  # the prompts, as they joined
    engine.finish_step(0.01)
    assert seat.charged["a"] == pytest.approx(10 * 64 / 4096 + seat.cost.output_cost("m", 1))  # and each step's output


def test_a_fair_engine_preempts_for_a_client_owed_service_at_most_twice_per_request():
    from fairagents.engines.sim import MAX_FAIR_PREEMPTIONS

    engine, seat = fair_engine(max_running=1)
    engine.admit(ask(0, "a", max_tokens=400), output_tokens=400)
    now = 0.0
    for _ in range(50):
        now = engine.start_step(now)
        engine.finish_step(now)
    for i in range(6):  # b asks again and again, each a little: a's one request is thrown away only so often
        engine.admit(ask(i, "b", prompt=1, max_tokens=1), output_tokens=1)
        now = engine.start_step(now)
        engine.finish_step(now)
    assert engine.fair_preemptions == MAX_FAIR_PREEMPTIONS == engine.preemptions
    tally = seat.tally("m")  # as the real engine tallies them
    assert (tally.preemptions, tally.fair_preemptions) == (2, 2) and tally.recomputed > 2 * (10 + 50)


def test_a_fair_engine_that_overflows_its_cache_preempts_the_most_served_clients_request():
    engine, seat = fair_engine(max_running=3, kv="paged", kv_capacity=60)
    engine.admit(ask(0, "a", prompt=10, max_tokens=40), output_tokens=40)
    engine.admit(ask(1, "a", prompt=10, max_tokens=40), output_tokens=40)
    engine.admit(ask(0, "b", prompt=10, max_tokens=40), output_tokens=40)
    now = 0.0
    while engine.preemptions == 0:
        now = engine.start_step(now)
        engine.finish_step(now)
    assert engine.running_ids == ["a0", "b0"] and engine.waiting_ids == ["a1"]  # a is ahead: its latest goes


def test_an_aborted_request_ends_in_the_policy_waiting_or_running():
    engine, seat = fair_engine(max_running=1)
    engine.admit(ask(0, "a"), output_tokens=5)
    engine.admit(ask(1, "a"), output_tokens=5)
    engine.start_step(0.0)
    engine.finish_step(0.01)
    assert seat.held("m") == 2
    assert engine.abort("a1") and engine.abort("a0") and not engine.abort("a0")
    assert seat.held("m") == 0 and engine.start_step(0.01) is None


def test_a_policy_that_chooses_a_request_the_engine_does_not_hold_is_a_clear_error():
    from fairagents.policies.pooled import PoolPolicy

    class Astray(fa.policies.FCFS):
        def select(self, model, now):
            return ask(99, "elsewhere")

    engine = SimEngine(PROFILE, scheduler="fair")
    seat = PoolPolicy(Astray(fa.UnifiedTokenCost()), clock=lambda: 0.0)
    seat.register("m", PROFILE)
    engine.bind(seat, "m")
    engine.admit(ask(0, "a"), output_tokens=1)
    with pytest.raises(ProtocolError, match="'elsewhere99', not a request waiting in model 'm'"):
        engine.start_step(0.0)
