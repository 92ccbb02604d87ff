"""Two front doors, one replica: the weighted share holds when the replica schedules by the identity they send.

Two arbiters (two front doors) in front of one ``vllm serve`` replica; door one
receives only app ``heavy`` (weight 4), door two only app ``light`` (weight 1), sixteen
closed-loop callers each (enough that each app always has requests waiting at the
replica: an app whose queue empties is lifted to the others' counter, as in VTC). Each door's counters see one app, so neither can hold the
4:1 share by itself. Both hand the replica everything and send identity and weights as
``vllm_xargs``: with vLLM's own FCFS the replica serves the two about equally; with
``--scheduler-cls fairagents.vllm.FairScheduler`` it serves them 4:1.
"""

import asyncio

import pytest

import fairagents as fa

from .._vllm_servers import start_server, stop_server, wait_healthy

pytest.importorskip("vllm")
pytestmark = pytest.mark.engine

MSG = [{"role": "user", "content": "plan a route through the city"}]


async def doors(url, seconds):
    from fairagents.engines.remote import OpenAIEngine
    from fairagents.models import ensure_default_models

    path = ensure_default_models(["text"])["text"]
    arbiters, served = [], {"heavy": 0, "light": 0}
    for app, weight in (("heavy", 4.0), ("light", 1.0)):
        arbiter = fa.Arbiter(in_flight=64, token_budget=None)  # the door hands the replica everything
        arbiter.add_model("chat", OpenAIEngine([url], model="chat", model_path=path))
        arbiters.append((arbiter, arbiter.app(app, weight=weight).agent("t"), app))

    async def caller(who, app):
        while True:
            async for delta in who.stream_chat("chat", MSG, max_tokens=32, ignore_eos=True):
                served[app] += delta.new_tokens

    for arbiter, _, _ in arbiters:
        await arbiter.start()
    tasks = [asyncio.create_task(caller(who, app)) for _, who, app in arbiters for _ in range(16)]
    try:
        await asyncio.sleep(2.0)  # both doors backlogged
        start = dict(served)
        await asyncio.sleep(seconds)
        window = {app: served[app] - start[app] for app in served}
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for arbiter, _, _ in arbiters:
            await arbiter.close()
    return window["heavy"] / max(window["light"], 1)


@pytest.mark.parametrize("fair", [False, True], ids=["vllm-default", "fair"])
def test_two_front_doors_hold_the_weighted_share_through_the_replicas_scheduler(fair, tmp_path):
    log = tmp_path / "replica.log"
    extra = ["--max-num-seqs", "4", *(["--scheduler-cls", "fairagents.vllm.FairScheduler"] if fair else [])]
    proc, url = start_server(log, *extra)
    try:
        wait_healthy(proc, url, log)
        ratio = asyncio.run(doors(url, 10.0))
        print(f"heavy:light served = {ratio:.2f}")
    finally:
        stop_server(proc)
    if fair:
        assert 3.6 <= ratio <= 4.4  # 4:1 within 10 %
    else:
        assert 0.7 <= ratio <= 1.4  # FCFS: about as many of each
