"""fairagents_openai: tools, structured output and logprobs through the drop-in; calls from any loop; the sync client.

The scripted FakeEngine answers as a model would (a Hermes-syntax tool call, or JSON); the
real engine test checks that a required call is valid on the embedded model. Streams are
read back with openai's own accumulation (``ChatCompletionStreamState``, what its
``stream()`` helper uses).
"""

import asyncio
import json
import threading
import time
from typing import Literal

import openai
import pytest
from fairagents_openai import AsyncFairOpenAI, ChatCompletionEventStream, ChatCompletionSyncStream, FairOpenAI
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ParsedChatCompletion
from pydantic import BaseModel

import fairagents as fa
from fairagents.errors import ProtocolError
from fairagents.testing import FakeEngine

pytest.importorskip("vllm")  # the hermes tool parser

WEATHER = {"type": "function", "function": {
    "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "weather in Oslo?"}]
CALL = 'Let me look. <tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'


def pool(reply=CALL):
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", FakeEngine(reply=reply))
    return arbiter, arbiter.app("a").agent("bot")


class City(BaseModel):
    city: str


class ShortCity(BaseModel):
    """A bounded answer. An enum, not a short string: the random model writes byte tokens, and a string the grammar
    counts as 12 characters may decode to more (each incomplete UTF-8 sequence becomes U+FFFD)."""

    city: Literal["Oslo", "Bergen", "Tromsø"]


def accumulate(chunks, tools=(WEATHER,)):
    """The choice openai's own stream accumulation rebuilds from ``chunks``."""
    state = ChatCompletionStreamState(input_tools=list(tools))
    for chunk in chunks:
        assert isinstance(ChatCompletionChunk.model_validate(chunk.model_dump()), ChatCompletionChunk)
        state.handle_chunk(chunk)
    return state.get_final_completion().choices[0]


def calls_of(message):
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


async def test_a_tool_round_trip_through_the_drop_in():
    arbiter, bot = pool()
    client = AsyncFairOpenAI(arbiter, agent=bot)
    async with arbiter:
        first = await client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER])
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls"
        [call] = message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("weather", {"city": "Oslo"})
        history = [*ASK, message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "sunny, 14 °C"}]
        arbiter.engine("chat").reply = "It is sunny."
        answer = await client.chat.completions.create(model="chat", messages=history, tools=[WEATHER])
    assert answer.choices[0].message.content == "It is sunny." and answer.choices[0].finish_reason == "stop"
    assert ChatCompletion.model_validate(first.model_dump()).choices[0].message.tool_calls[0].id == call.id


async def test_streamed_tool_calls_add_up_to_the_reply():
    arbiter, bot = pool()
    client = AsyncFairOpenAI(arbiter, agent=bot)
    async with arbiter:
        whole = (await client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER])).choices[0]
        stream = await client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER], stream=True)
        chunks = [c async for c in stream]
        async with client.chat.completions.stream(model="chat", messages=ASK, tools=[WEATHER]) as events:
            kinds = [event.type async for event in events]
            helped = (await events.get_final_completion()).choices[0]
    pieces = [p for c in chunks for p in c.choices[0].delta.tool_calls or []]
    assert (pieces[0].index, pieces[0].type, pieces[0].function.name) == (0, "function", "weather")
    assert pieces[0].id.startswith("call_") and all(p.id is None and p.function.name is None for p in pieces[1:])
    for streamed in (accumulate(chunks), helped):
        assert streamed.finish_reason == whole.finish_reason == "tool_calls"
        assert streamed.message.content.strip() == whole.message.content.strip()
        assert calls_of(streamed.message) == calls_of(whole.message) == [("weather", {"city": "Oslo"})]
    assert isinstance(events, ChatCompletionEventStream) and "tool_calls.function.arguments.done" in kinds


