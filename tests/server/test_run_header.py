"""X-Fairagents-Run: the run a request belongs to, over HTTP and through the OpenAI drop-in clients.

Over a live server on FakeEngines (a test double); the run of each request is read where the arbiter queues it
(``arbiter.runner.submitted``).
"""

import asyncio

import httpx
import openai
import pytest
from fairagents_openai import AsyncFairOpenAI, FairOpenAI

import fairagents as fa
from fairagents.constants import HEADER_AGENT, HEADER_RUN
from fairagents.testing import FakeEngine

from ._support import KEYS, MSG, FakePainter, client, live, make_config

BODY = {"model": "chat", "messages": MSG, "max_tokens": 2}


def fake():
    arbiter = fa.Arbiter(in_flight=4, drain_timeout=1.0)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=2))
    arbiter.add_model("image", FakePainter())
    runs = []  # (agent, run) of each request queued
    arbiter.runner.submitted.append(lambda request: runs.append((request.agent.name, request.run)))
    return arbiter, runs


def headers(run=None, agent="writer"):
    out = {"Authorization": f"Bearer {KEYS['driving']}", HEADER_AGENT: agent}
    return out if run is None else {**out, HEADER_RUN: run}


async def test_the_run_header_is_the_run_of_every_request_it_comes_with():
    arbiter, runs = fake()
    async with live(arbiter, make_config()) as (url, _), httpx.AsyncClient(base_url=url) as http:
        answers = [
            await http.post("/v1/chat/completions", json=BODY, headers=headers("digest-7")),
            await http.post("/v1/chat/completions", json={**BODY, "n": 2}, headers=headers("digest-7")),
            await http.post("/v1/chat/completions", json={**BODY, "stream": True}, headers=headers("thread-42/turn-3")),
            await http.post("/v1/completions", json={"model": "chat", "prompt": "hi", "max_tokens": 2},
                            headers=headers("thread-42/turn-3")),
            await http.post("/v1/images/generations", json={"model": "image", "prompt": "a lighthouse"},
                            headers=headers("digest-7")),
            await http.post("/v1/chat/completions", json=BODY, headers=headers()),  # none: a run of its own
            await http.post("/v1/chat/completions", json=BODY, headers=headers("")),  # empty: none either
        ]
    assert [a.status_code for a in answers] == [200] * 7
    assert [run for _, run in runs] == ["digest-7"] * 3 + ["thread-42/turn-3"] * 2 + ["digest-7", None, None]


async def test_a_bad_run_id_is_a_400_that_charges_and_declares_nothing():
    arbiter, runs = fake()
    async with live(arbiter, make_config()) as (url, gateway), httpx.AsyncClient(base_url=url) as http:
        before = arbiter.stats()
        answers = [
            await http.post("/v1/chat/completions", json=BODY, headers=headers("two words", agent="newcomer")),
            await http.post("/v1/completions", json={"model": "chat", "prompt": "hi"}, headers=headers("x" * 129)),
            await http.post("/v1/images/generations", json={"model": "image", "prompt": "a lighthouse"},
                            headers=headers("a;b")),
        ]
        after = arbiter.stats()
        assert ("driving", "newcomer") not in gateway.identities._agents  # refused before the agent was declared
    for answer in answers:
        error = answer.json()["error"]
        assert (answer.status_code, error["code"], error["param"]) == (400, "invalid_parameter", HEADER_RUN)
        assert error["message"].startswith(f"{HEADER_RUN}: a run id is 1 to 128")
    assert runs == []
    assert after.apps.keys() == before.apps.keys() and all(
        after.apps[a].service == before.apps[a].service for a in after.apps)


