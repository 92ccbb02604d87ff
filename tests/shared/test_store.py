"""The sync protocol: the reference store's rules, and the Redis script giving the same replies."""

import asyncio
import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairagents.errors import InvalidParameterError
from fairagents.shared import MemoryStore, RedisStore, StoreUnavailable

_namespaces = itertools.count()


def payload(door, seq, *, apps=None, agents=None, waiting=None, running=None, limits=None, want=None, ttl=10_000,
            **extra):
    p = {"door": door, "seq": seq, "ttl": ttl, "apps": apps or {}, "agents": agents or {}, "waiting": waiting or {},
         "running": running or {}, "limits": limits or {}, "want": want or {}}
    p.update(extra)
    return p


def test_a_client_becoming_active_is_lifted_to_the_lowest_active_counter():
    store = MemoryStore(clock=lambda: 0.0)
    store.apply(payload("a", 1, apps={"x": 10.0, "z": 4.0}, waiting={"m": {"x": {"t": 1}, "z": {"t": 1}}}))
    reply = store.apply(payload("b", 1, waiting={"m": {"y": {"t": 1}}}, want={"y": ["t"]}))
    assert reply["apps"]["y"] == 4.0  # min over x (10) and z (4), active before
    assert reply["floor"]["apps"] == 4.0


def test_with_none_active_a_client_is_lifted_to_the_last_to_leave():
    store = MemoryStore(clock=lambda: 0.0)
    store.apply(payload("a", 1, apps={"x": 7.0}, agents={"x": {"t": 7.0}}, waiting={"m": {"x": {"t": 1}}}))
    store.apply(payload("a", 2))  # x stops waiting: it is the last to leave
    assert store.left[""] == "x" and store.left["x"] == "t"
    reply = store.apply(payload("b", 1, waiting={"m": {"y": {"u": 1}}}, want={"y": ["u"]}))
    assert reply["apps"]["y"] == 7.0
    again = store.apply(payload("a", 3, waiting={"m": {"x": {"s": 1}}}, want={"x": ["s", "t"]}))
    assert again["agents"]["x"] == {"s": 7.0, "t": 7.0}  # the new agent of x: lifted to t, who left last


def test_an_active_client_is_not_lifted_and_counters_never_fall():
    store = MemoryStore(clock=lambda: 0.0)
    store.apply(payload("a", 1, apps={"x": 1.0}, waiting={"m": {"x": {"t": 1}}}))
    store.apply(payload("b", 1, apps={"y": 50.0}, waiting={"m": {"y": {"t": 1}}}))
    reply = store.apply(payload("a", 2, waiting={"m": {"x": {"t": 2}}}, want={"x": ["t"]}))
    assert reply["apps"]["x"] == 1.0  # it stayed active: no lift
    raised = store.apply(payload("a", 3, want={"x": []}, **{"raise": {"apps": {"x": 0.5}}}))
    assert raised["apps"]["x"] == 1.0


def test_a_payload_sent_again_adds_its_charges_once():
    store = MemoryStore(clock=lambda: 0.0)
    first = payload("a", 1, apps={"x": 3.0}, agents={"x": {"t": 6.0}}, want={"x": ["t"]})
    store.apply(first)
    reply = store.apply(first)  # the reply was lost and the door sent it again
    assert reply["apps"] == {"x": 3.0} and reply["agents"] == {"x": {"t": 6.0}}
    assert store.apply(payload("a", 2, apps={"x": 1.0}, want={"x": []}))["apps"] == {"x": 4.0}


def test_a_door_that_stops_syncing_stops_counting():
    now = [0.0]
    store = MemoryStore(clock=lambda: now[0])
    store.apply(payload("a", 1, ttl=500, waiting={"m": {"x": {"t": 3}}}, running={"m": [4, 100]}))
    seen = store.apply(payload("b", 1, ttl=500))
    assert seen["others"]["m"] == [4, 100] and seen["doors"] == 2
    now[0] = 0.6
    later = store.apply(payload("b", 2, ttl=500))
    assert later["others"] == {} and later["doors"] == 1


def test_leases_give_the_free_slots_to_the_lowest_counter_and_never_exceed_the_model():
    store = MemoryStore(clock=lambda: 0.0)
    b = store.apply(payload("b", 1, apps={"light": 5.0}, waiting={"m": {"light": {"t": 6}}}, limits={"m": 4}))
    assert b["lease"] == {"m": 4}  # alone: every slot
    a = store.apply(payload("a", 1, apps={"heavy": 10.0}, waiting={"m": {"heavy": {"t": 6}}}, limits={"m": 4}))
    assert a["lease"] == {"m": 0}  # b holds them all
    b = store.apply(payload("b", 2, apps={"light": 20.0}, running={"m": [4, 0]}, waiting={"m": {"light": {"t": 2}}},
                            limits={"m": 4}))
    assert b["lease"] == {"m": 4}  # it keeps what it runs
    b = store.apply(payload("b", 3, running={"m": [1, 0]}, waiting={"m": {"light": {"t": 5}}}, limits={"m": 4}))
    assert b["lease"] == {"m": 1}  # light (25) is above heavy (10): the three slots it freed are not its to keep
    a = store.apply(payload("a", 2, waiting={"m": {"heavy": {"t": 6}}}, limits={"m": 4}))
    assert a["lease"] == {"m": 3}  # heavy's turn: the free slots go to it


