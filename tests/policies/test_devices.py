"""Devices: one order over the engines of a device, separate shares on separate devices."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fairagents as fa
from fairagents.errors import InvalidParameterError
from fairagents.policies.pooled import PoolPolicy
from fairagents.policies.devices import Devices
from fairagents.testing import FakeEngine

PROFILE = fa.ModelProfile(d_model=4096, n_layers=1)
MSG = [{"role": "user", "content": "hello there"}]


def seat_of(policy="hmfs", models=("chat", "image")):
    seat = PoolPolicy(fa.policies.make_policy(policy, fa.UnifiedTokenCost()))
    for model in models:
        seat.register(model, PROFILE)
    return seat


def request(rid, agent, model, prompt=10, max_tokens=10):
    return fa.Request(rid, agent, model, prompt_tokens=prompt, max_tokens=max_tokens, arrival=0.0)


def test_an_engine_holds_a_client_ahead_while_one_behind_waits_on_another_engine_of_the_device():
    seat = seat_of()
    flood, studio = fa.Agent("chatty", fa.App("flood")), fa.Agent("illustrator", fa.App("studio"))
    writer = fa.Agent("writer", fa.App("studio"))
    seat.engine_arrive(request("s1", studio, "image"))
    seat.engine_dispatch("image", "s1")  # studio is served on the image model
    seat.engine_arrive(request("f1", flood, "chat"))  # flood joins level with studio (HMFS's lift)
    assert not seat.holds("image", studio)
    seat.engine_progress("image", [("s1", 2)])  # studio goes on: flood, waiting on the LLM, is behind it
    assert seat.holds("image", studio) and not seat.holds("chat", flood)
    seat.engine_dispatch("chat", "f1")
    seat.engine_progress("chat", [("f1", 3)])  # flood passes studio
    seat.engine_arrive(request("f2", flood, "chat"))
    assert not seat.holds("image", studio) and not seat.holds("chat", flood)
    # inside an app: the writer waits on the LLM, behind the illustrator, who holds back on the image model
    seat.engine_arrive(request("w1", writer, "chat"))
    seat.engine_progress("image", [("s1", 1)])
    assert seat.holds("image", studio) and not seat.holds("chat", writer)
    assert not seat.holds("image", fa.Agent("t", fa.App("new")))  # a client with nothing served is behind everyone


@pytest.mark.parametrize(("policy", "models"), [
    ("fcfs", ("chat", "image")), ("rr", ("chat", "image")), ("edf", ("chat", "image")),  # no ranking by service
    ("hmfs", ("chat",)),  # a device of one model
])
def test_a_policy_that_does_not_rank_by_service_and_a_device_of_one_model_hold_nothing(policy, models):
    seat = seat_of(policy, models)
    ahead, behind = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
    seat.engine_arrive(request("a1", ahead, models[-1]))
    seat.engine_dispatch(models[-1], "a1")
    seat.engine_arrive(request("b1", behind, "chat"))
    assert not seat.holds(models[-1], ahead)


def test_devices_give_each_device_its_own_counters_and_refuse_a_bad_name():
    devices = Devices(lambda: fa.policies.make_policy("hmfs"))
    assert devices.assign("chat", "gpu0") == "gpu0" and devices.assign("image", "gpu1") == "gpu1"
    for model in ("chat", "image"):
        devices.seat(model).register(model, PROFILE)
    who = fa.Agent("t", fa.App("a"))
    devices.on_arrival(request("r1", who, "image"), 0.0)
    assert devices.queued() == 1 and devices.queued("image") == 1 and devices.queued("chat") == 0
    assert devices.select("chat", 0.0) is None and devices.select("image", 0.0).id == "r1"
    devices.on_dispatch(devices.select("image", 0.0), 0.0)
    assert devices.seat("image").served(who)[0] > 0 and devices.seat("chat").served(who) == (0.0, 0.0)
    with pytest.raises(InvalidParameterError, match="a device is a non-empty string"):
        devices.assign("vision", "")


def test_an_arbiter_puts_in_process_models_on_one_device_and_each_remote_model_on_its_own():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", FakeEngine())
    arbiter.add_model("image", FakeEngine())
    arbiter.add_model("remote", FakeEngine(shared_capacity=True))
    arbiter.add_model("gpu", FakeEngine(), device="gpu1")
    assert arbiter.devices == {"local": ["chat", "image"], "remote": ["remote"], "gpu1": ["gpu"]}
    assert arbiter.policy_of("chat") is arbiter.policy_of("image") is arbiter.policy
    assert arbiter.policy_of("remote") is not arbiter.policy and arbiter.policy_of("remote").name == "hmfs_credit"
    with pytest.raises(fa.UnknownModelError):
        arbiter.policy_of("nope")
    with pytest.raises(InvalidParameterError, match="one device's"):
        fa.Arbiter(counters="redis://127.0.0.1:1/0").add_model("x", FakeEngine(), device="gpu1")


def test_a_policy_object_that_cannot_be_copied_for_a_second_device_says_so():
    import threading

    class Locked(fa.policies.HMFS):
        def __init__(self):
            super().__init__()
            self.guard = threading.Lock()

    arbiter = fa.Arbiter(policy=Locked())
    arbiter.add_model("chat", FakeEngine())
    with pytest.raises(InvalidParameterError, match="cannot be copied for a second device"):
        arbiter.add_model("remote", FakeEngine(shared_capacity=True))


async def run_load(devices: dict[str, str], seconds: float = 0.6) -> dict[tuple[str, str], float]:
    """App a keeps both models busy, app b only 'chat'; each model runs one request at a time. Service by (app, model)."""
    arbiter = fa.Arbiter(in_flight=1, drain_timeout=1.0)
    for model, device in devices.items():
        arbiter.add_model(model, FakeEngine(tokens_per_reply=4, token_time=0.002), device=device)
    a, b = arbiter.app("a").agent("t"), arbiter.app("b").agent("t")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

    async def caller(who, model):
        while loop.time() < deadline:
            await who.chat(model, MSG, max_tokens=4)

    async with arbiter:
        await asyncio.gather(*(caller(who, model) for who, model in [(a, "chat"), (a, "image"), (b, "chat")]
                               for _ in range(3)))
    service: dict[tuple[str, str], float] = defaultdict(float)
    for charge in arbiter.ledger.charges:
        service[(charge.app, charge.model)] += charge.amount
    return service


async def test_one_device_splits_its_service_by_weight_over_both_engines():
    service = await run_load({"chat": "gpu", "image": "gpu"})
    a, b = service[("a", "chat")] + service[("a", "image")], service[("b", "chat")]
    assert a == pytest.approx(b, rel=0.15), service  # a's images count: b gets the LLM's larger part
    assert service[("b", "chat")] > 1.5 * service[("a", "chat")], service


async def test_separate_devices_keep_separate_shares():
    service = await run_load({"chat": "gpu0", "image": "gpu1"})
    assert service[("a", "chat")] == pytest.approx(service[("b", "chat")], rel=0.15), service  # images cost a nothing
    assert service[("a", "image")] > 0


# -- the device's order as a property: engines of one device on the seat, stepped by hand ----------------------------


def drive(seat: PoolPolicy, engines: dict[str, int], demand: list[tuple[str, str, str, int, int]], steps: int,
          check: bool = True) -> tuple[list[tuple[str, str]], float]:
    """Step ``engines`` (model -> slots) of ``seat``'s device; every client in ``demand`` stays backlogged.

    ``demand``: (app, agent, model, prompt, output) per client. Each step every engine
    fills its free slots with the policy's choice unless the device holds it (looking again
    while another engine's dispatch moves the counters), then every running request makes a token. Returns the dispatches (model, app) and the largest
    gap between two apps' counters seen after the first quarter of the steps.
    """
    ids = itertools.count()
    running: dict[str, dict[str, list]] = {m: {} for m in engines}
    agents = {(app, agent): fa.Agent(agent, fa.App(app)) for app, agent, *_ in demand}
    waiting = defaultdict(int)
    order, gap = [], 0.0
    for step in range(steps):
        for app, agent, model, prompt, output in demand:  # backlogged: one request waiting per client and model
            if waiting[(app, agent, model)] == 0:
                seat.engine_arrive(request(f"r{next(ids)}", agents[(app, agent)], model, prompt, output))
                waiting[(app, agent, model)] += 1
        filled = True
        while filled:  # each engine looks again once another's dispatch moved the counters (its next step)
            filled = False
            for model, slots in engines.items():
                while len(running[model]) < slots:
                    head = seat.engine_select(model)
                    if head is None or seat.holds(model, head.agent):
                        break
                    seat.engine_dispatch(model, head.id)
                    waiting[(head.agent.app.name, head.agent.name, model)] -= 1
                    running[model][head.id] = [head, head.max_tokens]
                    order.append((model, head.agent.app.name))
                    filled = True
        if check:  # no engine idles while it holds a request that may run; the least served never waits for others
            heads = {m: seat.engine_select(m) for m in engines}
            for model, head in heads.items():
                if head is not None and len(running[model]) < engines[model]:
                    assert seat.holds(model, head.agent)
            waiting_heads = [h for h in heads.values() if h is not None]
            if waiting_heads:
                least = min(waiting_heads, key=lambda h: seat.served(h.agent))
                assert not seat.holds(least.model, least.agent)
        for model, batch in running.items():
            seat.engine_progress(model, [(rid, 1) for rid in batch])
            for rid, entry in list(batch.items()):
                entry[1] -= 1
                if entry[1] == 0:
                    del batch[rid]
                    seat.engine_end(model, rid, fa.Outcome.FINISHED)
        if step > steps // 4:
            counters = [seat.served(agents[key])[0] for key in agents]
            gap = max(gap, max(counters) - min(counters))
    return order, gap


clients = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["x", "y"]),
                             st.sampled_from(["m0", "m1", "m2"]), st.integers(1, 30), st.integers(1, 12)),
                   min_size=2, max_size=6, unique_by=lambda c: (c[0], c[1], c[2]))


@settings(max_examples=60, deadline=None)
@given(demand=clients, slots=st.lists(st.integers(1, 3), min_size=3, max_size=3))
def test_a_device_serves_backlogged_apps_in_one_order_with_a_bounded_gap(demand, slots):
    engines = {f"m{i}": n for i, n in enumerate(slots)}
    seat = seat_of(models=engines)
    _, gap = drive(seat, engines, demand, steps=150)
    # the largest request priced (prompt + 2 x output), times the device's slots, plus one: a client is charged
    # at most that much after it was the least served
    biggest = max(prompt + 2 * output for *_, prompt, output in demand)
    assert gap <= (sum(slots) + 1) * biggest


@settings(max_examples=40, deadline=None)
@given(demand=clients, extra=st.integers(1, 30))
def test_service_on_another_device_changes_nothing_on_this_one(demand, extra):
    engines = {"m0": 1, "m1": 2, "m2": 1}
    alone = drive(seat_of(models=engines), engines, demand, steps=80, check=False)[0]
    seat, other = seat_of(models=engines), seat_of(models=["far"])
    app = demand[0][0]  # the first client's app is also served on a device of its own
    other.engine_arrive(request("far-1", fa.Agent("t", fa.App(app)), "far", extra, extra))
    other.engine_dispatch("far", "far-1")
    assert drive(seat, engines, demand, steps=80, check=False)[0] == alone