async def test_the_stock_and_drop_in_clients_send_the_run():
    arbiter, runs = fake()
    async with live(arbiter, make_config()) as (url, _):
        stock = client(url, agent="writer")
        await stock.chat.completions.create(model="chat", messages=MSG, max_tokens=2,
                                            extra_headers={HEADER_RUN: "stock-1"})
        drop_in = AsyncFairOpenAI(base_url=f"{url}/v1", api_key=KEYS["driving"], agent="writer", max_retries=0)
        with fa.run_scope("drop-in-2"):
            await drop_in.chat.completions.create(model="chat", messages=MSG, max_tokens=2)
            await drop_in.images.generate(model="image", prompt="a lighthouse")
        await drop_in.chat.completions.create(model="chat", messages=MSG, max_tokens=2,
                                              extra_headers={HEADER_RUN: "given-3"})
        with pytest.raises(openai.BadRequestError) as refused:
            await stock.chat.completions.create(model="chat", messages=MSG, extra_headers={HEADER_RUN: "no way"})
        await stock.close()
        await drop_in.close()
    assert [run for _, run in runs] == ["stock-1", "drop-in-2", "drop-in-2", "given-3"]
    assert refused.value.status_code == 400 and refused.value.body["param"] == HEADER_RUN


async def test_in_process_the_drop_in_takes_the_run_from_context_or_its_headers():
    arbiter, runs = fake()
    writer = arbiter.app("driving").agent("writer")
    client = AsyncFairOpenAI(arbiter, agent=writer)
    async with arbiter:
        with fa.run_scope("ctx-1"):
            await client.chat.completions.create(model="chat", messages=MSG, max_tokens=2)
            stream = await client.chat.completions.create(model="chat", messages=MSG, max_tokens=2, stream=True, n=2)
            [c async for c in stream]
            await client.images.generate(model="image", prompt="a lighthouse")
        await client.chat.completions.create(model="chat", messages=MSG, max_tokens=2,
                                             extra_headers={"x-fairagents-run": "hdr-2"})
        with pytest.raises(openai.BadRequestError) as refused:  # as a server answers it, and costing nothing
            await client.chat.completions.create(model="chat", messages=MSG, extra_headers={HEADER_RUN: "no way"})
        await client.chat.completions.create(model="chat", messages=MSG, max_tokens=2)
    assert [run for _, run in runs] == ["ctx-1"] * 4 + ["hdr-2", None]
    assert isinstance(refused.value, fa.InvalidParameterError) and refused.value.body["param"] == HEADER_RUN


def test_in_process_the_sync_drop_in_reads_the_run_in_the_callers_thread():
    arbiter, runs = fake()
    writer = arbiter.app("driving").agent("writer")
    with FairOpenAI(arbiter, agent=writer) as client:  # the arbiter runs on the portal's own loop thread
        with fa.run_scope("sync-1"):
            client.chat.completions.create(model="chat", messages=MSG, max_tokens=2)
            list(client.chat.completions.create(model="chat", messages=MSG, max_tokens=2, stream=True))
            client.images.generate(model="image", prompt="a lighthouse")
        client.chat.completions.create(model="chat", messages=MSG, max_tokens=2)
    assert [run for _, run in runs] == ["sync-1"] * 3 + [None]


async def test_the_openapi_document_lists_the_run_header():
    arbiter, _ = fake()
    async with live(arbiter, make_config()) as (url, _), httpx.AsyncClient(base_url=url) as http:
        doc = (await http.get("/openapi.json")).json()
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/images/generations"):
        header = next(p for p in doc["paths"][path]["post"]["parameters"] if p["name"] == HEADER_RUN)
        assert header["in"] == "header" and not header["required"]
        assert header["schema"]["pattern"] == r"^[A-Za-z0-9_.:@/+=\-]{1,128}$"
    assert not any(p["name"] == HEADER_RUN for p in doc["paths"]["/v1/models"]["get"].get("parameters", []))


async def test_concurrent_requests_of_one_run_are_all_in_it():
    arbiter, runs = fake()
    async with live(arbiter, make_config()) as (url, _), httpx.AsyncClient(base_url=url) as http:
        answers = await asyncio.gather(*[http.post("/v1/chat/completions", json=BODY, headers=headers("fan-out"))
                                         for _ in range(6)])
    assert [a.status_code for a in answers] == [200] * 6
    assert runs == [("writer", "fan-out")] * 6
