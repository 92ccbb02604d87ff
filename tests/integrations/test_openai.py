"""fairagents_openai: the drop-in client in process (chat, stream, images), inside a fair graph, and remote.

Most tests run on a FakeEngine (a test double); the last one on the session's real vLLM engine.
"""

import contextlib

import openai
import pytest
from fairagents_langgraph import fair_graph
from fairagents_openai import AsyncFairOpenAI, ChatCompletionStream
from langgraph.graph import START, StateGraph
from openai.types import ImagesResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from typing_extensions import TypedDict

import fairagents as fa
from fairagents.testing import FakeEngine

MESSAGES = [{"role": "user", "content": "plan a route"}]


def pool(**engine_kw):
    arbiter = fa.Arbiter(in_flight=4)
    engine = FakeEngine(tokens_per_reply=3, **engine_kw)
    arbiter.add_model("chat", engine)
    return arbiter, engine


async def test_chat_completion_takes_the_agent_from_context():
    arbiter, engine = pool()
    planner = arbiter.app("driving").agent("planner")
    client = AsyncFairOpenAI(arbiter)
    prompt = engine.prepare_chat(MESSAGES).n_tokens
    async with arbiter:
        with fa.acting_as(planner):
            completion = await client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=16)
            short = await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": [{"type": "text", "text": "plan a route"}]}],
                max_completion_tokens=2, temperature=0.0, seed=3, stop=["\n"], n=1, presence_penalty=0, user="u1",
            )
        with pytest.raises(fa.UnknownAgentError):  # nobody bound, none given: a ValueError
            await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert isinstance(completion, ChatCompletion)
    assert completion.object == "chat.completion" and completion.model == "chat"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == "t0 t1 t2 "
    assert completion.choices[0].finish_reason == "stop"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (prompt, 3)
    assert completion.usage.total_tokens == prompt + 3
    assert completion.usage.unified_tokens == prompt + 2 * 3  # FakeEngine's scale is 1
    assert short.choices[0].finish_reason == "length" and short.usage.prompt_tokens == prompt
    assert arbiter.stats().agents["driving/planner"].done == 2


async def test_a_fixed_agent_on_the_client():
    arbiter, _ = pool()
    reporter = arbiter.app("driving").agent("reporter")
    async with arbiter:
        await AsyncFairOpenAI(arbiter, agent=reporter).chat.completions.create(model="chat", messages=MESSAGES)
    assert arbiter.stats().agents["driving/reporter"].done == 1


async def test_stream_yields_openai_chunks_and_a_usage_chunk():
    arbiter, engine = pool()
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("driving").agent("planner"))
    prompt = engine.prepare_chat(MESSAGES).n_tokens
    async with arbiter:
        stream = await client.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        assert isinstance(stream, ChatCompletionStream)
        chunks = [chunk async for chunk in stream]
        plain = [c async for c in await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)]
    assert all(isinstance(c, ChatCompletionChunk) and c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "t0 t1 t2 "
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert not chunks[-1].choices
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (prompt, 3, prompt + 3)
    assert usage.unified_tokens == arbiter.ledger.service_of("driving") / 2
    assert all(c.usage is None for c in plain) and len(plain) == len(chunks) - 1


async def test_stream_bad_input_raises_at_create_and_closing_early_cancels():
    arbiter, engine = pool(token_time=0.002)
    engine.tokens_per_reply = 100
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("driving").agent("planner"))
    async with arbiter:
        with pytest.raises(fa.InvalidParameterError):
            await client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=0, stream=True)
        with pytest.raises(fa.UnknownModelError):
            await client.chat.completions.create(model="nope", messages=MESSAGES, stream=True)
        assert not arbiter.ledger.charges
        async with await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True) as stream:
            async for chunk in stream:
                if chunk.choices[0].delta.content == "t2 ":
                    break
        unread = await client.chat.completions.create(model="chat", messages=MESSAGES, stream=True)
        await unread.close()
    records = list(arbiter.ledger.records)
    assert [r.outcome for r in records] == [fa.Outcome.CANCELLED, fa.Outcome.CANCELLED]
    assert records[0].output_tokens < 10 and engine.running == set()


async def test_timeout_aborts_the_call_and_charges_what_it_produced():
    arbiter, engine = pool(token_time=0.002)
    engine.tokens_per_reply = 1000
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("a").agent("t"))
    async with arbiter:
        with pytest.raises(TimeoutError):
            await client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=1000, timeout=0.05)
    (record,) = arbiter.ledger.records
    assert record.outcome is fa.Outcome.CANCELLED and 0 < record.output_tokens < 1000


