"""The in-engine fair scheduler's parts, on hand-made vLLM requests (no engine)."""

import json

import pytest

pytest.importorskip("vllm")
from vllm import SamplingParams
from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue
from vllm.v1.request import Request as VllmRequest

import fairagents as fa
from fairagents.identity import identity_args
from fairagents.policies.pooled import PoolPolicy
from fairagents.vllm.args import CONFIG_ENV, Weights, identity, run_of
from fairagents.vllm.queue import Binding, FairQueue, outcome_of
from fairagents.vllm.scheduler import FairScheduler


def vreq(rid, app=None, agent=None, at=0.0, prompt=8, max_tokens=16, **extra):
    args = dict(extra)
    if app is not None:
        args["fairagents_app"] = app
    if agent is not None:
        args["fairagents_agent"] = agent
    params = SamplingParams(max_tokens=max_tokens, extra_args=args or None)
    return VllmRequest(rid, list(range(prompt)), params, None, arrival_time=at)


def seat(policy="hmfs", *models):
    cost = fa.UnifiedTokenCost()
    pool = PoolPolicy(fa.policies.make_policy(policy, cost), cost)
    for model in models or ("engine",):
        pool.register(model, fa.ModelProfile(d_model=4096, n_layers=1))
    return pool


def twin_of(model="engine"):
    return lambda r: fa.Request(r.request_id, identity(r.sampling_params.extra_args), model, r.num_prompt_tokens,
                                r.max_tokens, r.arrival_time)


def queue(policy="hmfs"):
    pool = seat(policy)
    return FairQueue(Binding(pool, "engine"), twin_of()), pool.policy


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
    sched = bare_scheduler(seat())
    for r in (vreq("r1", "a", "x", fairagents_run="digest-7"), vreq("r2", "a", "x")):
        sched.waiting.add_request(r)
    assert {t.id: t.run for t in sched.seat.policy.waiting_requests()} == {"r1": "digest-7", "r2": None}


def test_under_a_run_aware_policy_the_engines_queue_orders_an_apps_calls_by_run():
    """``vllm serve`` with ``FAIRAGENTS_SCHEDULER_POLICY=hmfs_runs``: a fan-out does not hold a later run's call back."""
    sched = bare_scheduler(seat("hmfs_runs"))
    for i in range(5):
        sched.waiting.add_request(vreq(f"map{i}", "news", "worker", fairagents_run="digest"))
    sched.waiting.add_request(vreq("ask", "news", "worker", at=1.0, fairagents_run="question"))
    order = []
    while sched.waiting:
        request = sched.waiting.pop_request()
        sched.seat.engine_admit("engine", request.request_id)
        order.append(request.request_id)
    assert order == ["map0", "ask", "map1", "map2", "map3", "map4"]  # HMFS would serve them in arrival order


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


