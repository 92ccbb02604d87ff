"""Portal: calling an arbiter from its own loop, another loop, another thread, or sync code."""

import os
import signal
import asyncio
import subprocess
import sys
import threading
import time

import pytest

import fairagents as fa
from fairagents.errors import ProtocolError
from fairagents.runtime import portal as portal_module
from fairagents.runtime.portal import Portal
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


class SlowStart(FakeEngine):
    """Takes a while to start, and counts its starts (on which loops)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.starts: list[asyncio.AbstractEventLoop] = []

    async def start(self):
        self.starts.append(asyncio.get_running_loop())
        await asyncio.sleep(0.3)
        await super().start()


def test_portals_on_two_threads_start_the_arbiter_once():
    arbiter = fa.Arbiter()
    engine = SlowStart()
    arbiter.add_model("chat", engine)
    bot = arbiter.app("a").agent("bot")
    portals = [Portal(arbiter), Portal(arbiter)]  # as a chat model and an OpenAI client each make one
    before = _loop_threads()
    barrier = threading.Barrier(2)
    texts = []

    def first_call(portal):
        barrier.wait()
        texts.append(portal.run_sync(bot.chat, "chat", MSG, max_tokens=1).text)

    threads = [threading.Thread(target=first_call, args=(p,)) for p in portals]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert texts == ["t0 ", "t0 "]
        assert len(engine.starts) == 1
        assert sum(p.owns_loop for p in portals) == 1
        assert len(_loop_threads() - before) == 1
    finally:
        for p in portals:
            p.close()
    assert not engine.started


def test_a_call_while_the_arbiter_starts_on_the_users_loop_waits_for_that_start():
    arbiter = fa.Arbiter()
    engine = SlowStart()
    arbiter.add_model("chat", engine)
    bot = arbiter.app("a").agent("bot")
    portal = Portal(arbiter)
    results = []

    async def main():
        starting = asyncio.ensure_future(arbiter.start())
        await asyncio.sleep(0.05)  # the engine is starting now
        assert not engine.started and arbiter.loop is asyncio.get_running_loop()
        worker = threading.Thread(target=lambda: results.append(portal.run_sync(bot.chat, "chat", MSG, max_tokens=1)))
        worker.start()
        # a second start on the same loop waits for the first, and an in-loop call too
        await asyncio.gather(starting, arbiter.start())
        results.append(await portal.run(bot.chat, "chat", MSG, max_tokens=1))
        await asyncio.to_thread(worker.join)
        await arbiter.close()

    asyncio.run(main())
    assert [r.text for r in results] == ["t0 ", "t0 "]
    assert len(engine.starts) == 1 and not portal.owns_loop


def test_a_failed_start_leaves_no_loop_and_the_next_call_tries_again():
    arbiter = fa.Arbiter()
    engine = SlowStart()
    arbiter.add_model("chat", engine)
    bot = arbiter.app("a").agent("bot")

    async def broken_start():
        raise RuntimeError("no memory")

    original, engine.start = engine.start, broken_start
    portal = Portal(arbiter)
    with pytest.raises(RuntimeError, match="no memory"):
        portal.run_sync(bot.chat, "chat", MSG, max_tokens=1)
    assert arbiter.loop is None and not portal.owns_loop
    engine.start = original
    try:
        assert portal.run_sync(bot.chat, "chat", MSG, max_tokens=1).text == "t0 "
    finally:
        portal.close()


def test_interrupting_a_sync_call_cancels_its_request():
    arbiter, bot = make(token_time=0.05, tokens_per_reply=100)
    portal = Portal(arbiter)
    try:
        portal.run_sync(bot.chat, "chat", MSG, max_tokens=1)  # started
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()  # Ctrl-C while the call waits
        with pytest.raises(KeyboardInterrupt):
            portal.run_sync(bot.chat, "chat", MSG, max_tokens=100)
        _until(lambda: arbiter.stats().apps["a"].cancelled == 1)
        assert arbiter.stats().apps["a"].in_flight == 0
    finally:
        portal.close()


def test_interrupting_a_sync_stream_mid_step_closes_it_on_the_arbiters_loop():
    arbiter, bot = make(token_time=0.05, tokens_per_reply=100)
    closed = []

    async def watched(*args, **kwargs):
        try:
            async for delta in bot.stream_chat(*args, **kwargs):
                yield delta
        finally:
            closed.append(True)

    portal = Portal(arbiter)
    try:
        stream = portal.iterate_sync(watched, "chat", MSG, max_tokens=100)
        assert next(stream).text == "t0 "
        threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGINT)).start()  # lands while a next step waits on the loop
        with pytest.raises(KeyboardInterrupt):
            for _ in stream:
                pass
        stream.close()
        assert closed == [True]  # the iterator was closed, not left "already running"
        _until(lambda: arbiter.stats().apps["a"].cancelled == 1)
        assert arbiter.stats().apps["a"].in_flight == 0
    finally:
        portal.close()


def test_a_portal_dropped_without_close_still_stops_its_engines_at_exit(tmp_path):
    """The loop thread a portal started is closed at exit even with no reference left, and
    an engine's stop that needs a worker thread (as vLLM's does) still gets one."""
    marker = tmp_path / "stopped"
    script = f"""
