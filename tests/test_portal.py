"""Portal: calling an arbiter from its own loop, another loop, another thread, or sync code."""

import asyncio
import threading
import time

import pytest

import fairagents as fa
from fairagents.errors import ProtocolError
from fairagents.portal import Portal
from fairagents.testing import FakeEngine

MSG = [{"role": "user", "content": "hi"}]


def make(**engine):
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", FakeEngine(**engine))
    return arbiter, arbiter.app("a").agent("bot")


def test_sync_code_with_no_loop_starts_the_arbiter_on_the_portals_thread_and_closes_it():
    arbiter, bot = make()
    portal = Portal(arbiter)
    assert portal.run_sync(bot.chat, "chat", MSG, max_tokens=3).usage.completion_tokens == 3
    assert [d.text for d in portal.iterate_sync(bot.stream_chat, "chat", MSG, max_tokens=2)] == ["t0 ", "t1 "]
    assert portal.owns_loop and arbiter.loop.is_running()
    engine = arbiter.engine("chat")
    portal.close()
    assert not portal.owns_loop and not engine.started  # the arbiter was closed, its engine stopped
    portal.close()  # idempotent


def test_calls_from_another_loop_run_on_the_arbiters_loop():
    arbiter, bot = make()
    portal = Portal(arbiter)
    try:
        async def elsewhere():
            reply = await portal.run(bot.chat, "chat", MSG, max_tokens=2)
            deltas = [d async for d in portal.iterate(bot.stream_chat, "chat", MSG, max_tokens=3)]
            return reply, deltas

        for _ in range(2):  # two different loops, one after the other
            reply, deltas = asyncio.run(elsewhere())
            assert reply.text == "t0 t1 " and len(deltas) == 3
        assert arbiter.loop is not None and arbiter.stats().apps["a"].done == 4
    finally:
        portal.close()


def test_cancelling_the_caller_cancels_the_request_on_the_arbiters_loop():
    arbiter, bot = make(token_time=0.05, tokens_per_reply=100)
    portal = Portal(arbiter)
    try:
        async def caller():
            task = asyncio.ensure_future(portal.run(bot.chat, "chat", MSG, max_tokens=100))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(caller())
        deadline = time.monotonic() + 5
        while arbiter.stats().apps["a"].cancelled != 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert arbiter.stats().apps["a"].in_flight == 0  # the engine's slot was freed
    finally:
        portal.close()


def test_leaving_a_sync_stream_early_cancels_its_request():
    arbiter, bot = make(token_time=0.01, tokens_per_reply=100)
    portal = Portal(arbiter)
    try:
        stream = portal.iterate_sync(bot.stream_chat, "chat", MSG, max_tokens=100)
        assert next(stream).text == "t0 "
        stream.close()
        assert arbiter.stats().apps["a"].cancelled == 1
    finally:
        portal.close()


async def test_on_the_arbiters_own_loop_calls_are_awaited_directly_and_sync_calls_refused():
    arbiter, bot = make()
    async with arbiter:
        portal = Portal(arbiter)
        assert (await portal.run(bot.chat, "chat", MSG, max_tokens=1)).text == "t0 "
        with pytest.raises(ProtocolError, match="use the async API"):
            portal.run_sync(bot.chat, "chat", MSG)
        assert not portal.owns_loop


def test_a_thread_calls_an_arbiter_whose_loop_runs_elsewhere():
    arbiter, bot = make()
    results = []

    async def main():
        async with arbiter:
            worker = threading.Thread(target=lambda: results.append(
                Portal(arbiter).run_sync(bot.chat, "chat", MSG, max_tokens=2).text))
            worker.start()
            await asyncio.to_thread(worker.join)

    asyncio.run(main())
    assert results == ["t0 t1 "]


def test_an_arbiter_whose_loop_ended_says_so_instead_of_hanging():
    arbiter, bot = make()

    async def main():
        await arbiter.start()  # never closed: its loop ends with asyncio.run

    asyncio.run(main())
    portal = Portal(arbiter)
    with pytest.raises(fa.ShutdownError, match="not running"):
        portal.run_sync(bot.chat, "chat", MSG)
    with pytest.raises(fa.ShutdownError, match="not running"):
        asyncio.run(portal.run(bot.chat, "chat", MSG))


def test_bad_input_through_the_portal_is_the_same_typed_error():
    arbiter, bot = make()
    portal = Portal(arbiter)
    try:
        with pytest.raises(fa.UnknownModelError):
            portal.run_sync(bot.chat, "nope", MSG)
        with pytest.raises(fa.InvalidParameterError):
            asyncio.run(portal.run(bot.chat, "chat", MSG, max_tokens=0))
    finally:
        portal.close()