def bare_scheduler(pool, *, free=1000, max_active=4, block=16):
    """A FairScheduler without an engine: its queue, its running list and a KV pool of ``free`` blocks."""
    from types import SimpleNamespace

    sched = object.__new__(FairScheduler)
    sched.weights, sched.binding, sched.metrics = None, Binding(pool, "engine"), None
    sched._twins, sched._outputs = {}, {}
    sched.waiting = FairQueue(sched.binding, sched._twin_of)
    sched.running = []
    sched.block_size, sched.max_num_scheduled_tokens, sched._max_active = block, 256, max_active
    sched.free = [free]
    sched.shared_blocks = {}  # request id -> how many of its blocks the prefix cache shares with others

    def blocks_of(rid):
        request = next(r for r in sched.running if r.request_id == rid)
        n, shared = -(-request.num_computed_tokens // block), sched.shared_blocks.get(rid, 0)
        return SimpleNamespace(blocks=([SimpleNamespace(ref_cnt=2 if i < shared else 1, is_null=False)
                                        for i in range(n)],))

    def computed_blocks(request):  # its prefix-cache hit: ``hits[id]`` blocks, the first ``evictable`` of them free
        n, free_ones = sched.hits.get(request.request_id, (0, 0))
        blocks = [SimpleNamespace(ref_cnt=0 if i < free_ones else 1, is_null=False) for i in range(n)]
        return SimpleNamespace(blocks=(blocks,)), n * block, 0

    sched.hits = {}  # request id -> (blocks of its prompt in the prefix cache, how many of those sit free)
    sched.kv_cache_manager = SimpleNamespace(block_pool=SimpleNamespace(get_num_free_blocks=lambda: sched.free[0]),
                                             get_blocks=blocks_of, get_computed_blocks=computed_blocks)
    sched.kv_cache_config = SimpleNamespace(kv_cache_groups=[object()])
    sched.num_lookahead_tokens = 0
    sched.kv_holding_waiting = create_request_queue(SchedulingPolicy.FCFS)
    sched.requests = {}
    sched._fair_preempted, sched.defer_block_free, sched.requires_kv_delivery = {}, False, False
    return sched


def admit(q):
    """vLLM pops the queue's choice and the step runs it: its prompt is charged then."""
    request = q.pop_request()
    q.admit_scheduled(lambda rid: rid == request.request_id)
    return request


def run(sched, request, computed):
    """``request`` taken into the batch with ``computed`` tokens done."""
    from vllm.v1.request import RequestStatus

    sched.waiting.add_request(request)
    assert admit(sched.waiting) is request
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = computed
    sched.running.append(request)


def test_the_queue_orders_by_app_counter_then_agent_counter_then_arrival():
    q, policy = queue()
    for rid, app, agent, at in [("a1", "A", "x", 0.0), ("a2", "A", "y", 1.0), ("b1", "B", "x", 2.0),
                                ("a3", "A", "x", 3.0)]:
        q.add_request(vreq(rid, app, agent, at))
    policy.charge_to(fa.Agent("x", fa.App("A")), 10.0)  # A's x has been served
    assert q.peek_request().request_id == "b1"  # B's counter is lower
    assert q.pop_request().request_id == "b1"
    policy.charge_to(fa.Agent("x", fa.App("B")), 30.0)
    assert q.pop_request().request_id == "a2"  # then A's y (lower agent counter), then x by arrival
    assert [q.pop_request().request_id for _ in range(2)] == ["a1", "a3"]
    assert len(q) == 0 and not q


def test_a_request_is_charged_its_prompt_once_when_a_step_runs_it_never_when_skipped_or_preempted():
    from vllm.v1.request import RequestStatus

    q, policy = queue()
    pool = q.seat
    first = vreq("a1", "A", prompt=30)
    q.add_request(first)
    q.add_request(vreq("b1", "B", prompt=10, at=1.0))
    assert q.pop_request() is first and pool.charged == {}  # taken, not yet run: nothing charged
    q.prepend_requests([first])  # vLLM skipped it (its grammar compiles): it keeps its turn, uncharged
    q.admit_scheduled(lambda rid: False)
    q.new_step()
    assert q.peek_request() is first and len(q) == 2 and pool.charged == {}
    assert q.pop_request() is first
    q.admit_scheduled(lambda rid: rid == "a1")  # this step ran it: its prompt is charged, once
    q.admit_scheduled(lambda rid: rid == "a1")
    assert pool.charged == {"A": 30.0}
    q.new_step()
    first.status = RequestStatus.PREEMPTED  # preempted in a later step: it starts over, its prompt recomputed free
    q.prepend_request(first)
    assert policy.queued("engine") == 2 and policy.running() == 0
    assert {q.pop_request().request_id, q.pop_request().request_id} == {"a1", "b1"}
    q.admit_scheduled(lambda rid: True)
    pool.engine_progress("engine", [("a1", 5), ("gone", 3)])
    assert pool.charged == {"A": 40.0, "B": 10.0}
    for rid in ("a1", "b1", "a1"):  # ended once: the second end of a1 is nothing
        pool.engine_end("engine", rid, fa.Outcome.FINISHED)
    assert policy.running() == policy.queued() == 0 and pool.held() == 0
    assert pool.tally("engine").prefilled == 40


def test_a_skipped_request_that_is_aborted_or_whose_grammar_fails_costs_its_client_nothing():
    q, policy = queue()
    pool = q.seat
    requests = [vreq("a1", "A", prompt=30), vreq("b1", "B", prompt=30, at=1.0)]
    for request in requests:
        q.add_request(request)
    assert [q.pop_request(), q.pop_request()] == requests
    q.prepend_requests(requests[::-1])  # both skipped this step: their grammars compile
    q.admit_scheduled(lambda rid: False)
    q.new_step()
    aborted = q.peek_request()
    q.remove_request(aborted)  # the client gave up while its grammar compiled
    failed = q.peek_request()
    failed.status = __import__("vllm.v1.request", fromlist=["RequestStatus"]).RequestStatus.FINISHED_ERROR
    q.remove_request(failed)  # vLLM ends a request whose grammar failed to compile
    assert pool.charged == {} and pool.held() == 0 and policy.running() == policy.queued() == 0
    assert policy.app_counters() in ({}, {"A": 0.0, "B": 0.0})


def test_removing_requests_the_queue_does_not_hold_is_harmless():
    q, policy = queue()
    q.add_request(vreq("a1", "A"))
    q.remove_requests([vreq("zz", "A"), vreq("a1", "A")])
    assert len(q) == 0 and not q and policy.queued() == 0


class Newest(fa.policies.BasePolicy):
    """A policy of one's own: newest first, no counters."""

    name = "newest"

    def __init__(self):
        super().__init__(fa.RawTokenCost())
        self.stack = []

    def select(self, model, now):
        mine = [r for r in self.stack if r.model == model]
        return mine[-1] if mine else None

    def _enqueue(self, req, now):
        self.stack.append(req)

    def _dequeue(self, req, now, dispatched):
        self.stack.remove(req)


@pytest.mark.parametrize("policy", [*sorted(fa.policies.POLICIES), "custom"])
def test_every_policy_orders_the_engine_queue_and_leaves_nothing_behind(policy):
    """The in-engine contract, for every built-in policy and one of one's own: what waits is served, once."""
    chosen = Newest() if policy == "custom" else policy
    cost = fa.UnifiedTokenCost()
    pool = PoolPolicy(fa.policies.make_policy(chosen, cost), cost)
    pool.register("engine", fa.ModelProfile(d_model=4096, n_layers=1))
    sched = bare_scheduler(pool)
    q = sched.waiting
    requests = [vreq(f"r{i}", "AB"[i % 2], f"t{i % 3}", at=float(i), prompt=4 + i) for i in range(9)]
    for r in requests[:5]:
        q.add_request(r)
    served = []
    while q:
        request = admit(q)
        served.append(request.request_id)
        pool.engine_progress("engine", [(request.request_id, 3)])
        if len(served) == 2:
            for r in requests[5:]:
                q.add_request(r)
        if len(served) % 3 == 0:
            pool.engine_end("engine", request.request_id, fa.Outcome.CANCELLED)
        else:
            pool.engine_end("engine", request.request_id, fa.Outcome.FINISHED)
    assert sorted(served) == sorted(r.request_id for r in requests)
    assert pool.policy.queued() == 0 and pool.held() == 0
    assert sum(pool.charged.values()) == sum(4 + i for i in range(9)) + 9 * 3 * 2
    if policy == "custom":
        assert served[:2] == ["r4", "r3"] and not pool.orders_by_service  # its own order; no fair preemption
    if policy == "fcfs":
        assert served == [f"r{i}" for i in range(9)]


def test_vllms_own_victim_is_the_most_served_clients_and_the_batch_keeps_its_order():
    sched = bare_scheduler(seat())
    sched.running = [vreq("low", "A", at=0.0), vreq("high", "B", at=1.0), vreq("mid", "C", at=2.0)]
    for r, charge in zip(sched.running, (5, 50, 20), strict=True):
        sched.seat.policy.charge_to(sched._agent_of(r), charge)
    sched._rank_victims()
    assert [r.request_id for r in sched.running] == ["low", "high", "mid"]  # the step's budget goes in vLLM's order
    victim = max(sched.running, key=lambda r: (r.priority, r.arrival_time))  # vLLM's priority path
    assert victim.request_id == "high"


def test_one_policy_is_shared_across_the_models_of_a_pool():
    pool = seat("hmfs", "text", "vision")
    text = FairQueue(Binding(pool, "text"), twin_of("text"))
    vision = FairQueue(Binding(pool, "vision"), twin_of("vision"))
    text.add_request(vreq("t-a", "A", at=0.0))
    text.add_request(vreq("t-b", "B", at=1.0))
    assert text.peek_request().request_id == "t-a"
    vision.add_request(vreq("v-a", "A", prompt=100))
    assert admit(vision).request_id == "v-a"  # the vision queue only holds its own
    assert text.peek_request().request_id == "t-b"  # A was served on the other model meanwhile
    bound = FairScheduler.sharing(Binding(pool, "text"), preempt=False)
    assert bound.shared.seat is pool and bound.shared.model == "text" and not bound.preempt
    assert FairScheduler.shared is None


def test_the_policy_stays_exact_under_concurrent_engine_threads_and_the_arbiter():
    """Engines step on their own threads and the arbiter on its loop; every call into the policy takes one lock."""
    import threading

    from fairagents.dispatcher import Dispatcher

    pool = seat("hmfs", "a", "b")
    pool.register("c", fa.ModelProfile(d_model=4096, n_layers=1))
    queues = {m: FairQueue(Binding(pool, m), twin_of(m)) for m in "ab"}
    dispatcher = Dispatcher(pool.policy, pool.cost, lock=pool.lock)
    dispatcher.add_model("c", fa.ModelProfile(d_model=4096, n_layers=1), slots=4, token_budget=None,
                         max_model_len=64)
    who = fa.Agent("default", fa.App("x"))

    def engine_thread(model):
        q = queues[model]
        for i in range(1500):
            q.add_request(vreq(f"{model}{i}", "x", at=float(i), prompt=0))
            request = admit(q)
            pool.engine_progress(model, [(request.request_id, 1)])
            pool.engine_end(model, request.request_id, fa.Outcome.FINISHED)

    def arbiter_thread():
        for i in range(1500):
            dispatcher.arrive(fa.Request(f"c{i}", who, "c", 0, 1, arrival=0.0), now=0.0)
            dispatcher.progress(f"c{i}", 1, now=0.0)
            dispatcher.finish(f"c{i}", now=0.0)

    threads = [threading.Thread(target=engine_thread, args=(m,)) for m in "ab"]
    threads.append(threading.Thread(target=arbiter_thread))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.charged["x"] == 2 * 1500 * 2.0  # not one engine charge lost to a race
    assert pool.policy.counters_of(who)[0] == 3 * 1500 * 2.0  # and the arbiter's landed in the same counters
    assert pool.policy.queued() == pool.policy.running() == 0


def test_an_engine_started_again_forgets_its_last_queue():
    pool = seat()
    old = FairQueue(Binding(pool, "engine"), twin_of())
    old.add_request(vreq("left-behind", "A"))
    old.add_request(vreq("was-running", "A"))
    old.pop_request()
    new = FairQueue(Binding(pool, "engine"), twin_of())  # the engine restarted
    new.add_request(vreq("fresh", "B"))
    assert new.peek_request().request_id == new.pop_request().request_id == "fresh"
    assert pool.policy.queued("engine") == 0 and pool.policy.running() == 1 and pool.held() == 1


def test_a_waiting_client_owed_service_preempts_the_most_served_clients_least_advanced_request():
    sched = bare_scheduler(seat(), max_active=3)
    for rid, computed in (("f1", 200), ("f2", 40), ("g1", 10)):
        run(sched, vreq(rid, "flood" if rid[0] == "f" else "other", prompt=32), computed)
    quiet = vreq("q1", "quiet", prompt=8)
    sched.waiting.add_request(quiet)
    policy = sched.seat.policy
    assert sched.fair_victim(quiet) is None  # lifted to the lowest active counter: owed nothing yet
    sched.seat.engine_progress("engine", [("f1", 30), ("f2", 30), ("g1", 2)])  # flood is served on
    victim = sched.fair_victim(quiet)
    assert victim.request_id == "f2"  # the most served app, its request with the least progress
    sched.waiting.peek_request()
    sched.waiting.new_step()
    sched.running.remove(victim)
    victim.status = __import__("vllm.v1.request", fromlist=["RequestStatus"]).RequestStatus.PREEMPTED
    sched.waiting.add_request(victim)  # what vLLM's _preempt_request does with it
    assert sched.waiting.peek_request() is quiet  # the quiet app goes first, the victim after it
    assert policy.queued("engine") == 2
    sched.free[0] = 1000
    sched._max_active = 8
    assert sched.fair_victim(quiet) is None  # room in the batch: nobody is preempted


def test_fair_preemption_needs_a_gap_larger_than_the_heads_own_prompt():
    sched = bare_scheduler(seat(), max_active=1)
    run(sched, vreq("f1", "flood", prompt=4), 4)
    head = vreq("q1", "quiet", prompt=200)
    sched.waiting.add_request(head)
    sched.seat.engine_progress("engine", [("f1", 50)])  # flood is ahead by 100: less than q1's prompt of 200
    assert sched.fair_victim(head) is None
    sched.seat.engine_progress("engine", [("f1", 51)])
    assert sched.fair_victim(head).request_id == "f1"
    same = bare_scheduler(seat(), max_active=1)  # the same client's requests never preempt each other
    run(same, vreq("f1", "flood", prompt=4), 4)
    same.seat.engine_progress("engine", [("f1", 500)])
    mine = vreq("f2", "flood", prompt=1)
    same.waiting.add_request(mine)
    assert same.fair_victim(mine) is None


@pytest.mark.parametrize("resuming", [False, True], ids=["new", "resuming"])
def test_a_resuming_head_must_be_owed_more_than_the_work_it_would_throw_away(resuming):
    """A short head, a victim with 100 tokens computed: a new head pays its prompt; a resuming one, which
    pays nothing again, must be owed more than the victim's recompute."""
    sched = bare_scheduler(seat(), max_active=1)
    run(sched, vreq("f1", "flood", prompt=100), 100)
    head = vreq("q1", "quiet", prompt=4)
    head.num_preemptions = int(resuming)
    sched.waiting.add_request(head)
    leads = []
    while sched.fair_victim(head) is None:
        leads.append(sched.seat.lead(sched._agent_of(head), sched._agent_of(sched.running[0])))
        sched.seat.engine_progress("engine", [("f1", 1)])  # the flood is served on, 2 a token
        assert len(leads) < 100
    lead = sched.seat.lead(sched._agent_of(head), sched._agent_of(sched.running[0]))
    threshold = 100 if resuming else 4
    assert max(leads, default=0) <= threshold < lead


def test_a_victim_must_free_the_blocks_the_head_lacks():
    sched = bare_scheduler(seat(), free=1, max_active=16, block=16)
    run(sched, vreq("small", "flood", prompt=16), 16)  # holds 1 block
    run(sched, vreq("big", "flood", prompt=64), 64)  # holds 4
    head = vreq("q1", "quiet", prompt=48)  # lacks 3 blocks (+1 for a decode opening a block)
    sched.waiting.add_request(head)
    sched.seat.engine_progress("engine", [("small", 200), ("big", 200)])
    assert sched.fair_victim(head).request_id == "big"  # the least advanced one would not let it in


def test_only_policies_that_order_by_service_preempt_for_fairness():
    for name in ("hmfs", "hmfs_runs", "vtc", "wfq"):
        assert seat(name).orders_by_service, name
    for name in ("fcfs", "sjf", "edf", "rr", "duet", "exfairs", "two_lane", "adaptive"):
        assert not seat(name).orders_by_service, name


@pytest.mark.parametrize("policy", ["hmfs", "vtc", "wfq"])
def test_every_policy_that_orders_by_service_preempts_the_client_furthest_ahead(policy):
    """Each says how it compares two clients (``lead``); the scheduler preempts by it, with the same threshold."""
    sched = bare_scheduler(seat(policy), max_active=2)
    quiet = vreq("q1", "quiet", prompt=4, at=0.0)
    sched.waiting.add_request(quiet)
    assert sched.waiting.pop_request() is quiet  # its grammar compiles: vLLM puts it back, and the flood runs
    sched.waiting.prepend_requests([quiet])
    sched.waiting.new_step()
    for rid, app in (("f1", "flood"), ("g1", "other"), ("f2", "flood"), ("f3", "flood")):
        request = vreq(rid, app, prompt=4, at=1.0)
        sched.waiting.add_request(request)
        sched.waiting._held.pop(rid)  # vLLM runs it while the quiet one waits for its grammar
        assert sched.seat.engine_take("engine", rid) and sched.seat.engine_admit("engine", rid)
        sched.running.append(request)
    sched.seat.engine_progress("engine", [("f1", 200), ("g1", 20)])  # the flood is served on while it waits
    assert sched.seat.lead(sched._agent_of(quiet), sched._agent_of(sched.running[0])) > 0
    assert sched.fair_victim(quiet).request_id == "f1"  # the flood is furthest ahead


def test_a_requests_end_is_told_to_the_policy_as_vllm_ended_it():
    from vllm.v1.request import RequestStatus

    r = vreq("r", "A")
    assert outcome_of(r) is fa.Outcome.CANCELLED  # removed while waiting
    for status, outcome in ((RequestStatus.FINISHED_STOPPED, fa.Outcome.FINISHED),
                            (RequestStatus.FINISHED_LENGTH_CAPPED, fa.Outcome.FINISHED),
                            (RequestStatus.FINISHED_ABORTED, fa.Outcome.CANCELLED),
                            (RequestStatus.FINISHED_ERROR, fa.Outcome.FAILED)):
        r.status = status
        assert outcome_of(r) is outcome


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


def test_the_pool_keeps_service_per_model_app_and_agent():
    pool = seat("hmfs", "text", "small")
    text = FairQueue(Binding(pool, "text"), twin_of("text"))
    small = FairQueue(Binding(pool, "small"), twin_of("small"))
    text.add_request(vreq("t", "a", "planner", prompt=10))
    small.add_request(vreq("s1", "a", "planner", prompt=0))
    small.add_request(vreq("s2", "a", "critic", prompt=0))
    for q in (text, small, small):
        admit(q)
    pool.engine_progress("text", [("t", 5)])
    pool.engine_progress("small", [("s1", 4), ("s2", 8)])
    assert pool.service == {("text", "a", "planner"): 20.0, ("small", "a", "planner"): 8.0,
                            ("small", "a", "critic"): 16.0}
    assert pool.charged == {"a": 44.0}


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


def flood_ahead_of(head):
    """A batch of one, full with a flood request served 100 tokens; ``head`` of another app waiting."""
    sched = bare_scheduler(seat(), max_active=1)
    run(sched, vreq("f1", "flood", prompt=4), 4)
    sched.waiting.add_request(head)
    sched.seat.engine_progress("engine", [("f1", 100)])
    return sched


def test_a_head_vllm_cannot_schedule_yet_preempts_nobody():
    from vllm.v1.request import RequestStatus

    head = vreq("q1", "quiet", prompt=4)
    sched = flood_ahead_of(head)
    assert sched.fair_victim(head).request_id == "f1"
    head.num_stale_output_tokens, head.drop_stale_output = 2, False  # an earlier run's output still in flight
    assert sched.fair_victim(head) is None
    head.num_stale_output_tokens = 0
    head.status = RequestStatus.WAITING_FOR_REMOTE_KVS
    assert sched.fair_victim(head) is None


class _Constraint:
    """What vLLM keeps of a request's output constraint: its grammar, ``None`` while it compiles."""

    def __init__(self):
        self.grammar = None


def test_a_tool_call_whose_grammar_has_compiled_preempts_like_a_plain_chat():
    """vLLM promotes a constrained request only when it peeks at it, and with the batch full it never peeks."""
    from vllm.v1.request import RequestStatus

    call = vreq("q1", "quiet", prompt=4)
    call.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    call.structured_output_request = _Constraint()
    sched = flood_ahead_of(call)
    assert sched.fair_victim(call) is None  # its grammar compiles: a place in the batch would not help it yet
    call.structured_output_request.grammar = object()  # compiled
    assert sched.fair_victim(call).request_id == "f1"
    call.structured_output_request.grammar = ValueError("bad schema")  # failed: vLLM ends it
    assert sched.fair_victim(call) is None
    # one vLLM popped and put back while its grammar compiled (it keeps its turn) preempts once it is ready
    call.structured_output_request.grammar = None
    assert sched.waiting.pop_request() is call
    sched.waiting.prepend_requests([call])
    sched.waiting.new_step()
    assert sched.fair_victim(call) is None
    call.structured_output_request.grammar = object()
    assert sched.fair_victim(call).request_id == "f1"


def test_no_request_is_preempted_for_fairness_more_than_the_bound():
    from vllm.v1.request import RequestStatus

    head = vreq("q1", "quiet", prompt=4)
    sched = flood_ahead_of(head)
    for _ in range(FairScheduler.max_fair_preemptions):
        assert sched.fair_victim(head).request_id == "f1"
        sched._fair_preempted["f1"] = sched._fair_preempted.get("f1", 0) + 1
    assert sched.fair_victim(head) is None
    assert RequestStatus.RUNNING == sched.running[0].status


def test_blocks_the_prefix_cache_shares_free_nothing():
    sched = bare_scheduler(seat(), free=0, max_active=16, block=16)
    run(sched, vreq("shared", "flood", prompt=64), 64)  # 4 blocks, 3 of them shared with another request
    run(sched, vreq("own", "flood", prompt=48, at=1.0), 48)  # 3 blocks of its own
    sched.shared_blocks["shared"] = 3
    head = vreq("q1", "quiet", prompt=32)  # lacks 2 blocks (+2 for decodes opening a block)
    sched.waiting.add_request(head)
    sched.seat.engine_progress("engine", [("shared", 200), ("own", 200)])
    assert sched.fair_victim(head) is None  # "own" frees 3, "shared" 1: neither the 4 it lacks
    sched.shared_blocks["shared"] = 0
    assert sched.fair_victim(head).request_id == "shared"


def test_a_queue_re_bound_to_another_policy_adopts_what_it_holds():
    old, new = seat(), seat("fcfs")
    binding = Binding(old, "engine")
    q = FairQueue(binding, twin_of())
    q.add_request(vreq("a1", "A"))
    binding.rebind(new, "engine")  # an idle engine joins another arbiter; vLLM still holds a1 (its abort pending)
    assert q.peek_request().request_id == "a1" and new.policy.queued("engine") == 1
    assert q.pop_request().request_id == "a1" and new.held() == 1


def test_a_policy_that_refuses_a_preempted_request_leaves_nothing_of_it():
    class Refusing(fa.policies.FCFS):
        refuse = False

        def on_arrival(self, req, now):
            if self.refuse:
                raise fa.InvalidParameterError("no")
            super().on_arrival(req, now)

    policy = Refusing()
    pool = PoolPolicy(policy, fa.UnifiedTokenCost())
    pool.register("engine", fa.ModelProfile(d_model=4096, n_layers=1))
    q = FairQueue(Binding(pool, "engine"), twin_of())
    first = vreq("a1", "A")
    q.add_request(first)
    q.pop_request()
    q.new_step()
    policy.refuse = True
    q.prepend_request(first)  # preempted, and the policy refuses it: served uncharged rather than lost
    assert pool.held() == 0 and policy.queued() == policy.running() == 0
    assert q.pop_request() is first
    pool.engine_progress("engine", [("a1", 3)])
    pool.engine_end("engine", "a1", fa.Outcome.FINISHED)  # nothing raises on the engine's thread


def test_the_choices_of_a_request_with_n_above_one_pay_its_prompt_once():
    """vLLM splits ``n = 3`` into children ``0_<id>``, ``1_<id>``, ``2_<id>`` sharing one prompt."""
    sched = bare_scheduler(seat(), max_active=8)
    for i in range(3):
        run(sched, vreq(f"{i}_cmpl-7", "a", prompt=30), 30)
    run(sched, vreq("1_other", "a", prompt=10), 10)  # no sibling 0: a request of its own, charged
    sched.seat.engine_progress("engine", [(f"{i}_cmpl-7", 2) for i in range(3)])
    assert sched.seat.charged == {"a": 30.0 + 10.0 + 3 * 2 * 2.0}


def step_output(*new):
    """What vLLM's ``schedule`` returns, as far as charging reads it: ``(id, computed tokens as the step took it)``."""
    from types import SimpleNamespace

    return SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(req_id=rid, num_computed_tokens=n) for rid, n in new])


