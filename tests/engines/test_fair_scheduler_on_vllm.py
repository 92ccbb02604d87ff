"""The in-engine fair scheduler on the real tiny model: order, weights, agents, preemption victims, charges.

Each test builds its own small vLLM engine in this process (about 2 s) and steps it by
hand, metering every app's service from the engine's own outputs the same way for
vLLM's default scheduler and for :class:`FairScheduler`: the prompt when a request's
first token comes out, two per output token (raw tokens; one model, so unified tokens
differ only by a constant).
"""

import contextlib

import pytest

pytest.importorskip("vllm")
from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind
from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from fairagents.engines.vllm import _STEP_LOCK, _live, _shutdown
from fairagents.models import LOAD_LOCK, ensure_default_models
from fairagents.vllm.queue import Binding
from fairagents.vllm.scheduler import FairScheduler, own_policy

pytestmark = pytest.mark.engine

PROMPT = list(range(1, 41))  # 40 tokens


@contextlib.contextmanager
def engine(scheduler_cls, *, kv_bytes=8 * 2**20, max_num_seqs=4, max_model_len=1024):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    path = str(ensure_default_models(["text"])["text"])
    args = EngineArgs(model=path, max_model_len=max_model_len, kv_cache_memory_bytes=kv_bytes, max_num_seqs=max_num_seqs,
                      dtype="float32", enforce_eager=True, disable_log_stats=True, scheduler_cls=scheduler_cls)
    with LOAD_LOCK:
        llm = LLMEngine.from_engine_args(args)
    try:
        yield llm
    finally:
        _shutdown(llm, alone=not _live)


def add(llm, rid, app, *, agent=None, tokens=48, prompt=PROMPT, constraint=None, **weights):
    from vllm.sampling_params import StructuredOutputsParams

    extra = {"fairagents_app": app, **({"fairagents_agent": agent} if agent else {}), **weights}
    structured = StructuredOutputsParams(**constraint) if constraint is not None else None
    llm.add_request(rid, {"prompt_token_ids": list(prompt)},
                    SamplingParams(max_tokens=tokens, ignore_eos=constraint is None, extra_args=extra,
                                   structured_outputs=structured, output_kind=RequestOutputKind.DELTA))


def run(llm, client_of, weight_of=lambda c: 1.0):
    """Step to the end; the finish order, and max−min of the weighted service gap while both clients wait."""
    service, started, order, pending, diffs = {}, set(), [], {}, []
    for rid in list(llm.engine_core.engine_core.scheduler.requests):
        pending[client_of(rid)] = pending.get(client_of(rid), 0) + 1
    clients = sorted(pending)
    while llm.has_unfinished_requests():
        with _STEP_LOCK:
            outputs = llm.step()
        for out in outputs:
            c = client_of(out.request_id)
            new = sum(len(o.token_ids) for o in out.outputs)
            if out.request_id not in started and new:
                started.add(out.request_id)
                service[c] = service.get(c, 0.0) + len(out.prompt_token_ids or PROMPT)
            service[c] = service.get(c, 0.0) + 2 * new
            if out.finished:
                order.append(out.request_id)
                pending[c] -= 1
        if all(pending[c] > 0 for c in clients):
            a, b = clients
            diffs.append(service.get(a, 0.0) / weight_of(a) - service.get(b, 0.0) / weight_of(b))
    return order, (max(diffs) - min(diffs)) if diffs else 0.0


def two_u(max_num_seqs, tokens=48):
    """``2U`` in these raw units: U = max(w_in, w_out) × what the batch holds (requests × their length)."""
    return 2 * 2 * max_num_seqs * (len(PROMPT) + tokens)


@pytest.mark.parametrize("fair", [False, True], ids=["vllm-default", "fair"])
def test_a_flood_cannot_hold_the_engine_under_the_fair_scheduler(fair):
    with engine(FairScheduler if fair else AsyncScheduler) as llm:
        for i in range(24):
            add(llm, f"A{i}", "flood")
        for i in range(6):
            add(llm, f"B{i}", "victim")
        order, gap = run(llm, lambda rid: rid[0])
    victim_done = [i for i, rid in enumerate(order) if rid.startswith("B")]
    if fair:
        assert max(victim_done) < 16  # served alongside the flood
        assert gap <= two_u(4)
    else:
        assert min(victim_done) >= 20  # FCFS: behind the whole flood
        assert gap > two_u(4)


