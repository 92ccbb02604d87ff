"""The in-engine fair scheduler's parts, on hand-made vLLM requests (no engine)."""

import json

import pytest

pytest.importorskip("vllm")
from vllm import SamplingParams
from vllm.v1.request import Request as VllmRequest

import fairagents as fa
from fairagents.identity import identity_args
from fairagents.vllm.scheduler import CONFIG_ENV, FairCounters, FairQueue, FairScheduler, Weights, identity, run_of


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


def test_identity_args_carry_the_run_of_a_request_that_has_one():
    who = fa.Agent("planner", fa.App("search", weight=2.0))
    assert "fairagents_run" not in identity_args(who)
    args = identity_args(who, run="thread-42/turn-3")
    assert args == {"fairagents_app": "search", "fairagents_agent": "planner", "fairagents_app_weight": 2.0,
                    "fairagents_agent_weight": 1.0, "fairagents_run": "thread-42/turn-3"}
    with pytest.raises(fa.InvalidParameterError):
        identity_args(who, run="two words")
    params = fa.engines.GenerationParams(max_tokens=4, agent=who, run="thread-42/turn-3")
    assert params.sampling_fields()["extra_args"] == args  # what the in-process fair engine passes on


def test_the_scheduler_reads_the_run_onto_the_request_its_policy_sees():
    assert run_of({"fairagents_run": "digest-7"}) == "digest-7"
    assert run_of(None) is None and run_of({"fairagents_app": "a"}) is None
    assert run_of({"fairagents_run": "two words"}) is None  # unchecked (no validator): counted as none
    q, policy = queue()
    q.add_request(vreq("r1", "a", "x", fairagents_run="digest-7"))
    q.add_request(vreq("r2", "a", "x"))
    assert {t.id: t.run for t in policy.waiting_requests()} == {"r1": "digest-7", "r2": None}


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


BAD_ARGS = [
    {"fairagents_app_weight": -3},
    {"fairagents_app_weight": "heavy"},
    {"fairagents_agent_weight": float("nan")},
    {"fairagents_agent_weight": float("inf")},
    {"fairagents_app_weight": 0},
    {"fairagents_app_weight": True},
    {"fairagents_app_weight": "2"},
    {"fairagents_app": 5},
    {"fairagents_app": ["a"]},
    {"fairagents_agent": ""},
    {"fairagents_agent": "x" * 129},
    {"fairagents_wieght": 2},
    {"fairagents_run": "two words"},
    {"fairagents_run": ""},
    {"fairagents_run": "x" * 129},
    {"fairagents_run": 7},
    {"fairagents_run": None},
]


@pytest.mark.parametrize("args", BAD_ARGS, ids=repr)
def test_invalid_fairagents_arguments_are_refused_at_the_door(args):
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.sample.logits_processor import validate_logits_processors_parameters
    from vllm.v1.worker.gpu.sample.logits_processor import build_custom_logits_processors_params_validator

    from fairagents.vllm.args import check_args

    with pytest.raises(fa.InvalidParameterError, match=f"vllm_xargs: .*{next(iter(args))}"):
        check_args(args)
    assert issubclass(fa.InvalidParameterError, ValueError)  # vLLM answers a ValueError from validate_params with 400
    # Both of vLLM's loaders take the class by the name the guide gives, and refuse the request.
    name = "fairagents.vllm:FairArgsValidator"
    params = SamplingParams(extra_args={"fairagents_app": "a", **args})
    with pytest.raises(VLLMValidationError):
        validate_logits_processors_parameters([name], params)  # the V1 model runner's (a CPU's)
    with pytest.raises(VLLMValidationError):
        build_custom_logits_processors_params_validator([name])(params)  # the V2 model runner's


def test_valid_arguments_pass_and_the_validator_leaves_logits_alone():
    import torch

    from fairagents.vllm import FairArgsValidator
    from fairagents.vllm.args import check_args

    check_args(None)
    check_args({"fairagents_app": "search", "fairagents_agent": "planner", "fairagents_app_weight": 2,
                "fairagents_agent_weight": 0.5, "other_processor_arg": "anything"})
    check_args({"fairagents_run": "thread-42/turn-3:a@b+c=d_e.f"})
    check_args({"fairagents_run": "x" * 128})
    FairArgsValidator.validate_params(SamplingParams(extra_args={"fairagents_app": "a", "fairagents_run": "run-1"}))
    v1 = FairArgsValidator(None, torch.device("cpu"), False)
    logits = torch.randn(2, 8)
    assert v1.apply(logits) is logits and v1.is_argmax_invariant()
    v2 = FairArgsValidator(None, object())
    assert v2.add_request(0, SamplingParams()) is False and v2.apply(logits, None) is logits


def test_a_scheduler_knows_whether_its_requests_are_checked():
    from types import SimpleNamespace

    from fairagents.vllm import FairArgsValidator

    def config(*named):
        return SimpleNamespace(model_config=SimpleNamespace(logits_processors=list(named) or None))

    assert FairArgsValidator.configured(config("fairagents.vllm:FairArgsValidator"))
    assert FairArgsValidator.configured(config(FairArgsValidator))
    assert not FairArgsValidator.configured(config())
    assert not FairArgsValidator.configured(config("other.module:Processor"))


