"""The in-engine fair scheduler's parts, on hand-made vLLM requests (no engine)."""

import json

import pytest

pytest.importorskip("vllm")
from vllm import SamplingParams
from vllm.v1.request import Request as VllmRequest

import fairagents as fa
from fairagents.engines.fair_scheduler import CONFIG_ENV, FairCounters, FairQueue, FairScheduler, Weights, identity


def vreq(rid, app=None, agent=None, at=0.0, prompt=8, max_tokens=16, **extra):
    args = dict(extra)
    if app is not None:
        args["fairagents_app"] = app
    if agent is not None:
        args["fairagents_agent"] = agent
    params = SamplingParams(max_tokens=max_tokens, extra_args=args or None)
    return VllmRequest(rid, list(range(prompt)), params, None, arrival_time=at)


def queue():
    counters = FairCounters()
    counters.register("engine", fa.ModelProfile(d_model=4096, n_layers=1))
    return FairQueue(counters, "engine", lambda r: identity(r.sampling_params.extra_args)), counters.policy


def test_identity_comes_from_extra_args_with_defaults():
    who = identity({"fairagents_app": "search", "fairagents_agent": "planner", "fairagents_app_weight": 2,
                    "fairagents_agent_weight": 3.0})
    assert (who.app.name, who.name, who.app.weight, who.weight) == ("search", "planner", 2.0, 3.0)
    anon = identity(None)
    assert (anon.app.name, anon.name, anon.app.weight) == ("default", "default", 1.0)


def test_a_bad_weight_argument_counts_as_one():
    for bad in (0, -1, "2", float("nan"), True):
        assert identity({"fairagents_app": "a", "fairagents_app_weight": bad}).app.weight == 1.0


def test_a_weights_file_overrides_what_requests_claim(tmp_path):
    path = tmp_path / "weights.json"
    path.write_text(json.dumps({"apps": {"search": {"weight": 2, "agents": {"planner": 4}}}}))
    weights = Weights.load(path)
    who = identity({"fairagents_app": "search", "fairagents_agent": "planner", "fairagents_app_weight": 100}, weights)
    assert (who.app.weight, who.weight) == (2.0, 4.0)
    liar = identity({"fairagents_app": "other", "fairagents_app_weight": 100}, weights)
    assert liar.app.weight == 1.0
    toml = tmp_path / "weights.toml"
    toml.write_text('[apps.search]\nweight = 3\nagents = { planner = 2 }\n')
    assert Weights.load(toml).app("search") == 3.0
    with pytest.raises(fa.InvalidParameterError):
        Weights({"apps": {"a": {"weight": -1}}})
    with pytest.raises(fa.InvalidParameterError):
        Weights({"models": {}})
    assert CONFIG_ENV == "FAIRAGENTS_SCHEDULER_CONFIG"


def test_the_queue_orders_by_app_counter_then_agent_counter_then_arrival():
    q, policy = queue()
    for rid, app, agent, at in [("a1", "A", "x", 0.0), ("a2", "A", "y", 1.0), ("b1", "B", "x", 2.0),
                                ("a3", "A", "x", 3.0)]:
        q.add_request(vreq(rid, app, agent, at))
    policy.charge_to(fa.Agent("x", fa.App("A")), 10.0)  # A's x has been served
    assert q.peek_request().request_id == "b1"  # B's counter is lower
    assert [r.request_id for r in q] == ["b1", "a2", "a1", "a3"]  # then A's y (lower agent counter), then x by arrival
    assert q.pop_request().request_id == "b1"
    policy.charge_to(fa.Agent("x", fa.App("B")), 30.0)
    assert q.pop_request().request_id == "a2"
    assert len(q) == 2 and q


def test_pop_and_prepend_move_a_request_out_and_back_with_the_lift():
    q, policy = queue()
    q.add_request(vreq("a1", "A", at=0.0))
    q.add_request(vreq("b1", "B", at=1.0))
    first = q.pop_request()
    assert first.request_id == "a1"
    policy.charge_to(fa.Agent("default", fa.App("A")), 50.0)  # A runs and is charged
    q.prepend_request(first)  # preempted: back in the queue, behind B (higher counter)
    assert [r.request_id for r in q] == ["b1", "a1"]
    # an app returning from idle is lifted to the lowest active counter: no banked credit
    q.remove_requests([first])
    assert q.pop_request().request_id == "b1"
    policy.charge_to(fa.Agent("default", fa.App("B")), 100.0)
    q.add_request(vreq("b2", "B", at=4.0))  # B waits again, at 100
    q.add_request(vreq("c1", "C", at=5.0))  # C is new: lifted to the lowest active counter, not 0
    assert policy.counters_of(fa.Agent("default", fa.App("C")))[0] == 100.0
    assert {q.pop_request().request_id, q.pop_request().request_id} == {"b2", "c1"}
    with pytest.raises(IndexError):
        q.peek_request()


def test_removing_requests_the_queue_does_not_hold_is_harmless():
    q, _ = queue()
    q.add_request(vreq("a1", "A"))
    q.remove_requests([vreq("zz", "A"), vreq("a1", "A")])
    assert len(q) == 0 and not q


def test_running_requests_are_ordered_so_the_victim_has_the_highest_counter():
    sched = object.__new__(FairScheduler)  # only the ordering key: no engine behind it
    sched.weights = None
    sched.counters = FairCounters()
    sched.counters.register("engine", fa.ModelProfile(d_model=4096, n_layers=1))
    sched._agents = {}
    running = [vreq("low", "A", at=0.0), vreq("high", "B", at=1.0), vreq("mid", "C", at=2.0)]
    for r, prompt in zip(running, (5, 50, 20), strict=True):
        sched.counters.charge(sched._agent_of(r), "engine", prompt=prompt)
    running.sort(key=sched._key)
    assert [r.request_id for r in running] == ["low", "mid", "high"]  # vLLM preempts running[-1]