def test_app_weights_hold_inside_the_engine():
    with engine(FairScheduler) as llm:
        for i in range(16):
            add(llm, f"A{i}", "heavy", fairagents_app_weight=3.0)
            add(llm, f"B{i}", "light")
        order, gap = run(llm, lambda rid: rid[0], lambda c: 3.0 if c == "A" else 1.0)
    assert gap <= two_u(4)
    first_half = order[:16]
    assert sum(rid.startswith("A") for rid in first_half) >= 11  # about 3 of every 4


def test_agent_weights_hold_inside_one_app():
    with engine(FairScheduler) as llm:
        for i in range(16):
            add(llm, f"x{i}", "app", agent="x")
            add(llm, f"y{i}", "app", agent="y", fairagents_agent_weight=2.0)
        order, gap = run(llm, lambda rid: rid[0], lambda c: 2.0 if c == "y" else 1.0)
    assert gap <= two_u(4)
    last_y = max(i for i, rid in enumerate(order) if rid.startswith("y"))
    assert sum(rid.startswith("x") for rid in order[:last_y]) <= 12  # equal weights would finish ~16 x's by then


def recording(base):
    victims = []

    class Recording(base):
        def _preempt_request(self, request, *args, **kwargs):
            victims.append(request.request_id)
            return super()._preempt_request(request, *args, **kwargs)

    return Recording, victims


@pytest.mark.parametrize("fair", [False, True], ids=["vllm-default", "fair"])
def test_the_preemption_victim_is_the_app_with_the_highest_counter(fair):
    """Seven 128-token blocks, four requests growing to three blocks each: vLLM must preempt.

    ``served`` arrives first; ``newer`` arrives a step later with weight 100, so from the
    lift on its counter grows a hundred times slower: ``served``'s is the highest.
    vLLM's default evicts the newest request; the fair scheduler evicts ``served``'s.
    """
    seat = own_policy()
    base = FairScheduler.sharing(Binding(seat, "engine"), preempt=False) if fair else AsyncScheduler
    cls, victims = recording(base)
    produced = {}

    def count(outputs):
        for out in outputs:
            produced[out.request_id] = produced.get(out.request_id, 0) + sum(len(o.token_ids) for o in out.outputs)

    with engine(cls, kv_bytes=2 * 2**20, max_model_len=512) as llm:
        for i in range(2):
            add(llm, f"served{i}", "served", tokens=300)
        with _STEP_LOCK:
            count(llm.step())
        for i in range(2):
            add(llm, f"newer{i}", "newer", tokens=300, fairagents_app_weight=100.0)
        while llm.has_unfinished_requests():
            with _STEP_LOCK:
                count(llm.step())
    apps = {v.split("-")[0][:-1] for v in victims}  # vLLM appends a suffix to each request id
    assert victims, "the KV cache was meant to run out"
    assert produced == {rid: 300 for rid in ("served0", "served1", "newer0", "newer1")}  # preempted ones resumed whole
    assert apps == ({"served"} if fair else {"newer"})
    if fair:  # recomputation after a preemption is not charged again: exactly prompt + 2 × output each
        cost = seat.cost
        per_request = cost.input_cost("engine", len(PROMPT)) + cost.output_cost("engine", 300)
        assert seat.charged == pytest.approx({"served": 2 * per_request, "newer": 2 * per_request})
        assert seat.tally("engine").recomputed > 0 and seat.policy.queued() == seat.policy.running() == 0