import asyncio, gc
import fairagents as fa
from fairagents.runtime import portal as portal_module
from fairagents.runtime.portal import Portal
from fairagents.testing import FakeEngine

class Engine(FakeEngine):
    async def stop(self):
        await asyncio.to_thread(open({str(marker)!r}, "w").close)
        await super().stop()

arbiter = fa.Arbiter()
arbiter.add_model("chat", Engine())
Portal(arbiter).run_sync(arbiter.app("a").agent("b").chat, "chat", [{{"role": "user", "content": "hi"}}], max_tokens=1)
gc.collect()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert marker.exists(), done.stderr


def _loop_threads():
    return {t for t in threading.enumerate() if t.name == "fairagents-arbiter"}


def _until(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_an_arbiter_closed_with_its_loop_is_started_again_by_the_next_portal():
    arbiter, bot = make()

    async def main():
        async with arbiter:
            return (await bot.chat("chat", MSG, max_tokens=1)).text

    assert asyncio.run(main()) == "t0 "  # started and closed on a loop that has ended since
    for _ in range(2):  # two portals (two clients' lifetimes), one after the other
        portal = Portal(arbiter)
        try:
            assert portal.run_sync(bot.chat, "chat", MSG, max_tokens=2).text == "t0 t1 "
            assert portal.owns_loop
        finally:
            portal.close()
    assert arbiter.stats().apps["a"].done >= 1


def test_ctrl_c_while_the_portal_starts_the_arbiter_leaves_nothing_running_and_the_next_call_starts_it():
    arbiter = fa.Arbiter()
    engine = SlowStart()
    arbiter.add_model("chat", engine)
    bot = arbiter.app("a").agent("bot")
    portal = Portal(arbiter)
    before = _loop_threads()
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()  # mid-start
    with pytest.raises(KeyboardInterrupt):
        portal.run_sync(bot.chat, "chat", MSG, max_tokens=1)
    assert not engine.started and arbiter.loop is None and not portal.owns_loop
    assert _loop_threads() == before  # its loop thread ended
    try:
        assert portal.run_sync(bot.chat, "chat", MSG, max_tokens=1).text == "t0 "
    finally:
        portal.close()


def test_calls_racing_a_close_end_with_shutdown_error_and_none_waits_forever():
    for _ in range(5):
        arbiter, bot = make()
        owner = Portal(arbiter)
        owner.start()
        stop, outcomes = threading.Event(), []

        def caller():
            portal = Portal(arbiter)
            while not stop.is_set():
                try:
                    portal.run_sync(bot.chat, "chat", MSG, max_tokens=1)
                    outcomes.append("ok")
                except fa.ShutdownError:
                    outcomes.append("shutdown")
            portal.close()  # it may have started the arbiter again after the close

        threads = [threading.Thread(target=caller, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.05)
        owner.close()
        stop.set()
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads)  # none stuck in run_sync
        assert set(outcomes) <= {"ok", "shutdown"} and "ok" in outcomes


def test_an_async_caller_keeps_its_loop_while_another_thread_starts_the_arbiter():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", SlowStart())
    bot = arbiter.app("a").agent("bot")
    starter = threading.Thread(target=Portal(arbiter).start)
    starter.start()
    while arbiter.loop is None:
        time.sleep(0.005)

    async def elsewhere():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        reply = await Portal(arbiter).run(bot.chat, "chat", MSG, max_tokens=1)  # waits out the 0.3 s start
        ticker.cancel()
        return reply, ticks

    reply, ticks = asyncio.run(elsewhere())
    starter.join()
    try:
        assert reply.text == "t0 " and ticks >= 5  # the caller's loop ran on meanwhile
    finally:
        for p in list(portal_module._owned):
            p.close()


async def test_a_second_start_waiting_on_a_failed_one_fails_too():
    arbiter = fa.Arbiter()

    class Broken(FakeEngine):
        async def start(self):
            await asyncio.sleep(0.05)
            raise fa.EngineError("no memory")

    arbiter.add_model("chat", Broken())
    first, second = await asyncio.gather(arbiter.start(), arbiter.start(), return_exceptions=True)
    assert isinstance(first, fa.EngineError)
    assert isinstance(second, fa.ShutdownError) and "no memory" in str(second)
    assert arbiter.loop is None


def test_closing_a_portal_from_the_arbiters_own_loop_is_refused_not_a_deadlock():
    arbiter, _ = make()
    portal = Portal(arbiter)
    portal.start()

    async def close_there():
        portal.close()

    try:
        with pytest.raises(ProtocolError, match="would block"):
            asyncio.run_coroutine_threadsafe(close_there(), arbiter.loop).result(timeout=5)
        assert portal.owns_loop
    finally:
        portal.close()


def test_a_thread_still_calling_at_exit_gets_shutdown_error_and_the_program_ends(tmp_path):
    script = """
import sys, threading, time
import fairagents as fa
from fairagents.runtime import portal as portal_module
from fairagents.runtime.portal import Portal
from fairagents.testing import FakeEngine

arbiter = fa.Arbiter()
arbiter.add_model("chat", FakeEngine(token_time=0.02))
bot = arbiter.app("a").agent("b")
portal = Portal(arbiter)

def worker():   # not joined by the main thread: Python waits for it at exit
    for _ in range(20):
        try:
            portal.run_sync(bot.chat, "chat", [{"role": "user", "content": "hi"}], max_tokens=2)
            print("ok", file=sys.stderr, flush=True)   # stdout has the arbiter's log lines
        except fa.ShutdownError:
            print("shutdown", file=sys.stderr, flush=True)

portal.start()
threading.Thread(target=worker).start()
time.sleep(0.1)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.split() if line in ("ok", "shutdown")]
    assert len(lines) == 20 and lines[-1] == "shutdown"  # none waits forever
    assert "ok" not in lines[lines.index("shutdown"):]  # and the arbiter is not started again after the exit's close


def test_a_closed_portal_refuses_calls_and_starts_nothing():
    arbiter, bot = make()
    portal = Portal(arbiter)
    portal.close()  # before any call: nothing to close, but the portal is closed
    with pytest.raises(fa.ShutdownError, match="portal is closed"):
        portal.run_sync(bot.chat, "chat", MSG, max_tokens=1)
    with pytest.raises(fa.ShutdownError, match="portal is closed"):
        asyncio.run(portal.run(bot.chat, "chat", MSG, max_tokens=1))
    assert not arbiter.engine("chat").started and arbiter.loop is None


def test_a_call_left_running_by_a_close_ends_with_shutdown_error_within_a_bounded_time(monkeypatch):
    monkeypatch.setattr(portal_module, "_SETTLE", 0.3)
    arbiter, _ = make()
    portal = Portal(arbiter)
    portal.start()
    outcome = []

    def caller():  # a call the arbiter's close does not end (not a request: the arbiter cannot abort it)
        try:
            portal.run_sync(asyncio.sleep, 100)
        except BaseException as err:  # noqa: BLE001
            outcome.append(type(err))

    worker = threading.Thread(target=caller)
    worker.start()
    time.sleep(0.1)
    began = time.monotonic()
    portal.close()
    worker.join(5)
    assert outcome == [fa.ShutdownError] and time.monotonic() - began < 3


def test_a_sync_call_whose_loop_ends_under_it_is_a_shutdown_error():
    arbiter, bot = make(token_time=0.05, tokens_per_reply=200)
    up = threading.Event()

    async def main():  # the user's loop: it returns without closing the arbiter, while a call runs
        await arbiter.start()
        up.set()
        await asyncio.sleep(0.3)

    owner = threading.Thread(target=asyncio.run, args=(main(),))
    owner.start()
    up.wait()
    with pytest.raises(fa.ShutdownError, match="ended before the call did"):
        Portal(arbiter).run_sync(bot.chat, "chat", MSG, max_tokens=200)
    owner.join()


def test_ctrl_c_during_close_still_ends_the_loop_and_stops_the_engines():
    class SlowStop(FakeEngine):
        async def stop(self):
            await asyncio.sleep(0.5)
            await super().stop()

    arbiter = fa.Arbiter()
    engine = SlowStop()
    arbiter.add_model("chat", engine)
    portal = Portal(arbiter)
    before = _loop_threads()
    portal.start()
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        portal.close()
    assert not portal.owns_loop and portal not in portal_module._owned
    assert arbiter.loop.is_closed() and _loop_threads() == before and not engine.started


def test_a_sync_stream_closed_on_the_arbiters_own_loop_does_not_block_it():
    arbiter, bot = make(token_time=0.01, tokens_per_reply=100)
    portal = Portal(arbiter)
    try:
        stream = portal.iterate_sync(bot.stream_chat, "chat", MSG, max_tokens=100)
        next(stream)

        async def finalize_there():  # as the garbage collector may, on whichever thread it runs
            stream.close()

        asyncio.run_coroutine_threadsafe(finalize_there(), arbiter.loop).result(timeout=5)
        _until(lambda: arbiter.stats().apps["a"].cancelled == 1)
    finally:
        portal.close()


def test_a_portal_closes_from_code_running_another_event_loop():
    arbiter, bot = make()
    portal = Portal(arbiter)

    async def elsewhere():
        await portal.run(bot.chat, "chat", MSG, max_tokens=1)
        portal.close()  # sync, from inside this loop (not the arbiter's)

    asyncio.run(elsewhere())
    assert arbiter.loop.is_closed() and not portal.owns_loop and not arbiter.engine("chat").started
