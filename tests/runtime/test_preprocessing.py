"""Modality-aware preprocessing: image work runs in its own bounded pool, and text calls do not wait behind it."""

import asyncio
import statistics
import threading
import time

import numpy as np
import pytest
from PIL import Image

import fairagents as fa
from fairagents.errors import OverloadedError
from fairagents.images import to_png
from fairagents.runtime.preprocessing import Preprocessor
from fairagents.testing import FakeEngine

pytestmark = pytest.mark.asyncio(loop_scope="session")

TEXT = [{"role": "user", "content": "plan a route through the city"}]


def big_png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return to_png(Image.fromarray(rng.integers(0, 255, (1400, 1400, 3), dtype=np.uint8)))


async def test_the_pool_runs_off_the_loop_and_is_bounded():
    pool = Preprocessor(workers=1, max_pending=2)
    gate = threading.Event()
    try:
        first = asyncio.create_task(pool.run(gate.wait, 5))
        second = asyncio.create_task(pool.run(threading.get_ident))
        await asyncio.sleep(0.05)
        assert pool.pending == 2  # the loop is free while both wait in the pool
        with pytest.raises(OverloadedError):
            await pool.run(int)
        gate.set()
        assert await first is True and await second != threading.get_ident()
        assert pool.pending == 0
    finally:
        pool.close()


async def test_inline_mode_runs_on_the_calling_thread():
    pool = Preprocessor(inline=True)
    assert await pool.run(threading.get_ident) == threading.get_ident()


@pytest.mark.engine
async def test_text_ttft_does_not_wait_behind_image_preprocessing(text_engine, vision_engine):
    """Many large images queued for preprocessing; text TTFT stays near its unloaded value."""
    arbiter = fa.Arbiter(preprocess_workers=1)
    arbiter.add_model("chat", text_engine)
    arbiter.add_model("vlm", vision_engine, in_flight=1)
    await arbiter.start()
    try:
        writer, eye = arbiter.app("docs").agent("writer"), arbiter.app("photos").agent("eye")

        async def text_ttfts(n):
            ttfts = []
            for _ in range(n):
                reply = await writer.chat("chat", TEXT, max_tokens=2, ignore_eos=True)
                ttfts.append(reply.timing.ttft)
                await asyncio.sleep(0.02)
            return ttfts

        await text_ttfts(3)  # warm up
        unloaded = statistics.median(await text_ttfts(10))
        images = [big_png(i) for i in range(4)]
        heavy = [
            asyncio.create_task(eye.chat("vlm", [{"role": "user", "content": [{"type": "image", "image": images[i % 4]}]}],
                                         max_tokens=1))
            for i in range(40)
        ]
        await asyncio.sleep(0.05)
        assert arbiter.preprocessor.pending > 20  # the image backlog is in preprocessing now
        loaded = await text_ttfts(10)
        assert arbiter.preprocessor.pending > 0  # and still was when the text calls ended
        await asyncio.gather(*heavy)
        assert statistics.median(loaded) <= unloaded + 0.15, (unloaded, loaded)
        assert max(loaded) <= unloaded + 0.5, (unloaded, loaded)
    finally:
        await arbiter.close(stop_engines=False)


async def test_a_preprocessed_request_keeps_its_place_under_fcfs():
    """An image request that arrived first is dispatched first under FCFS, though its preprocessing ended later."""
    engine = FakeEngine(tokens_per_reply=1, token_time=0.2)
    engine.profile = fa.ModelProfile(d_model=64, n_layers=1, modality=fa.Modality.VISION)
    gate = threading.Event()

    def slow_prepare(messages):
        gate.wait(5)
        return fa.engines.Prompt(token_ids=(1, 2, 3))

    engine.prepare_chat = lambda messages: slow_prepare(messages) if isinstance(messages[0]["content"], list) else (
        fa.engines.Prompt(token_ids=(1,))
    )
    arbiter = fa.Arbiter(policy="fcfs", in_flight=1)
    arbiter.add_model("vlm", engine)
    await arbiter.start()
    try:
        a = arbiter.app("a").agent("t")
        hold = asyncio.create_task(a.chat("vlm", TEXT, max_tokens=1))  # occupies the single slot
        image = asyncio.create_task(a.chat("vlm", [{"role": "user", "content": [Image.new("RGB", (4, 4))]}], max_tokens=1))
        await asyncio.sleep(0.02)
        text = asyncio.create_task(a.chat("vlm", TEXT, max_tokens=1))
        await asyncio.sleep(0.02)
        gate.set()
        replies = await asyncio.gather(hold, image, text)
        order = [r.id for r in sorted(arbiter.ledger.records, key=lambda r: r.dispatched)]
        assert order.index(replies[1].request_id) < order.index(replies[2].request_id)
    finally:
        await arbiter.close()


async def test_the_pool_serves_apps_by_weighted_worker_time_not_arrival():
    """A flood queued first does not make a later app wait behind all of it."""
    pool = Preprocessor(workers=1, max_pending=100)
    order = []

    def job(app, seconds):
        time.sleep(seconds)
        order.append(app)

    try:
        flood = [asyncio.create_task(pool.run(job, "flood", 0.01, app="flood")) for _ in range(20)]
        await asyncio.sleep(0.005)  # the flood's first job is running
        light = [asyncio.create_task(pool.run(job, "light", 0.01, app="light")) for _ in range(3)]
        await asyncio.gather(*flood, *light)
    finally:
        pool.close()
    # the light app was idle, so it starts at the flood's virtual time and alternates with it
    assert order.index("light") <= 2 and order[:8].count("light") == 3
    assert pool.used["flood"] == pytest.approx(0.2, rel=0.5) and pool.pending == 0 and not pool.pending_of