def test_counters_are_shared_across_the_models_of_a_pool():
    counters = FairCounters()
    counters.register("text", fa.ModelProfile(d_model=4096, n_layers=1))
    counters.register("vision", fa.ModelProfile(d_model=1024, n_layers=1, modality="vision"))
    text = FairQueue(counters, "text", lambda r: identity(r.sampling_params.extra_args))
    vision = FairQueue(counters, "vision", lambda r: identity(r.sampling_params.extra_args))
    text.add_request(vreq("t-a", "A", at=0.0))
    text.add_request(vreq("t-b", "B", at=1.0))
    counters.charge(fa.Agent("default", fa.App("A")), "vision", output=100)  # A was served on the other model
    assert text.peek_request().request_id == "t-b"
    assert counters.charged == {"A": 100 * 2 * 1024 / 4096}
    vision.add_request(vreq("v-a", "A", at=2.0))
    assert vision.pop_request().request_id == "v-a"  # the vision queue only holds its own
    bound = FairScheduler.sharing(counters, "text")
    assert bound.shared is counters and bound.model == "text" and FairScheduler.shared is None


def test_engine_defaults_follow_the_device():
    from fairagents.engines.vllm import VLLMEngine

    cpu = VLLMEngine().engine_args(gpu=False)
    assert (cpu["dtype"], cpu["enforce_eager"], cpu["kv_cache_memory_bytes"]) == ("float32", True, 256 * 2**20)
    gpu = VLLMEngine(gpu_memory_utilization=0.3).engine_args(gpu=True)
    assert (gpu["dtype"], gpu["enforce_eager"], gpu["gpu_memory_utilization"]) == ("auto", False, 0.3)
    assert "kv_cache_memory_bytes" not in gpu
    sized = VLLMEngine(kv_cache_bytes=2**30, dtype="bfloat16").engine_args(gpu=True)
    assert (sized["kv_cache_memory_bytes"], sized["dtype"]) == (2**30, "bfloat16")
    assert VLLMEngine(engine_args={"enforce_eager": True}).engine_args(gpu=True)["enforce_eager"] is True
    with pytest.raises(fa.InvalidParameterError):
        VLLMEngine(gpu_memory_utilization=1.5)
    with pytest.raises(fa.InvalidParameterError):
        VLLMEngine(scheduler="priority")


def test_fair_counters_stay_exact_under_concurrent_engine_threads():
    """Engines step on their own threads; charges and queue operations on one set of counters take its lock."""
    import threading

    counters = FairCounters()
    counters.register("a", fa.ModelProfile(d_model=4096, n_layers=1))
    counters.register("b", fa.ModelProfile(d_model=4096, n_layers=1))
    queues = {m: FairQueue(counters, m, lambda r: identity(r.sampling_params.extra_args)) for m in "ab"}
    who = fa.Agent("default", fa.App("x"))

    def engine_thread(model):
        q = queues[model]
        for i in range(2000):
            q.add_request(vreq(f"{model}{i}", "x", at=float(i)))
            counters.charge(who, model, output=1)
            q.pop_request()

    threads = [threading.Thread(target=engine_thread, args=(m,)) for m in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counters.charged["x"] == 2 * 2000 * 2.0  # not one charge lost to a race
    assert counters.policy.counters_of(who)[0] == 8000.0
    assert len(queues["a"]) == len(queues["b"]) == 0


def test_an_engine_started_again_forgets_its_last_queue():
    counters = FairCounters()
    counters.register("engine", fa.ModelProfile(d_model=4096, n_layers=1))
    old = FairQueue(counters, "engine", lambda r: identity(r.sampling_params.extra_args))
    old.add_request(vreq("left-behind", "A"))
    new = FairQueue(counters, "engine", lambda r: identity(r.sampling_params.extra_args))  # the engine restarted
    new.add_request(vreq("fresh", "B"))
    assert new.peek_request().request_id == new.pop_request().request_id == "fresh"
    assert counters.policy.queued("engine") == 0


def test_only_requests_that_joined_the_batch_are_charged_their_prompt():
    from vllm.v1.request import RequestStatus

    sched = object.__new__(FairScheduler)
    sched.weights = None
    sched.model = "engine"
    sched.counters = FairCounters()
    sched.counters.register("engine", fa.ModelProfile(d_model=4096, n_layers=1))
    sched._agents, sched._prefilled, sched._popped = {}, {}, []
    q = FairQueue(sched.counters, "engine", sched._agent_of, sched._popped.append, sched._settle_pops)
    joined, skipped = vreq("joined", "A", prompt=30), vreq("skipped", "B", prompt=50)
    for r in (joined, skipped):
        q.add_request(r)
    for _ in range(2):  # vLLM's loop: peek, pop, and (for the one it schedules) status RUNNING
        request = q.peek_request()
        assert q.pop_request() is request
        if request is joined:
            joined.status = RequestStatus.RUNNING  # in the batch; the other was only skipped
    with pytest.raises(IndexError):
        q.peek_request()  # the next pick settles what was popped
    assert sched.counters.charged == {"A": 30.0}


def test_a_malformed_weights_file_is_refused():
    for bad in ({"apps": {"search": 2}}, {"apps": {"search": {"wieght": 2}}}):
        with pytest.raises(fa.InvalidParameterError, match="takes"):
            Weights(bad)
