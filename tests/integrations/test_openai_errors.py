"""fairagents_openai in process raises openai's exceptions, the very ones a fairagents server's answers give.

Each case is sent both ways on one arbiter: through a live server with the stock openai client, and to the
in-process drop-in; the drop-in's exception is of the server path's class, with its status and body, and is also
the fairagents error it stands for.
"""

import asyncio

import openai
import pytest
from fairagents_openai import AsyncFairOpenAI, FairOpenAI

import fairagents as fa
from fairagents.errors import ProtocolError
from fairagents.http_errors import _ERRORS
from fairagents.testing import FakeEngine
from tests.server._support import KEYS, MSG, client, live, make_config, wait_until

# The agent the server declares for a request that names none; in process it is named, stating no settings.
DEFAULT = fa.Agent("default", fa.App("driving"))


def declare_default(arbiter):
    """Declare DEFAULT in process: a request the server refuses declares nothing (it is undone)."""
    tenants = arbiter.tenants
    tenants.declare_agent(tenants.apps["driving"], DEFAULT.name, DEFAULT.weight, None)


def pool(**engine_kw):
    arbiter = fa.Arbiter(in_flight=1, drain_timeout=1.0, restart=None)
    engine = FakeEngine(**{"tokens_per_reply": 3, **engine_kw})
    arbiter.add_model("chat", engine)
    return arbiter, engine


def same_answer(local, remote):
    """The drop-in raised what the openai client raised for the server's answer."""
    assert isinstance(local, type(remote)) and isinstance(local, fa.FairAgentsError)
    assert local.status_code == remote.status_code
    assert (local.code, local.type, local.param) == (remote.code, remote.type, remote.param)
    assert str(local) == f"Error code: {local.status_code} - {local.__cause__}"
    assert local.body["message"] == str(local.__cause__) and local.response.json() == {"error": local.body}


@pytest.mark.parametrize(("request_kw", "openai_kind", "fairagents_kind"), [
    ({"model": "gpt-9"}, openai.NotFoundError, fa.UnknownModelError),
    ({"model": "gpt-9", "stream": True}, openai.NotFoundError, fa.UnknownModelError),
    ({"model": "chat", "max_tokens": 0}, openai.BadRequestError, fa.InvalidParameterError),
    ({"model": "chat", "max_tokens": 0, "stream": True}, openai.BadRequestError, fa.InvalidParameterError),
    ({"model": "chat", "tools": [{"type": "function", "function": {"name": "bad name"}}]},
     openai.BadRequestError, fa.InvalidParameterError),
])
async def test_bad_input_raises_what_the_server_path_raises(request_kw, openai_kind, fairagents_kind):
    arbiter, engine = pool()
    async with live(arbiter, make_config()) as (url, _), client(url) as remote_client:
        declare_default(arbiter)
        local_client = AsyncFairOpenAI(arbiter, agent=DEFAULT)
        with pytest.raises(openai_kind) as remote:
            await remote_client.chat.completions.create(messages=MSG, **request_kw)
        with pytest.raises(openai_kind) as local:
            await local_client.chat.completions.create(messages=MSG, **request_kw)
    same_answer(local.value, remote.value)
    assert isinstance(local.value, fairagents_kind) and isinstance(local.value.__cause__, fairagents_kind)
    assert isinstance(local.value, ValueError)  # bad input: LangGraph's default retry policy skips it, as before
    assert engine.started_order == [] and not arbiter.ledger.records