def test_counters_keep_service_per_model_app_and_agent():
    counters = FairCounters()
    counters.register("text", fa.ModelProfile(d_model=4096, n_layers=1))
    counters.register("small", fa.ModelProfile(d_model=1024, n_layers=1))
    planner, critic = fa.Agent("planner", fa.App("a")), fa.Agent("critic", fa.App("a"))
    counters.charge(planner, "text", prompt=10, output=5)
    counters.charge_outputs("small", [(planner, 4), (critic, 8)])
    assert counters.service == {("text", "a", "planner"): 20.0, ("small", "a", "planner"): 2.0,
                                ("small", "a", "critic"): 4.0}
    assert counters.charged == {"a": 26.0}


def test_metrics_report_service_queues_and_weights_with_bounded_labels():
    from prometheus_client import CollectorRegistry

    from fairagents.vllm.metrics import OVERFLOW, SchedulerMetrics

    registry = CollectorRegistry()
    now = [0.0]
    metrics = SchedulerMetrics("chat", "0", max_apps=2, max_agents=1, interval=0.5, registry=registry,
                               clock=lambda: now[0])

    def sample(name, app, agent=None):
        labels = {"model_name": "chat", "engine": "0", "app": app, **({"agent": agent} if agent else {})}
        return registry.get_sample_value(name, labels)

    a1, a2 = fa.Agent("planner", fa.App("a", weight=2)), fa.Agent("critic", fa.App("a", weight=2))
    b1, c1 = fa.Agent("w", fa.App("b"), weight=3), fa.Agent("w", fa.App("c"))
    for agent in (a1, a2, b1, c1):
        metrics.observe(agent)
    assert [metrics.labels(x) for x in (a1, a2, b1, c1)] == [("a", "planner"), ("a", OVERFLOW), ("b", "w"),
                                                             (OVERFLOW, OVERFLOW)]
    assert metrics.due()
    metrics.publish([("a", "planner", 10.0), ("a", "critic", 4.0), ("b", "w", 6.0), ("c", "w", 1.0)],
                    [(a1, True), (a2, False), (c1, False), (c1, False)])
    assert not metrics.due()
    assert sample("fairagents_service_unified_tokens_total", "a", "planner") == 10.0
    assert sample("fairagents_service_unified_tokens_total", "a", OVERFLOW) == 4.0
    assert sample("fairagents_service_unified_tokens_total", OVERFLOW, OVERFLOW) == 1.0
    assert sample("fairagents_running_requests", "a", "planner") == 1.0
    assert sample("fairagents_queued_requests", OVERFLOW, OVERFLOW) == 2.0
    assert sample("fairagents_app_weight", "a") == 2.0 and sample("fairagents_agent_weight", "b", "w") == 3.0
    assert sample("fairagents_app_weight", OVERFLOW) is None  # no weight for a crowd
    now[0] = 1.0
    metrics.publish([("a", "planner", 15.0), ("a", "critic", 4.0)], [])  # totals: only the growth is added
    assert sample("fairagents_service_unified_tokens_total", "a", "planner") == 15.0
    assert sample("fairagents_running_requests", "a", "planner") == 0.0  # idle: back to 0
    assert sample("fairagents_queued_requests", OVERFLOW, OVERFLOW) == 0.0
    series = {s.labels["app"] for m in registry.collect() for s in m.samples}
    assert series == {"a", "b", OVERFLOW}


def test_metrics_keep_their_published_service_by_label_so_names_beyond_the_caps_cost_nothing():
    from prometheus_client import CollectorRegistry

    from fairagents.vllm.metrics import OVERFLOW, SchedulerMetrics

    registry = CollectorRegistry()
    metrics = SchedulerMetrics("chat", "0", max_apps=2, max_agents=2, interval=0.0, registry=registry)

    def service(app, agent):
        labels = {"model_name": "chat", "engine": "0", "app": app, "agent": agent}
        return registry.get_sample_value("fairagents_service_unified_tokens_total", labels)

    names = [(f"app-{i}", f"agent-{j}") for i in range(50) for j in range(20)]
    metrics.publish([(app, agent, 1.0) for app, agent in names], [])
    assert OVERFLOW == "_other"  # the server's overflow label too
    assert len(metrics._published) <= 2 * (2 + 1) + 1  # bounded by the caps, not by the 1,000 names
    assert service("app-0", "agent-0") == 1.0 and service("app-0", OVERFLOW) == 18.0
    assert service(OVERFLOW, OVERFLOW) == 48 * 20
    grown = [(app, agent, 3.0 if (app, agent) == ("app-7", "agent-3") else 1.0) for app, agent in names]
    metrics.publish(grown, [])  # one overflowed name grows: its label's sum grows by as much, once
    metrics.publish(grown, [])
    assert service(OVERFLOW, OVERFLOW) == 48 * 20 + 2
    assert service("app-0", "agent-0") == 1.0