async def test_response_format_and_tool_choice_reach_the_engine():
    arbiter, bot = pool(reply='{"answer": "yes"}')
    client = AsyncFairOpenAI(arbiter, agent=bot)
    async with arbiter:
        done = await client.chat.completions.create(model="chat", messages=ASK,
                                                    response_format={"type": "json_object"})
        forced = await client.chat.completions.create(
            model="chat", messages=ASK, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "weather"}})
    assert json.loads(done.choices[0].message.content) == {"answer": "yes"}
    sent = list(arbiter.engine("chat").params.values())
    assert sent[0].structured == {"json_object": True}
    assert sent[1].structured == {"json": WEATHER["function"]["parameters"]}
    assert forced.choices[0].message.tool_calls[0].function.name == "weather"


async def test_parse_reads_the_answer_into_a_model_and_strict_calls_into_theirs():
    arbiter, bot = pool(reply='{"city": "Oslo"}')
    client = AsyncFairOpenAI(arbiter, agent=bot)
    async with arbiter:
        answer = await client.chat.completions.parse(model="chat", messages=ASK, response_format=City)
        older = await client.beta.chat.completions.parse(model="chat", messages=ASK, response_format=City)
        async with client.chat.completions.stream(model="chat", messages=ASK, response_format=City) as stream:
            streamed = await stream.get_final_completion()
        arbiter.engine("chat").reply = '<tool_call>{"name": "City", "arguments": {"city": "Bergen"}}</tool_call>'
        called = await client.chat.completions.parse(model="chat", messages=ASK,
                                                     tools=[openai.pydantic_function_tool(City)])
        with pytest.raises(ValueError, match="strict"):  # as openai's parse: only strict tools can be parsed
            await client.chat.completions.parse(model="chat", messages=ASK, tools=[WEATHER])
        with pytest.raises(fa.InvalidParameterError, match="stream"):
            await client.chat.completions.parse(model="chat", messages=ASK, response_format=City, stream=True)
    assert isinstance(answer, ParsedChatCompletion)
    for completion in (answer, older, streamed):
        assert completion.choices[0].message.parsed == City(city="Oslo")
    sent = list(arbiter.engine("chat").params.values())[0].structured
    assert sent == {"json": City.model_json_schema() | {"additionalProperties": False}}
    assert called.choices[0].message.tool_calls[0].function.parsed_arguments == City(city="Bergen")


@pytest.mark.parametrize("padded", ['{"city": "Oslo"}', '\n\t {"city":\n "Oslo"}\n'])
async def test_openais_stream_helper_reads_a_named_strict_call_however_its_json_is_padded(padded):
    """openai's ``stream()`` parses a strict call's arguments so far after every piece: a piece of whitespace alone
    (a permissive grammar's padding before the value) made it raise 'EOF while parsing a value'."""
    arbiter, bot = pool(reply=padded)
    client = AsyncFairOpenAI(arbiter, agent=bot)
    tool = openai.pydantic_function_tool(City)
    async with arbiter:
        async with client.chat.completions.stream(
                model="chat", messages=ASK, tools=[tool],
                tool_choice={"type": "function", "function": {"name": "City"}}) as stream:
            pieces = [event.arguments_delta async for event in stream if event.type == "tool_calls.function.arguments.delta"]
            streamed = await stream.get_final_completion()
        reply = await client.chat.completions.create(model="chat", messages=ASK, tools=[tool],
                                                     tool_choice={"type": "function", "function": {"name": "City"}})
    [call] = streamed.choices[0].message.tool_calls
    assert call.function.parsed_arguments == City(city="Oslo") and all(p.strip() for p in pieces if p)
    assert call.function.arguments == "".join(pieces) == reply.choices[0].message.tool_calls[0].function.arguments


async def test_bad_tools_are_refused_before_anything_is_charged():
    arbiter, bot = pool()
    client = AsyncFairOpenAI(arbiter, agent=bot)
    nope = {"type": "function", "function": {"name": "nope"}}
    async with arbiter:
        for stream in (False, True):
            with pytest.raises(fa.InvalidParameterError, match="nope"):
                await client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER], tool_choice=nope,
                                                     stream=stream)
        with pytest.raises(fa.InvalidParameterError, match="nope"):
            async with client.chat.completions.stream(model="chat", messages=ASK, tools=[WEATHER], tool_choice=nope):
                pass
    assert not arbiter.ledger.records