async def test_a_number_python_cannot_read_in_a_calls_arguments_is_the_same_400_both_ways():
    """A call's arguments are JSON text, read on either path: a 4,301-digit integer in them is a 400 naming them."""
    arbiter, engine = pool()
    call = {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"a": %s}' % ("1" * 4301)}}
    history = [*MSG, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    async with live(arbiter, make_config()) as (url, _), client(url) as remote_client:
        declare_default(arbiter)
        local_client = AsyncFairOpenAI(arbiter, agent=DEFAULT)
        with pytest.raises(openai.BadRequestError) as remote:
            await remote_client.chat.completions.create(model="chat", messages=history)
        with pytest.raises(openai.BadRequestError) as local:
            await local_client.chat.completions.create(model="chat", messages=history)
    same_answer(local.value, remote.value)
    assert isinstance(local.value, fa.InvalidParameterError)
    assert local.value.param == "messages[1].tool_calls[0].function.arguments"
    assert "4301 digits" in local.value.body["message"]
    assert engine.started_order == [] and not arbiter.ledger.records


async def test_a_full_queue_is_a_rate_limit_error_with_the_server_paths_retry_headers():
    arbiter, _ = pool(tokens_per_reply=50, token_time=0.01)
    config = make_config(apps={"driving": {"api_key": KEYS["driving"], "max_queued": 1}})
    async with live(arbiter, config) as (url, _), client(url) as remote_client:
        declare_default(arbiter)
        local_client = AsyncFairOpenAI(arbiter, agent=DEFAULT)
        running = asyncio.create_task(remote_client.chat.completions.create(model="chat", messages=MSG))
        await wait_until(lambda: arbiter.stats().apps["driving"].in_flight == 1)
        queued = asyncio.create_task(local_client.chat.completions.create(model="chat", messages=MSG))
        await wait_until(lambda: arbiter.stats().apps["driving"].queued == 1)
        with pytest.raises(openai.RateLimitError) as remote:
            await remote_client.chat.completions.create(model="chat", messages=MSG)
        with pytest.raises(openai.RateLimitError) as local:
            await local_client.chat.completions.create(model="chat", messages=MSG)
        with pytest.raises(fa.OverloadedError):  # what `except fa.OverloadedError` code caught, it still catches
            await local_client.chat.completions.create(model="chat", messages=MSG, stream=True)
        await asyncio.gather(running, queued)
    same_answer(local.value, remote.value)
    assert local.value.code == "queue_full" and local.value.retry_after > 0 and local.value.app == "driving"
    assert set(local.value.response.headers) >= {"retry-after", "retry-after-ms"}
    assert local.value.response.headers["retry-after"] == remote.value.response.headers["retry-after"]


async def test_a_failure_mid_stream_is_an_api_error_as_the_servers_error_event_gives_it():
    arbiter, engine = pool(tokens_per_reply=200, token_time=0.005)
    async with live(arbiter, make_config()) as (url, _), client(url) as remote_client:
        declare_default(arbiter)
        local_client = AsyncFairOpenAI(arbiter, agent=DEFAULT)
        failures = []
        for c in (remote_client, local_client):
            stream = await c.chat.completions.create(model="chat", messages=MSG, stream=True)
            with pytest.raises(openai.APIError) as info:
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        engine.fail()
            failures.append(info.value)
            await arbiter.restart_model("chat", backoff=0.0)
        remote, local = failures
        with pytest.raises(openai.InternalServerError) as down:  # before a stream starts: the status of a server
            engine.fail()
            await local_client.chat.completions.create(model="chat", messages=MSG, stream=True)
    assert not isinstance(remote, openai.APIStatusError) and not isinstance(local, openai.APIStatusError)
    assert isinstance(local, fa.EngineError) and local.model == "chat"
    assert (local.code, local.type, local.message) == (remote.code, remote.type, remote.message)
    assert down.value.status_code == 503 and down.value.code == "engine_unavailable"
    assert down.value.response.headers["x-should-retry"] == "false" and isinstance(down.value, fa.EngineError)


async def test_a_timeout_is_an_api_timeout_error_and_a_timeout_error():
    arbiter, _ = pool(tokens_per_reply=1000, token_time=0.002)
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("a").agent("t"))
    async with arbiter:
        with pytest.raises(openai.APITimeoutError) as info:
            await client.chat.completions.create(model="chat", messages=MSG, max_tokens=1000, timeout=0.05)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value.__cause__, TimeoutError)
    (record,) = arbiter.ledger.records
    assert record.outcome is fa.Outcome.CANCELLED and record.output_tokens < 1000  # aborted, charged for what it made