def test_prompt_tokens_found_in_the_prefix_cache_are_charged_at_their_own_weight():
    """An agent resends its 96-token history with 4 new tokens: the engine computes 4 and reads 96 from its cache."""
    from vllm.v1.request import RequestStatus

    sched = bare_scheduler(seat(), max_active=4)
    turn = vreq("t2", "agents", prompt=100)
    sched.waiting.add_request(turn)
    sched.requests["t2"] = turn
    assert sched.waiting.pop_request() is turn
    turn.status = RequestStatus.RUNNING
    sched._admit(step_output(("t2", 96)))
    pool = sched.seat
    assert pool.charged == {"agents": pytest.approx(4 + 0.1 * 96)}  # not 100
    assert pool.tally("engine").prefilled == 100 and pool.tally("engine").cached == 96
    assert pool.served(identity({"fairagents_app": "agents"}))[0] == pytest.approx(13.6)  # the policy's counter too
    sched._admit(step_output(("t2", 96)))  # vLLM reports it once; were it again, it is charged once
    assert pool.charged == {"agents": pytest.approx(13.6)}


def test_w_cached_set_to_w_input_charges_hits_as_computed():
    cost = fa.UnifiedTokenCost(w_cached=1.0)
    pool = PoolPolicy(fa.policies.make_policy("hmfs", cost), cost)
    pool.register("engine", fa.ModelProfile(d_model=4096, n_layers=1))
    q = FairQueue(Binding(pool, "engine"), twin_of())
    q.add_request(vreq("t2", "agents", prompt=100))
    q.pop_request()
    q.admit_scheduled(lambda rid: True, {"t2": 96})
    assert pool.charged == {"agents": 100.0}


