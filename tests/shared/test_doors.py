"""Several arbiters (front doors), one fair share: shared counters and one capacity, live."""

import asyncio
import itertools
import time

import pytest

import fairagents as fa
from fairagents.errors import InvalidParameterError
from fairagents.shared import MemoryStore, RedisStore, SharedCounters
from fairagents.testing import FakeEngine

MSG = [{"role": "user", "content": "hi there"}]
WEIGHTS = {"heavy": 4.0, "light": 1.0}
_namespaces = itertools.count()


def doors(engine, counters):
    """Two arbiters over one engine: ``heavy`` (weight 4) calls the first only, ``light`` (1) the second."""
    made = []
    for app, shared in zip(WEIGHTS, counters, strict=True):
        arbiter = fa.Arbiter(counters=shared)
        arbiter.add_model("chat", engine)
        for name, weight in WEIGHTS.items():
            arbiter.app(name, weight=weight)
        made.append((arbiter, app))
    return made


class Load:
    """Closed-loop callers of each app at its own door; service read from both doors' ledgers."""

    def __init__(self, pairs, callers=12):
        self.pairs, self.callers = pairs, callers
        self.errors: list[BaseException] = []
        self.done = 0
        self._stop = False

    def service(self):
        out = dict.fromkeys(WEIGHTS, 0.0)
        for arbiter, _ in self.pairs:
            for app, snap in arbiter.stats().apps.items():
                out[app] += snap.service
        return out

    async def _call(self, arbiter, app):
        who = arbiter.app(app, weight=WEIGHTS[app]).agent("bot")
        while not self._stop:
            try:
                await who.chat("chat", MSG, max_tokens=8)
                self.done += 1
            except fa.FairAgentsError as err:
                self.errors.append(err)
                await asyncio.sleep(0.01)

    async def __aenter__(self):
        self.tasks = [asyncio.create_task(self._call(a, app)) for a, app in self.pairs for _ in range(self.callers)]
        return self

    async def __aexit__(self, *exc):
        self._stop = True
        try:
            await asyncio.wait_for(asyncio.gather(*self.tasks), 20)
        except TimeoutError:
            raise AssertionError(f"requests did not end: {[state(a) for a, _ in self.pairs]}") from None

    async def ratio(self, seconds):
        """heavy's service over light's, in the next ``seconds``."""
        before = self.service()
        await asyncio.sleep(seconds)
        after = self.service()
        return (after["heavy"] - before["heavy"]) / max(after["light"] - before["light"], 1e-9)


def state(arbiter):
    """What a door holds and sees, for a failure message."""
    view, model = arbiter._shared, arbiter.dispatcher.models["chat"]
    return {"door": view.door, "connected": view.connected, "lease": view._lease, "frozen": view._frozen,
            "running": model.running, "queued": arbiter.queued(), "counters": arbiter.policy.app_counters(),
            "elsewhere": view._elsewhere, "status": arbiter.counters.status()} if view else {}


async def run(pairs, warmup=0.5, window=2.0):
    for arbiter, _ in pairs:
        await arbiter.start()
    try:
        async with Load(pairs) as load:
            await asyncio.sleep(warmup)
            ratio = await load.ratio(window)
            if load.done < 50:
                raise AssertionError(f"stalled: {[state(a) for a, _ in pairs]}")
        assert not load.errors
        return ratio
    finally:
        for arbiter, _ in pairs:
            await arbiter.close(stop_engines=False)


async def watched(coro, timeout=30):
    """``coro``, or a failure listing where every task waits (a stall must not hang the suite)."""
    try:
        return await asyncio.wait_for(coro, timeout)
    except TimeoutError:
        import io

        out = io.StringIO()
        for task in asyncio.all_tasks():
            task.print_stack(limit=6, file=out)
        raise AssertionError(out.getvalue()[-6000:]) from None


def engine():
    return FakeEngine(tokens_per_reply=8, token_time=0.003, max_num_seqs=4, shared_capacity=True)


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_two_doors_each_seeing_one_app_serve_it_four_to_one(store, redis_server):
    shared = MemoryStore() if store == "memory" else None
    counters = [SharedCounters(shared or RedisStore(redis_server.url, namespace=f"doors-{next(_namespaces)}-{store}"),
                               door=f"door-{i}", interval=0.002) for i in range(2)]
    if shared is None:  # both doors name the same Redis namespace
        counters[1] = SharedCounters(RedisStore(redis_server.url, namespace=counters[0].store.namespace),
                                     door="door-1", interval=0.002)
    fake = engine()
    ratio = await watched(run(doors(fake, counters)))
    assert 3.6 <= ratio <= 4.4, ratio
    assert fake.max_running <= 4  # the doors together never hand the engine more than its slots