async def test_cancelling_a_call_raises_cancelled_error_and_cancels_its_request():
    arbiter, engine = pool(tokens_per_reply=1000, token_time=0.002)
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("a").agent("t"))
    async with arbiter:
        call = asyncio.create_task(client.chat.completions.create(model="chat", messages=MSG, max_tokens=1000))
        await wait_until(lambda: engine.running)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await wait_until(lambda: arbiter.ledger.records)
    (record,) = arbiter.ledger.records
    assert record.outcome is fa.Outcome.CANCELLED and engine.running == set()


async def test_parse_stream_raw_and_images_raise_openais_exceptions_too():
    arbiter, _ = pool()
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("a").agent("t"))
    async with arbiter:
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.parse(model="gpt-9", messages=MSG)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.with_raw_response.create(model="gpt-9", messages=MSG)
        with pytest.raises(openai.NotFoundError):
            async with client.chat.completions.stream(model="gpt-9", messages=MSG):
                pass
        with pytest.raises(openai.BadRequestError, match="take no stream"):
            client.chat.completions.stream(model="chat", messages=MSG, stream=True)
        with pytest.raises(openai.NotFoundError, match="no image model") as info:
            await client.images.generate(prompt="a lighthouse")
    assert str(info.value.request.url) == "fairagents://in-process/v1/images/generations"
    await client.close()
    with pytest.raises(openai.InternalServerError) as closed:  # a closed client: as a server shutting down answers
        await client.chat.completions.create(model="chat", messages=MSG)
    assert closed.value.code == "shutting_down" and isinstance(closed.value, fa.ShutdownError)
    assert not arbiter.ledger.records


def test_the_sync_client_raises_openais_exceptions():
    arbiter, _ = pool()
    client = FairOpenAI(arbiter, agent=arbiter.app("a").agent("t"))
    with client:
        with pytest.raises(openai.NotFoundError) as missing:
            client.chat.completions.create(model="gpt-9", messages=MSG)
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="chat", messages=MSG, max_tokens=0, stream=True)
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.parse(model="gpt-9", messages=MSG)
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.with_raw_response.create(model="gpt-9", messages=MSG)
        with pytest.raises(openai.NotFoundError):
            with client.chat.completions.stream(model="gpt-9", messages=MSG):
                pass
        with pytest.raises(openai.NotFoundError):
            client.images.generate(prompt="a lighthouse")
        with pytest.raises(fa.UnknownModelError):
            client.chat.completions.create(model="gpt-9", messages=MSG)
        assert client.chat.completions.create(model="chat", messages=MSG).choices[0].message.content == "t0 t1 t2 "
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="chat", messages=MSG)
    assert missing.value.status_code == 404 and missing.value.model == "gpt-9"


async def test_a_sync_call_on_the_arbiters_own_loop_stays_a_protocol_error():
    arbiter, _ = pool()
    async with arbiter:
        with pytest.raises(ProtocolError):  # a bug in the calling code, not an answer a server gives
            FairOpenAI(arbiter, agent=arbiter.app("a").agent("t")).chat.completions.create(model="chat", messages=MSG)


@pytest.mark.parametrize("status", sorted({status for _, status, _, _ in _ERRORS}))
def test_each_status_is_the_class_openais_client_raises_for_it(status):
    from fairagents_openai._errors import status_error

    error = next(cls for cls, s, _, _ in _ERRORS if s == status)("boom")
    converted = status_error(error, "fairagents://in-process/v1/chat/completions")
    stock = openai.OpenAI(api_key="unused")
    expected = stock._make_status_error("boom", body=None, response=converted.response)
    stock.close()
    assert type(converted).__mro__[1] is type(expected) and converted.status_code == status