def test_a_synchronous_engine_takes_the_plain_schedulers_path(monkeypatch):
    """Async scheduling off (vLLM then picks its plain ``Scheduler``, as on a CPU): no output
    placeholders and no second prefix caching per decode step, which only cost time there."""
    calls = []
    for name in ("_update_after_schedule", "_update_request_with_output"):
        original = getattr(AsyncScheduler, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(AsyncScheduler, name, spy)
    seat = own_policy()
    with engine(FairScheduler.sharing(Binding(seat, "engine"))) as llm:
        assert not llm.engine_core.engine_core.scheduler.scheduler_config.async_scheduling
        for i in range(3):
            add(llm, f"a{i}", "a", tokens=16)
        produced = {}
        while llm.has_unfinished_requests():
            with _STEP_LOCK:
                for out in llm.step():
                    produced[out.request_id] = produced.get(out.request_id, 0) + len(out.outputs[0].token_ids)
    assert produced == {"a0": 16, "a1": 16, "a2": 16}
    assert calls == []
    cost = seat.cost
    assert seat.charged == pytest.approx({"a": 3 * (cost.input_cost("engine", len(PROMPT))
                                                    + cost.output_cost("engine", 16))})


# What an agent's tool call with tool_choice="required" asks of decoding: an array of calls.
TOOL_CALL = {"json": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
    "type": "object", "properties": {"name": {"const": "search"}, "arguments": {"type": "object"}},
    "required": ["name", "arguments"]}}}


@pytest.mark.parametrize(("preempt", "kind"), [(True, "chat"), (True, "tool call"), (False, "chat")],
                         ids=["fair-preemption", "fair-preemption-tool-call", "no-preemption"])
def test_a_quiet_app_is_admitted_within_a_few_steps_while_a_flood_fills_the_batch(preempt, kind):
    """Four 300-token flood requests fill the batch and eight more wait; a quiet app sends one short request.

    With fair preemption its first token comes within a bounded number of steps, for a
    plain chat and for a tool call alike (a constrained request waits for its grammar,
    which vLLM promotes only when it peeks at the queue: never while the batch is full).
    The quiet app arrives level with the flood (the lift), and the flood must pass it by
    the quiet prompt's charge (8 tokens, while the batch charges the flood 4 × 2 per
    step); then one flood request makes room. Without preemption the
    quiet request waits for a flood request to finish.
    """
    seat = own_policy()
    with engine(FairScheduler.sharing(Binding(seat, "engine"), preempt=preempt), max_num_seqs=4) as llm:
        for i in range(12):
            add(llm, f"flood{i}", "flood", tokens=300)
        for _ in range(5):
            with _STEP_LOCK:
                llm.step()
        add(llm, "quiet", "quiet", tokens=4, prompt=list(range(1, 9)),
            constraint=TOOL_CALL if kind == "tool call" else None)
        steps = 0
        while True:
            with _STEP_LOCK:
                outputs = llm.step()
            steps += 1
            if any(out.request_id.startswith("quiet") and out.outputs[0].token_ids for out in outputs):
                break
        for rid in [r for r in llm.engine_core.engine_core.scheduler.requests]:
            llm.abort_request([rid], internal=True)
    tally = seat.tally("engine")
    if preempt:
        assert steps <= 4, steps
        assert tally.fair_preemptions == 1 and tally.recomputed > 0
    else:
        assert steps > 200 and tally.fair_preemptions == 0  # a flood request had to finish first
    assert seat.policy.queued() == seat.policy.running() == 0 and seat.held() == 0


def test_served_on_its_own_hmfs_credit_takes_U_of_the_engines_kv_cache(monkeypatch):
    """``vllm serve`` with ``FAIRAGENTS_SCHEDULER_POLICY=hmfs_credit``: the idle credit is ``U`` of this engine alone."""
    from fairagents.cost import service_bound
    from fairagents.vllm.scheduler import POLICY_ENV

    monkeypatch.setenv(POLICY_ENV, "hmfs_credit")
    with engine(FairScheduler, kv_bytes=2 * 2**20, max_model_len=512) as llm:
        sched = llm.engine_core.engine_core.scheduler
        held = (sched.kv_cache_config.num_blocks - 1) * sched.block_size
        assert sched.seat.policy.name == "hmfs_credit"
        assert sched.seat.policy.idle_credit == service_bound(sched.seat.cost, {sched.model: held}) > 0
