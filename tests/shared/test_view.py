"""SharedView on its own: what a door sends, takes back, and lets through."""

import fairagents as fa
from fairagents.dispatcher import Dispatcher
from fairagents.shared import MemoryStore, SharedView


def door(name, store, store_models=("chat",), slots=4):
    """A door's view and dispatcher, joined to ``store`` (its first sync done, as an arbiter's start does)."""
    cost = fa.UnifiedTokenCost()
    policy = fa.policies.HMFS(cost)
    view = SharedView(name, policy)
    dispatcher = Dispatcher(policy, cost, charge=lambda now, r, amount: view.charge(r, amount), gate=view.gate)
    dispatcher.add_model("chat", fa.ModelProfile(d_model=4096, n_layers=1), slots=slots, token_budget=None,
                         max_model_len=1000)
    view.bind(dispatcher, set(store_models))
    view.apply(store.apply(view.payload(ttl=1000)))
    return view, dispatcher


def request(rid, app, agent="bot", weight=1.0):
    return fa.Request(rid, fa.Agent(agent, fa.App(app, weight=weight)), "chat", prompt_tokens=10, max_tokens=10,
                      arrival=0.0)


def test_a_door_sends_its_charges_once_and_takes_the_pools_counters():
    store = MemoryStore(clock=lambda: 0.0)
    view, d = door("a", store)
    d.arrive(request("r1", "x", weight=2.0), now=0.0)  # runs at once: 10 tokens charged, 5 counter units
    payload = view.payload(ttl=1000)
    assert payload["apps"] == {"x": 5.0} and payload["agents"] == {"x": {"bot": 10.0}}
    assert payload["running"] == {"chat": [1, 20]} and payload["want"] == {"x": ["bot"]}
    reply = store.apply(payload)
    view.apply(reply)
    assert view.payload(ttl=1000)["apps"] == {}  # acknowledged: not sent again
    store.apps["x"] = 50.0  # another door charged x meanwhile
    view.apply(store.apply(view.payload(ttl=1000)))
    assert view.policy.counters_of(fa.Agent("bot", fa.App("x", weight=2.0)))[0] == 50.0


def test_a_payload_without_a_reply_is_sent_again_with_the_same_charges():
    store = MemoryStore(clock=lambda: 0.0)
    view, d = door("a", store)
    d.arrive(request("r1", "x"), now=0.0)
    first = view.payload(ttl=1000)
    d.progress("r1", 3, now=1.0)  # charged after the payload left
    again = view.payload(ttl=1000)
    assert (again["seq"], again["apps"]) == (first["seq"], first["apps"])
    view.apply(store.apply(again))
    later = view.payload(ttl=1000)
    assert later["seq"] == first["seq"] + 1 and later["apps"] == {"x": 6.0}


def test_without_the_turn_a_door_starts_only_what_it_was_granted():
    store = MemoryStore(clock=lambda: 0.0)
    b, db = door("b", store)  # alone in the pool: its lease is every idle slot
    a, da = door("a", store)
    store.apps.update({"heavy": 0.0, "light": 100.0})
    for i in range(6):
        db.arrive(request(f"l{i}", "light"), now=0.0)  # b runs 4 on its lease
    b.apply(store.apply(b.payload(ttl=1000)))
    for i in range(6):
        da.arrive(request(f"h{i}", "heavy"), now=0.0)
    a.apply(store.apply(a.payload(ttl=1000)))
    assert a.leases()["chat"] == {"slots": 0, "turn": True, "elsewhere": 4}
    b.apply(store.apply(b.payload(ttl=1000)))
    assert b.leases()["chat"] == {"slots": 4, "turn": False, "elsewhere": 0}
    for i in range(4):
        db.finish(f"l{i}", now=1.0)  # light is not the lowest: b may not reuse its slots
    assert db.models["chat"].running == 0
    b.apply(store.apply(b.payload(ttl=1000)))
    assert b.leases()["chat"]["slots"] == 0 and not b.leases()["chat"]["turn"]
    a.apply(store.apply(a.payload(ttl=1000)))
    assert [t.request.id for t in da.refill(now=1.0).started] == ["h0", "h1", "h2", "h3"]


def test_the_lift_floor_takes_clients_active_at_other_doors():
    store = MemoryStore(clock=lambda: 0.0)
    view, d = door("a", store)
    store.apply({"door": "b", "seq": 1, "ttl": 1000, "apps": {"y": 40.0}, "agents": {"y": {"t": 40.0}},
                 "waiting": {"chat": {"y": {"t": 1}}}, "running": {}, "want": {}})
    d.arrive(request("r0", "x"), now=0.0)
    view.apply(store.apply(view.payload(ttl=1000)))
    d.finish("r0", now=0.0)
    d.arrive(request("r1", "z"), now=0.0)  # z becomes active here: lifted to y's 40 (active at b), not 0
    assert view.policy.counters_of(fa.Agent("bot", fa.App("z")))[0] >= 40.0


def test_a_lost_store_leaves_the_door_on_its_own_limits():
    store = MemoryStore(clock=lambda: 0.0)
    view, d = door("a", store)
    store.apply({"door": "b", "seq": 1, "ttl": 1000, "apps": {}, "agents": {}, "waiting": {"chat": {"y": {"t": 9}}},
                 "running": {"chat": [4, 0]}, "limits": {"chat": 4}, "want": {}})
    view.apply(store.apply(view.payload(ttl=1000)))
    assert d.arrive(request("r1", "x"), now=0.0).started == []  # b holds every slot
    view.disconnected()
    assert [t.request.id for t in d.refill(now=0.0).started] == ["r1"]
    d.progress("r1", 2, now=0.1)
    assert view.payload(ttl=1000)["apps"] == {}  # charged while apart: never sent