def test_the_async_client_works_from_a_loop_other_than_the_arbiters():
    arbiter, bot = pool(reply="hello there")
    ready, done = threading.Event(), threading.Event()

    async def serve():  # the arbiter's loop, in a thread of its own
        async with arbiter:
            ready.set()
            await asyncio.to_thread(done.wait)

    server = threading.Thread(target=asyncio.run, args=(serve(),))
    server.start()
    ready.wait()
    try:
        client = AsyncFairOpenAI(arbiter, agent=bot)

        async def elsewhere():
            reply = await client.chat.completions.create(model="chat", messages=ASK)
            stream = await client.chat.completions.create(model="chat", messages=ASK, stream=True)
            return reply, [c async for c in stream]

        async def given_up():  # cancelled here while it runs, cancelled on the arbiter's loop too
            engine = arbiter.engine("chat")
            engine.reply, engine.token_time = " ".join(["word"] * 500), 0.01
            call = asyncio.ensure_future(client.chat.completions.create(model="chat", messages=ASK))
            while not engine.running:
                await asyncio.sleep(0.01)
            call.cancel()
            await call

        reply, chunks = asyncio.run(asyncio.wait_for(elsewhere(), 10))
        assert reply.choices[0].message.content == accumulate(chunks).message.content == "hello there"
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(asyncio.wait_for(given_up(), 10))
        deadline = time.monotonic() + 5
        while len(arbiter.ledger.records) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert arbiter.ledger.records[-1].outcome is fa.Outcome.CANCELLED
    finally:
        done.set()
        server.join()
    with pytest.raises(fa.ShutdownError):  # a closed client says so
        asyncio.run(_closed_then_called(client))

    async def again():  # the arbiter was closed with its loop: a new client starts it again, on its portal's thread
        async with AsyncFairOpenAI(arbiter, agent=bot) as fresh:
            return await fresh.chat.completions.create(model="chat", messages=ASK, max_tokens=2), fresh

    completion, fresh = asyncio.run(again())
    assert completion.usage.completion_tokens == 2 and not fresh.portal.owns_loop  # and closed it with itself


async def _closed_then_called(client):
    await client.close()
    await client.chat.completions.create(model="chat", messages=ASK)


def test_the_sync_client_needs_no_event_loop():
    arbiter, bot = pool()
    with FairOpenAI(arbiter, agent=bot) as client:
        completion = client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER])
        stream = client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER], stream=True)
        assert isinstance(stream, ChatCompletionSyncStream)
        streamed = accumulate(list(stream))
        with client.chat.completions.stream(model="chat", messages=ASK, tools=[WEATHER]) as events:
            helped = events.get_final_completion().choices[0]
        arbiter.engine("chat").reply = '{"city": "Oslo"}'
        answer = client.chat.completions.parse(model="chat", messages=ASK, response_format=City)
        with pytest.raises(fa.UnknownModelError):
            client.chat.completions.create(model="nope", messages=ASK)
        assert client.portal.owns_loop and not isinstance(client, AsyncFairOpenAI)
    assert not client.portal.owns_loop  # closed with the client, the arbiter too
    assert calls_of(streamed.message) == calls_of(helped.message) == calls_of(completion.choices[0].message)
    assert streamed.finish_reason == helped.finish_reason == "tool_calls"
    assert answer.choices[0].message.parsed == City(city="Oslo")
    with pytest.raises(fa.ShutdownError):
        client.chat.completions.create(model="chat", messages=ASK)  # the arbiter it started is closed


def test_the_async_client_closes_the_arbiter_its_portal_started():
    arbiter, bot = pool(reply="hi")

    async def script():  # asyncio.run's loop; the arbiter gets a loop thread of its own
        async with AsyncFairOpenAI(arbiter, agent=bot) as client:
            completion = await client.chat.completions.create(model="chat", messages=ASK)
            assert client.portal.owns_loop and arbiter.loop is not asyncio.get_running_loop()
        return completion, client

    completion, client = asyncio.run(script())
    assert completion.choices[0].message.content == "hi" and not client.portal.owns_loop