async def test_weights_share_the_workers_and_a_flood_is_refused_alone():
    pool = Preprocessor(workers=1, max_pending=100, max_pending_per_app=12)
    order = []

    def job(app):
        time.sleep(0.005)
        order.append(app)

    try:
        gate = threading.Event()
        blocker = asyncio.create_task(pool.run(gate.wait, 5, app="x"))
        await asyncio.sleep(0.01)
        heavy = [asyncio.create_task(pool.run(job, "heavy", app="heavy", weight=2.0)) for _ in range(12)]
        light = [asyncio.create_task(pool.run(job, "light", app="light")) for _ in range(6)]
        await asyncio.sleep(0.01)
        with pytest.raises(OverloadedError, match="app 'heavy' has 12 requests waiting"):
            await pool.run(job, "heavy", app="heavy", weight=2.0)  # its own bound: refused before any work
        third = asyncio.create_task(pool.run(int, "7", app="third"))  # other apps still get in
        await asyncio.sleep(0)
        assert pool.pending_of["third"] == 1
        gate.set()
        await asyncio.gather(blocker, *heavy, *light)
        assert await third == 7
    finally:
        pool.close()
    first = [app for app in order if app != "third"][:9]
    assert first.count("heavy") == pytest.approx(6, abs=1) and first.count("light") == pytest.approx(3, abs=1)


async def test_a_job_cancelled_while_queued_never_runs_and_errors_reach_their_caller():
    pool = Preprocessor(workers=1, max_pending=10)
    gate = threading.Event()
    ran = []
    try:
        blocker = asyncio.create_task(pool.run(gate.wait, 5, app="a"))
        queued = asyncio.create_task(pool.run(ran.append, 1, app="b"))
        await asyncio.sleep(0.01)
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        assert pool.pending == 1 and pool.pending_of == {"a": 1}
        gate.set()
        await blocker
        with pytest.raises(ZeroDivisionError):
            await pool.run(lambda: 1 / 0, app="b")
        assert ran == [] and pool.pending == 0
        waiting = asyncio.create_task(pool.run(gate.wait, 5, app="a"))  # gate is set: returns at once
        await waiting
    finally:
        pool.close()


async def test_closing_fails_queued_jobs_with_a_shutdown_error():
    pool = Preprocessor(workers=1, max_pending=10)
    gate = threading.Event()
    blocker = asyncio.create_task(pool.run(gate.wait, 5, app="a"))
    queued = asyncio.create_task(pool.run(int, "1", app="b"))
    await asyncio.sleep(0.01)
    pool.close()
    with pytest.raises(fa.ShutdownError):
        await queued
    gate.set()
    assert await blocker is True


async def test_a_full_pool_refuses_the_app_that_filled_it_and_admits_one_below_its_share():
    pool = Preprocessor(workers=1, max_pending=4)
    gate = threading.Event()
    try:
        flood = [asyncio.create_task(pool.run(gate.wait, 5, app="flood")) for _ in range(4)]
        await asyncio.sleep(0.01)
        with pytest.raises(OverloadedError, match="4 of them app 'flood'"):
            await pool.run(gate.wait, 5, app="flood")
        light = asyncio.create_task(pool.run(int, "3", app="light"))  # below its share (2 of 4): admitted
        await asyncio.sleep(0)
        assert pool.pending == 5 and pool.pending_of["light"] == 1
        light2 = asyncio.create_task(pool.run(int, "4", app="light"))  # 1 < 2: still its share
        await asyncio.sleep(0)
        with pytest.raises(OverloadedError, match="2 of them app 'light'"):
            await pool.run(int, "5", app="light")
        gate.set()
        await asyncio.gather(*flood)
        assert (await light, await light2) == (3, 4)
    finally:
        pool.close()


async def test_an_app_running_heavy_jobs_leaves_a_worker_for_another():
    pool = Preprocessor(workers=2, max_pending=10)
    gate, ran = threading.Event(), []
    try:
        heavy = [asyncio.create_task(pool.run(gate.wait, 5, app="heavy")) for _ in range(3)]
        await asyncio.sleep(0.02)  # heavy holds both workers: nobody else was waiting
        light = asyncio.create_task(pool.run(ran.append, "light", app="light"))
        await asyncio.sleep(0.02)
        assert ran == []  # both workers are busy: it waits for one (no preemption)
        gate.set()
        await asyncio.gather(*heavy, light)
    finally:
        pool.close()
    assert ran == ["light"]
    pool = Preprocessor(workers=2, max_pending=10)
    gate_a, gate_b, order = threading.Event(), threading.Event(), []
    try:
        first = asyncio.create_task(pool.run(gate_a.wait, 5, app="heavy"))
        second = asyncio.create_task(pool.run(gate_b.wait, 5, app="heavy"))
        await asyncio.sleep(0.01)
        more = [asyncio.create_task(pool.run(order.append, "heavy", app="heavy")) for _ in range(2)]
        await asyncio.sleep(0.01)
        light = asyncio.create_task(pool.run(order.append, "light", app="light"))
        await asyncio.sleep(0.01)
        gate_a.set()  # one worker frees: heavy still holds the other, and light waits
        await light
        assert order[0] == "light"
        gate_b.set()
        await asyncio.gather(first, second, *more)
    finally:
        pool.close()