def test_requests_vllm_holds_with_kv_blocks_are_charged_as_a_step_runs_them():
    """vLLM drains ``kv_holding_waiting`` before the fair queue: a request whose KV it loaded from outside
    the engine (taken, skipped while loading) and a streaming-input session's next chunk."""
    from vllm.v1.request import RequestStatus

    sched = bare_scheduler(seat(), max_active=4)
    pool = sched.seat
    loaded = vreq("kv1", "A", prompt=64)
    sched.waiting.add_request(loaded)
    sched.requests["kv1"] = loaded
    assert sched.waiting.pop_request() is loaded  # vLLM starts its KV load and parks it holding blocks
    sched._admit(step_output())
    sched.waiting.new_step()
    assert pool.charged == {}  # not run yet: nothing charged
    loaded.status = RequestStatus.RUNNING  # a later step runs it from kv_holding_waiting, its 48 tokens loaded
    sched._admit(step_output(("kv1", 48)))
    assert pool.charged == {"A": pytest.approx(16 + 0.1 * 48)}
    # the session ends its turn with 64 + 10 tokens computed and gets a next chunk of 20 tokens
    loaded.prompt_token_ids.extend(range(30))  # the 10 output tokens kept, then the 20 new ones
    loaded.num_prompt_tokens = 94
    pool.engine_progress("engine", [("kv1", 10)])
    before = pool.charged["A"]
    sched._admit(step_output(("kv1", 74)))  # run again from kv_holding_waiting: the chunk is computed
    assert pool.charged["A"] == pytest.approx(before + 20)
    assert pool.tally("engine").prefilled == 64 + 20