async def test_with_counters_kept_per_door_the_share_collapses_to_the_doors_split():
    fake = engine()
    ratio = await run(doors(fake, [None, None]))
    assert 0.8 <= ratio <= 1.25, ratio
    assert fake.max_running == 8  # each door filled the engine's slots on its own


async def test_redis_stopped_and_restarted_mid_run_service_goes_on_and_the_share_recovers(own_redis):
    namespace = "outage"
    counters = [SharedCounters(RedisStore(own_redis.url, namespace=namespace, timeout=0.2), door=f"door-{i}",
                               interval=0.002) for i in range(2)]
    pairs = doors(engine(), counters)
    for arbiter, _ in pairs:
        await arbiter.start()
    try:
        async with Load(pairs) as load:
            await asyncio.sleep(0.5)
            assert all(c.connected for c in counters)
            own_redis.stop()  # its data is gone with it (no persistence)
            await asyncio.sleep(0.5)
            assert not any(c.connected for c in counters)
            assert all(c.status()["connected"] is False for c in counters)
            served = load.done
            await asyncio.sleep(0.5)
            assert load.done > served + 20  # each door serves on its own meanwhile
            own_redis.start()  # same port, empty
            deadline = time.monotonic() + 10
            while not all(c.connected for c in counters):
                assert time.monotonic() < deadline, [c.status() for c in counters]
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            ratio = await load.ratio(2.0)
        assert not load.errors
        assert 3.6 <= ratio <= 4.4, ratio
        assert all(c.failures > 0 for c in counters)
    finally:
        for arbiter, _ in pairs:
            await arbiter.close(stop_engines=False)


async def test_a_door_that_stops_syncing_stops_holding_the_others_back():
    store = MemoryStore()
    fake = FakeEngine(manual=True, max_num_seqs=2, shared_capacity=True)
    a = fa.Arbiter(counters=SharedCounters(store, door="a", interval=0.002, ttl=0.2))
    b = fa.Arbiter(counters=SharedCounters(store, door="b", interval=0.002, ttl=0.2))
    for arbiter in (a, b):
        arbiter.add_model("chat", fake)
        arbiter.app("x")
    await a.start()
    await b.start()
    try:
        first = [asyncio.create_task(a.app("x").agent("t").chat("chat", MSG, max_tokens=4)) for _ in range(2)]
        await asyncio.sleep(0.05)
        assert len(fake.running) == 2
        a.counters._task.cancel()  # a stops syncing (hung or cut off), its requests still hold the slots
        later = asyncio.create_task(b.app("x").agent("t").chat("chat", MSG, max_tokens=4))
        await asyncio.sleep(0.1)
        assert len(fake.running) == 2  # b waits: a's lease still counts
        await asyncio.sleep(0.3)
        assert len(fake.running) == 3  # a's snapshot expired: b takes a slot
        for rid in list(fake.running):
            fake.emit(rid, 1, finish="stop")
        await asyncio.gather(*first, later)
    finally:
        await b.close(stop_engines=False)
        a.counters._task = None
        await a.close(stop_engines=False)


def test_shared_counters_need_hmfs_and_check_their_settings():
    with pytest.raises(InvalidParameterError, match="'hmfs' policy"):
        fa.Arbiter(policy="fcfs", counters="redis://127.0.0.1:6379/0")
    with pytest.raises(InvalidParameterError, match="redis://"):
        fa.Arbiter(counters="postgres://db")
    with pytest.raises(InvalidParameterError, match="ttl"):
        SharedCounters(MemoryStore(), interval=1.0, ttl=0.5)
    arbiter = fa.Arbiter(counters="redis://user:pw@127.0.0.1:6390/2")
    assert arbiter.counters.describe() == "redis://127.0.0.1:6390/2"  # no credentials in logs or /health


async def test_an_unreachable_store_at_start_does_not_stop_the_door():
    from tests._vllm_servers import free_port

    counters = SharedCounters(f"redis://127.0.0.1:{free_port()}/0", interval=0.005, timeout=0.1)
    arbiter = fa.Arbiter(counters=counters)
    arbiter.add_model("chat", FakeEngine(shared_capacity=True))
    async with arbiter:
        reply = await arbiter.app("x").agent("t").chat("chat", MSG, max_tokens=4)
        assert reply.usage.completion_tokens == 4
        assert counters.status()["connected"] is False and counters.failures >= 1