async def test_parameters_fairagents_cannot_honour_are_refused():
    arbiter, _ = pool()
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("a").agent("t"))
    async with arbiter:
        for params in (
            {"n": 0},
            {"audio": {"voice": "alloy", "format": "wav"}},
            {"prediction": {"type": "content", "content": "x"}},
            {"extra_body": {"guided_json": {}}},
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            {"response_format": {"type": "xml"}},
        ):
            with pytest.raises(fa.InvalidParameterError):
                await client.chat.completions.create(model="chat", messages=MESSAGES, **params)
        orphan = [*MESSAGES, {"role": "tool", "tool_call_id": "call_1", "content": "42"}]  # it answers no call
        with pytest.raises(fa.InvalidParameterError, match="must be a response to a preceeding message"):
            await client.chat.completions.create(model="chat", messages=orphan)
        # NOT_GIVEN, as code written for openai passes it, is "not given"
        ok = await client.chat.completions.create(model="chat", messages=MESSAGES, tools=openai.NOT_GIVEN)
    assert ok.choices[0].message.content
    assert len(arbiter.ledger.records) == 1
    with pytest.raises(fa.InvalidParameterError):
        AsyncFairOpenAI(arbiter, base_url="http://localhost:8000/v1")
    with pytest.raises(fa.InvalidParameterError):
        AsyncFairOpenAI()


async def test_n_choices_are_requests_of_their_own_as_a_server_serves_them():
    arbiter, engine = pool()
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("driving").agent("planner"))
    prompt = engine.prepare_chat(MESSAGES).n_tokens
    async with arbiter:
        reply = await client.chat.completions.create(model="chat", messages=MESSAGES, n=2, max_tokens=8)
        stream = await client.chat.completions.create(model="chat", messages=MESSAGES, n=3, max_tokens=8, stream=True,
                                                      stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    assert [(ch.index, ch.message.content) for ch in reply.choices] == [(0, "t0 t1 t2 "), (1, "t0 t1 t2 ")]
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (prompt, 6)  # the prompt once, as OpenAI
    assert reply.usage.unified_tokens == 2 * (prompt + 2 * 3)  # each choice charged its prompt and output
    *pieces, usage = chunks
    texts = {i: "".join(c.choices[0].delta.content or "" for c in pieces if c.choices[0].index == i) for i in range(3)}
    assert texts == {i: "t0 t1 t2 " for i in range(3)}
    assert usage.choices == [] and usage.usage.completion_tokens == 9
    assert len(arbiter.ledger.records) == 5 and arbiter.stats().agents["driving/planner"].done == 5


async def test_images_need_an_image_model_in_the_pool():
    arbiter, _ = pool()
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("studio").agent("illustrator"))
    async with arbiter:
        with pytest.raises(fa.UnknownModelError, match="no image model"):
            await client.images.generate(prompt="a lighthouse at dusk")
        with pytest.raises(fa.UnknownModelError, match="text model, not an image model"):
            await client.images.generate(model="chat", prompt="a lighthouse at dusk")
        with pytest.raises(fa.UnknownModelError, match="unknown model"):
            await client.images.generate(model="sdxl", prompt="a lighthouse at dusk")
    assert not arbiter.ledger.records


async def test_inside_a_fair_graph_node_the_drop_in_is_charged_to_the_node():
    arbiter, _ = pool()
    client = AsyncFairOpenAI(arbiter)

    class State(TypedDict, total=False):
        text: str

    async def reporter(state):
        completion = await client.chat.completions.create(model="chat", messages=MESSAGES)
        return {"text": completion.choices[0].message.content}

    builder = StateGraph(State)
    builder.add_node("reporter", reporter)
    builder.add_edge(START, "reporter")
    async with arbiter:
        result = await fair_graph(builder.compile(), app=arbiter.app("driving")).ainvoke({})
    assert result["text"] == "t0 t1 t2 "
    assert arbiter.stats().agents["driving/reporter"].done == 1


# -- a fairagents server (remote) -------------------------------------------------------