def test_fair_preemption_makes_room_for_the_request_vllm_takes_next():
    """With requests holding KV blocks waiting, vLLM admits those before the fair queue's choice."""
    from vllm.v1.request import RequestStatus

    head = vreq("q1", "quiet", prompt=4)
    sched = flood_ahead_of(head)
    sched.preempt = True
    held = vreq("f9", "flood", prompt=4, at=2.0)  # a flood session's next chunk, holding blocks, waits for its turn
    held.status, held.num_computed_tokens = RequestStatus.WAITING, 4
    sched.kv_holding_waiting.add_request(held)
    preempted = []
    sched._preempt_request = lambda request, *args, **kwargs: preempted.append(request)
    sched._preempt_for_waiting()  # the head vLLM takes next is the flood's: owed nothing, nobody is preempted
    assert preempted == [] and sched.running[0].request_id == "f1"
    held.status = RequestStatus.WAITING_FOR_STREAMING_REQ  # a session idle until its next input: vLLM skips it
    sched._preempt_for_waiting()
    assert [r.request_id for r in preempted] == ["f1"]


def test_the_blocks_a_head_lacks_are_what_vllms_allocation_will_ask():
    sched = bare_scheduler(seat(), free=4, max_active=16, block=16)
    run(sched, vreq("f1", "flood", prompt=8), 8)  # a decode mid-block: opens none
    head = vreq("q1", "quiet", prompt=96)  # 6 blocks
    sched.waiting.add_request(head)
    assert sched._shortfall(head, sched._prefix_hit(head)) == (False, 2)
    sched.hits["q1"] = (4, 0)  # 4 blocks of its prompt in the prefix cache, held by other requests
    assert sched._shortfall(head, sched._prefix_hit(head)) == (False, 0)  # 2 new blocks: they fit
    sched.hits["q1"] = (4, 3)  # 3 of those sit in the free queue: taking them uses free blocks
    assert sched._shortfall(head, sched._prefix_hit(head)) == (False, 1)
    sched.hits["q1"] = (0, 0)
    sched.num_lookahead_tokens = 16  # speculative decoding's lookahead: one block more
    assert sched._shortfall(head, sched._prefix_hit(head)) == (False, 3)
    sched.num_lookahead_tokens = 0
    sched.kv_cache_config.kv_cache_groups = [object(), object()]  # two KV cache groups: blocks in each
    assert sched._shortfall(head, sched._prefix_hit(head)) == (False, 8)


def test_a_head_whose_prompt_is_in_the_prefix_cache_preempts_at_the_gap_of_what_it_will_pay():
    """An agent's next turn: 96 of its 100 prompt tokens in the prefix cache, so it will pay 4 + 9.6, not 100."""
    sched = bare_scheduler(seat(), max_active=1)
    run(sched, vreq("f1", "flood", prompt=4), 4)
    head = vreq("q1", "quiet", prompt=100)
    sched.waiting.add_request(head)
    sched.seat.engine_progress("engine", [("f1", 10)])  # the flood is ahead by 20
    assert sched.fair_victim(head) is None  # owed less than its whole prompt
    sched.hits["q1"] = (6, 0)  # 6 blocks of 16: 96 tokens
    assert sched.fair_victim(head).request_id == "f1"


def test_the_simulated_fair_engine_preempts_a_request_as_often_as_the_real_scheduler():
    from fairagents.engines.sim_fair import MAX_FAIR_PREEMPTIONS

    assert MAX_FAIR_PREEMPTIONS == FairScheduler.max_fair_preemptions