async def test_the_sync_client_on_the_arbiters_own_loop_says_it_would_block():
    arbiter, bot = pool()
    async with arbiter:
        with pytest.raises(ProtocolError):
            FairOpenAI(arbiter, agent=bot).chat.completions.create(model="chat", messages=ASK)


def test_the_sync_client_over_http_is_openais_own(server):
    http_client = server.sync_client()
    with FairOpenAI(base_url="http://fair.test/v1", api_key="sk-a", agent="bot", http_client=http_client) as client:
        completion = client.chat.completions.create(model="chat", messages=ASK)
        chunks = list(client.chat.completions.create(model="chat", messages=ASK, stream=True))
        with client.chat.completions.stream(model="chat", messages=ASK) as stream:
            deltas = [event.delta for event in stream if event.type == "content.delta"]
        with pytest.raises(openai.LengthFinishReasonError):  # openai's own parse read the answer: cut short
            client.chat.completions.parse(model="chat", messages=ASK, response_format=City)
    assert isinstance(client.openai, openai.OpenAI) and completion.choices[0].message.content == "hello"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "".join(deltas) == "hello"
    assert [body.get("stream", False) for _, body in server.requests] == [False, True, True, False]
    assert server.body["response_format"]["json_schema"]["name"] == "City"
    for request, _ in server.requests:
        assert (request.headers["authorization"], request.headers["x-fairagents-agent"]) == ("Bearer sk-a", "bot")


async def test_the_async_clients_parse_and_stream_over_http_are_openais_own(server):
    client = AsyncFairOpenAI(base_url="http://fair.test/v1", api_key="sk-a", agent="bot",
                             http_client=server.async_client())
    async with client.chat.completions.stream(model="chat", messages=ASK) as stream:
        text = "".join([event.delta async for event in stream if event.type == "content.delta"])
    with pytest.raises(openai.LengthFinishReasonError):
        await client.beta.chat.completions.parse(model="chat", messages=ASK, response_format=City)
    await client.close()
    assert text == "hello" and server.headers["x-fairagents-agent"] == "bot"


@pytest.mark.engine
@pytest.mark.asyncio(loop_scope="session")
async def test_a_required_call_on_the_real_engine_is_valid(text_engine):
    import jsonschema

    city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", text_engine)
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("a").agent("bot"))
    await arbiter.start()
    try:
        completion = await client.chat.completions.create(
            model="chat", messages=ASK, max_tokens=300, seed=1, tool_choice="required", parallel_tool_calls=False,
            tools=[{"type": "function", "function": {"name": "weather", "parameters": city}}])
        answer = await client.chat.completions.create(
            model="chat", messages=ASK, max_tokens=300, seed=2, logprobs=True, top_logprobs=2,
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": city}})
        parsed = await client.chat.completions.parse(model="chat", messages=ASK, max_tokens=300, seed=3,
                                                     response_format=ShortCity)
    finally:
        await arbiter.close(stop_engines=False)
    [call] = completion.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), city)
    jsonschema.validate(json.loads(answer.choices[0].message.content), city)
    assert isinstance(parsed.choices[0].message.parsed, ShortCity)
    tokens = answer.choices[0].logprobs.content
    assert len(tokens) == answer.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in tokens)


class NoTools(FakeEngine):
    """A model that takes no tools; counts the prompts it prepares."""

    tool_parser = None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.prepared = 0

    def prepare_chat(self, messages, tools=None):
        self.prepared += 1
        return super().prepare_chat(messages, tools=tools)


async def test_a_stream_refused_for_what_the_model_cannot_do_prepares_no_prompt():
    arbiter = fa.Arbiter()
    engine = NoTools()
    arbiter.add_model("chat", engine)
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("a").agent("bot"))
    async with arbiter:
        with pytest.raises(fa.InvalidParameterError, match="takes no tools"):
            await client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER], stream=True)
        with pytest.raises(fa.UnknownAgentError):
            await AsyncFairOpenAI(arbiter, agent=fa.Agent("ghost", fa.App("a"))).chat.completions.create(
                model="chat", messages=ASK, stream=True)
    assert engine.prepared == 0 and not arbiter.ledger.records