async def test_remote_sends_the_app_key_and_the_agent_from_context(server):
    client = AsyncFairOpenAI(base_url="http://fair.test/v1", api_key="sk-driving", http_client=server.async_client())
    with fa.acting_as(fa.Agent("planner", fa.App("driving"))):
        completion = await client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=5)
        stream = await client.chat.completions.create(
            model="chat", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        async with stream:
            chunks = [c async for c in stream]
        image = await client.images.generate(model="image", prompt="a lighthouse")
    await client.close()
    assert completion.choices[0].message.content == "hello" and completion.usage.unified_tokens == 0.75
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello"
    assert isinstance(image, ImagesResponse) and image.data[0].b64_json
    assert [r.url.path for r, _ in server.requests] == ["/v1/chat/completions"] * 2 + ["/v1/images/generations"]
    for request, _ in server.requests:
        assert request.headers["authorization"] == "Bearer sk-driving"
        assert request.headers["x-fairagents-agent"] == "planner"
        assert "x-fairagents-app" not in request.headers


async def test_remote_without_keys_names_the_app_and_sends_no_authorization(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-someone-elses")
    client = AsyncFairOpenAI(
        base_url="http://fair.test/v1", app="studio", agent="writer", http_client=server.async_client()
    )
    await client.chat.completions.create(model="chat", messages=MESSAGES, extra_headers={"X-Trace": "t1"})
    assert "authorization" not in server.headers
    assert (server.headers["x-fairagents-app"], server.headers["x-fairagents-agent"]) == ("studio", "writer")
    assert server.headers["x-trace"] == "t1"


# -- on the real engine ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _client_on(engine, app, agent):
    """An arbiter serving ``engine`` as ``chat``, started, and the in-process client of ``agent`` of ``app``."""
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", engine)
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app(app).agent(agent))
    await arbiter.start()
    try:
        yield arbiter, client
    finally:
        await arbiter.close(stop_engines=False)  # the session's engine outlives the test


@pytest.mark.engine
@pytest.mark.asyncio(loop_scope="session")
async def test_on_the_real_engine(text_engine):
    prompt = text_engine.prepare_chat(MESSAGES).n_tokens
    async with _client_on(text_engine, "driving", "planner") as (arbiter, client):
        completion = await client.chat.completions.create(
            model="chat", messages=MESSAGES, max_tokens=8, seed=5, extra_body={"ignore_eos": True}
        )
        stream = await client.chat.completions.create(
            model="chat", messages=MESSAGES, max_tokens=8, seed=5, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
        async with stream:
            chunks = [c async for c in stream]
    assert completion.usage.prompt_tokens == chunks[-1].usage.prompt_tokens == prompt
    assert completion.usage.completion_tokens == chunks[-1].usage.completion_tokens == 8
    assert completion.choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == completion.choices[0].message.content
    assert completion.usage.unified_tokens + chunks[-1].usage.unified_tokens == pytest.approx(
        arbiter.ledger.service_of("driving")
    )


@pytest.mark.engine
@pytest.mark.asyncio(loop_scope="session")
async def test_a_streamed_usage_prices_the_prefix_cache_as_the_ledger_charged_it(text_engine):
    """A prompt read from vLLM's prefix cache is charged at ``w_cached``: the stream's usage says so, as the server's."""
    history = [{"role": "user", "content": " ".join(f"note {i} on the lighthouse keepers" for i in range(40))}]
    call = dict(model="chat", messages=history, max_tokens=4, extra_body={"ignore_eos": True})
    async with _client_on(text_engine, "notes", "writer") as (arbiter, client):
        await client.chat.completions.create(**call)  # its prompt's blocks stay in the prefix cache
        before = arbiter.ledger.service_of("notes")
        stream = await client.chat.completions.create(**call, stream=True, n=2, stream_options={"include_usage": True})
        async with stream:
            usage = [c async for c in stream][-1].usage
    charged = arbiter.ledger.service_of("notes") - before
    assert usage.unified_tokens == pytest.approx(charged)
    assert charged < 2 * fa.prompt_cost(arbiter.cost, "chat", usage.prompt_tokens, 0)  # the cache was priced in


@pytest.mark.engine
@pytest.mark.asyncio(loop_scope="session")
async def test_images_generate_on_the_real_image_engine(image_engine):
    import base64

    arbiter = fa.Arbiter()
    arbiter.add_model("image", image_engine)
    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("studio").agent("illustrator"))
    await arbiter.start()
    try:
        response = await client.images.generate(prompt="a lighthouse at dusk", size="64x64", n=2)
        with pytest.raises(fa.InvalidParameterError, match="b64_json"):
            await client.images.generate(prompt="a lighthouse", response_format="url")
        with pytest.raises(fa.InvalidParameterError, match="size"):
            await client.images.generate(prompt="a lighthouse", size="large")
        with pytest.raises(fa.InvalidParameterError):
            await client.images.generate(prompt="a lighthouse", size="64x64", n=0)
    finally:
        await arbiter.close(stop_engines=False)
    assert isinstance(response, ImagesResponse) and len(response.data) == 2
    assert all(base64.b64decode(d.b64_json)[:4] == b"\x89PNG" for d in response.data)
    (record,) = arbiter.ledger.records  # the refused calls cost nothing
    assert record.agent == "illustrator" and record.output_tokens == image_engine.latent_tokens((64, 64), image_engine.default_steps, 2)