def test_idle_slots_are_split_among_the_doors():
    store = MemoryStore(clock=lambda: 0.0)
    store.apply(payload("a", 1))
    b = store.apply(payload("b", 1, limits={"m": 8}))
    assert b["lease"] == {"m": 4}
    a = store.apply(payload("a", 2, limits={"m": 8}))
    assert a["lease"] == {"m": 2}  # half of the 4 b does not hold; the rest waits for the next syncs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 6), st.integers(0, 5), st.sampled_from(["x", "y", "z"]),
                          st.floats(0, 20)), min_size=1, max_size=30))
def test_leases_never_add_up_to_more_than_the_slots(steps):
    store = MemoryStore(clock=lambda: 0.0)
    lease = {d: 0 for d in "abc"}
    running = {d: 0 for d in "abc"}
    seq = itertools.count(1)
    for door_i, wait, run_wish, app, charge in steps:
        door = "abc"[door_i]
        running[door] = min(run_wish, max(lease[door], running[door]))  # a door runs no more than its lease
        reply = store.apply(payload(door, next(seq), apps={app: charge}, running={"m": [running[door], 0]},
                                    waiting={"m": {app: {"t": wait}}} if wait else {}, limits={"m": 5}))
        lease[door] = reply["lease"]["m"]
        assert lease[door] >= running[door]
        assert sum(max(lease[d], running[d]) for d in "abc") <= 5


def test_a_redis_store_checks_its_settings():
    with pytest.raises(InvalidParameterError, match="redis://"):
        RedisStore("127.0.0.1:6379")
    with pytest.raises(InvalidParameterError, match="namespace"):
        RedisStore("redis://127.0.0.1", namespace="{x}")
    with pytest.raises(InvalidParameterError, match="timeout"):
        RedisStore("redis://127.0.0.1", timeout=0)
    assert isinstance(InvalidParameterError("x"), ValueError)


async def test_an_unreachable_redis_is_a_store_unavailable_error():
    from tests._vllm_servers import free_port

    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2)
    with pytest.raises(StoreUnavailable, match="unreachable"):
        await store.sync(payload("a", 1))
    await store.close()


def same(got, expected):
    """Equal, numbers within 1e-9: Redis keeps counters to 17 decimals and its JSON to 14 digits."""
    if isinstance(expected, dict):
        return isinstance(got, dict) and got.keys() == expected.keys() and all(same(got[k], v) for k, v in expected.items())
    if isinstance(expected, list | tuple):
        return isinstance(got, list) and len(got) == len(expected) and all(map(same, got, expected))
    if isinstance(expected, int | float) and not isinstance(expected, bool):
        return isinstance(got, int | float) and math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
    return got == expected


names = st.sampled_from(["x", "y", "z"])
agent_names = st.sampled_from(["t", "u"])
# Charges as counters see them: unified tokens over weights, far above Redis's 17 decimals.
charges = st.integers(0, 4000).map(lambda n: n / 40)
door_payloads = st.tuples(
    st.sampled_from(["a", "b", "c"]),
    st.dictionaries(names, charges, max_size=3),
    st.dictionaries(names, st.dictionaries(agent_names, charges, max_size=2), max_size=2),
    st.dictionaries(st.sampled_from(["m", "n"]), st.dictionaries(names, st.dictionaries(agent_names, st.integers(1, 3),
                                                                                          min_size=1, max_size=2),
                                                                  min_size=1, max_size=2), max_size=2),
    st.integers(0, 4),
    st.booleans(),
    st.booleans(),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(door_payloads, min_size=1, max_size=12))
def test_the_redis_script_gives_the_reference_stores_replies(redis_server, steps):
    store = RedisStore(redis_server.url, namespace=f"equal-{next(_namespaces)}")
    memory = MemoryStore(clock=lambda: 0.0)
    seqs = {d: 0 for d in "abc"}

    async def play():
        try:
            for door, apps, agents, waiting, running, resend, reconcile in steps:
                if not (resend and seqs[door]):
                    seqs[door] += 1
                want = {a: sorted({g for of_app in agents.values() for g in of_app} | {"t"}) for a in ("x", "y")}
                p = payload(door, seqs[door], apps=apps, agents=agents, waiting=waiting,
                            running={"m": [running, 10 * running]} if running else {}, limits={"m": 4}, want=want)
                if reconcile:
                    p["raise"] = {"apps": {a: v / 2 for a, v in apps.items()}, "agents": {}}
                expected = memory.apply(p)
                got = await store.sync(p)
                assert same(got, expected), (p, got, expected)
        finally:
            await store.close()

    asyncio.run(play())


async def test_keys_share_one_cluster_hash_slot(redis_server):
    store = RedisStore(redis_server.url, namespace="slots")
    tags = {key[key.index("{"):key.index("}") + 1] for key in store.keys}
    assert tags == {"{fairagents:slots}"}
    await store.sync(payload("a", 1, apps={"x": 1.5}, waiting={"m": {"x": {"t": 1}}}, want={"x": ["t"]}))
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_server.url)
    try:
        assert math.isclose(float(await client.hget(store.keys[0], "x")), 1.5)
        assert await client.hexists(store.keys[2], "a")
        await store.leave("a")
        assert not await client.hexists(store.keys[2], "a")
    finally:
        await client.aclose()
        await store.close()
