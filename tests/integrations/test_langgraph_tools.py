"""ChatFairAgents with tools and structured output, LangGraph's and LangChain's agents on it, and calls from any
loop or thread.

The engine is a FakeEngine scripted to answer as a model would (a call in the Hermes syntax, which vLLM's hermes
parser reads back; JSON under a constraint); the standard LangChain suites in test_langchain_standard.py run the
same code on the real embedded model.
"""

import asyncio
import concurrent.futures
import functools
import json
import operator

import httpx
import pytest
from fairagents_langgraph import ChatFairAgents, fair_graph
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, trim_messages
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel
from typing_extensions import TypedDict

import fairagents as fa
from fairagents.errors import ProtocolError
from fairagents.testing import FakeEngine

pytest.importorskip("vllm")  # the FakeEngine reads calls made under "auto" with vLLM's hermes parser

ASK = [HumanMessage("What is the weather in Oslo?")]
CALL_TEXT = 'Let me look. <tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'


@tool
def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"{city}: sunny, 14 °C"


class Forecast(BaseModel):
    """The weather of a city."""

    city: str
    sky: str


class ForecastDict(TypedDict):
    """The weather of a city."""

    city: str
    sky: str


FORECAST = {"city": "Oslo", "sky": "sunny"}


def pool(reply=None, **engine_kw):
    arbiter = fa.Arbiter()
    engine = FakeEngine(reply=reply, **engine_kw)
    arbiter.add_model("chat", engine)
    return arbiter, engine, arbiter.app("travel").agent("concierge")


def replies(*texts):
    """A FakeEngine script saying ``texts`` in turn, one per call."""
    said = iter(texts)
    return lambda params: next(said)


def recording_messages(engine):
    """Record the messages every chat prompt the engine prepares was made of."""
    seen = []
    prepare = engine.prepare_chat

    def recording(messages, tools=None):
        seen.append(list(messages))
        return prepare(messages, tools=tools)

    engine.prepare_chat = recording
    return seen


def structured(engine):
    """The decoding constraint of each call the engine served, in order."""
    return [params.structured for params in engine.params.values()]


# -- tools ----------------------------------------------------------------------------


async def test_bound_tools_reach_the_template_and_calls_come_back_whole_and_streamed():
    arbiter, engine, concierge = pool(reply=CALL_TEXT)
    llm = ChatFairAgents(arbiter=arbiter, agent=concierge).bind_tools([weather])
    async with arbiter:
        message = await llm.ainvoke(ASK)
        chunks = [c async for c in llm.astream(ASK)]
    [call] = message.tool_calls
    assert (call["name"], call["args"], call["type"]) == ("weather", {"city": "Oslo"}, "tool_call")
    assert call["id"].startswith(("call_", "chatcmpl-tool-"))
    assert message.content.strip() == "Let me look."
    assert message.response_metadata["finish_reason"] == "tool_calls" and not message.invalid_tool_calls
    assert engine.tools[-1] == [convert_to_openai_tool(weather)]  # the chat template was given the tool
    streamed = functools.reduce(operator.add, chunks)
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [("weather", {"city": "Oslo"})]
    assert any(c.tool_call_chunks for c in chunks)
    assert chunks[-1].response_metadata["finish_reason"] == "tool_calls" and chunks[-1].chunk_position == "last"
    assert streamed.usage_metadata["output_tokens"] == message.usage_metadata["output_tokens"]


@pytest.mark.parametrize(("choice", "sent"), [
    ("auto", "auto"),
    ("none", "none"),
    ("any", "required"),
    ("required", "required"),
    (True, "required"),
    ("weather", {"type": "function", "function": {"name": "weather"}}),
    ({"type": "function", "function": {"name": "weather"}}, {"type": "function", "function": {"name": "weather"}}),
])
def test_tool_choice_takes_langchains_values(choice, sent):
    llm = ChatFairAgents(arbiter=fa.Arbiter())
    bound = llm.bind_tools([weather], tool_choice=choice, parallel_tool_calls=False, strict=True)
    assert bound.kwargs["tool_choice"] == sent
    assert bound.kwargs["parallel_tool_calls"] is False
    assert bound.kwargs["tools"][0]["function"]["strict"] is True


def test_a_tool_choice_naming_no_tool_is_refused_at_once():
    with pytest.raises(fa.InvalidParameterError, match="clock"):
        ChatFairAgents(arbiter=fa.Arbiter()).bind_tools([weather], tool_choice="clock")


async def test_a_forced_call_is_constrained_in_decoding_and_read_from_its_json():
    arbiter, engine, concierge = pool(reply=replies(
        '[{"name": "weather", "parameters": {"city": "Oslo"}}]',  # "any": an array of calls
        '{"city": "Bergen"}',  # a named function: its arguments
        '{"city": "Ber',  # cut short: an invalid call, not an error
    ))
    llm = ChatFairAgents(arbiter=arbiter, agent=concierge)
    async with arbiter:
        required = await llm.bind_tools([weather], tool_choice="any").ainvoke(ASK)
        named = await llm.bind_tools([weather], tool_choice="weather").ainvoke(ASK)
        cut = await llm.bind_tools([weather], tool_choice="weather").ainvoke(ASK)
    assert [c["args"] for c in required.tool_calls] == [{"city": "Oslo"}]
    assert [c["args"] for c in named.tool_calls] == [{"city": "Bergen"}]
    assert not cut.tool_calls and cut.invalid_tool_calls[0]["args"] == '{"city": "Ber'
    required_schema, named_schema, _ = structured(engine)
    assert required_schema["json"]["type"] == "array"
    assert named_schema == {"json": convert_to_openai_tool(weather)["function"]["parameters"]}


async def test_parallel_tool_calls_off_on_the_model_holds_every_turn_to_one_call_unless_a_binding_says_otherwise():
    call = '[{"name": "weather", "parameters": {"city": "Oslo"}}]'
    arbiter, engine, concierge = pool(reply=replies(call, call, "plain text"))
    llm = ChatFairAgents(arbiter=arbiter, agent=concierge, parallel_tool_calls=False)
    async with arbiter:
        await llm.bind_tools([weather], tool_choice="any").ainvoke(ASK)
        await llm.bind_tools([weather], tool_choice="any", parallel_tool_calls=True).ainvoke(ASK)
        await llm.ainvoke(ASK)  # no tools: nothing to hold
    one, several, plain = structured(engine)
    assert one["json"]["maxItems"] == 1 and "maxItems" not in several["json"] and plain is None


async def test_tool_calls_and_results_in_the_history_go_to_the_model_in_openai_form():
    arbiter, engine, concierge = pool(reply="Sunny in Oslo.")
    seen = recording_messages(engine)
    history = [
        *ASK,
        AIMessage(
            [{"type": "thinking", "thinking": "Oslo, then.", "signature": "x"}, {"type": "text", "text": "Hm."}],
            tool_calls=[{"name": "weather", "args": {"city": "Oslo"}, "id": "call_1"}],
        ),
        ToolMessage("Oslo: sunny", tool_call_id="call_1"),
    ]
    async with arbiter:
        answer = await ChatFairAgents(arbiter=arbiter, agent=concierge).bind_tools([weather]).ainvoke(history)
    assert answer.content == "Sunny in Oslo." and not answer.tool_calls
    _, asked, answered = seen[-1]
    assert (asked["role"], asked["content"]) == ("assistant", "Hm.")  # an earlier turn's reasoning is left out
    assert asked["tool_calls"] == [
        {"type": "function", "id": "call_1", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
    ]
    assert answered == {"role": "tool", "tool_call_id": "call_1", "content": "Oslo: sunny"}


async def test_bad_tools_and_formats_are_typed_errors_before_anything_is_charged():
    arbiter, _, concierge = pool()
    llm = ChatFairAgents(arbiter=arbiter, agent=concierge)
    async with arbiter:
        for bad in (
            {"tools": [{"type": "function", "function": {"name": "has space"}}]},
            {"response_format": {"type": "xml"}},
            {"tool_choice": "required"},  # without tools
        ):
            with pytest.raises(fa.InvalidParameterError):
                await llm.ainvoke(ASK, **bad)
    assert not arbiter.ledger.records


# -- structured output ------------------------------------------------------------------


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
@pytest.mark.parametrize("schema", [Forecast, ForecastDict, Forecast.model_json_schema()], ids=["pydantic", "typeddict",
                                                                                                 "json_schema"])
async def test_structured_output_in_each_method_and_kind_of_schema(method, schema):
    arbiter, engine, concierge = pool(reply=json.dumps(FORECAST))
    chain = ChatFairAgents(arbiter=arbiter, agent=concierge).with_structured_output(schema, method=method)
    async with arbiter:
        result = await chain.ainvoke(ASK)
        streamed = [item async for item in chain.astream(ASK)]
    expected = Forecast(**FORECAST) if schema is Forecast else FORECAST
    assert result == expected and streamed[-1] == expected
    parameters = convert_to_openai_tool(schema)["function"]["parameters"]
    assert structured(engine)[0] == ({"json_object": True} if method == "json_mode" else {"json": parameters})
    if method == "function_calling":
        assert engine.tools[0] == [convert_to_openai_tool(schema)]


async def test_structured_output_with_include_raw_returns_the_parsing_error_instead_of_raising():
    arbiter, _, concierge = pool(reply='{"city": "Oslo"')
    llm = ChatFairAgents(arbiter=arbiter, agent=concierge)
    async with arbiter:
        out = await llm.with_structured_output(Forecast, method="json_schema", include_raw=True).ainvoke(ASK)
        with pytest.raises(Exception, match="Forecast"):
            await llm.with_structured_output(Forecast, method="json_schema").ainvoke(ASK)
    assert out["parsed"] is None and out["parsing_error"] is not None
    assert out["raw"].content == '{"city": "Oslo"'


def test_structured_output_refuses_what_it_cannot_do():
    llm = ChatFairAgents(arbiter=fa.Arbiter())
    with pytest.raises(fa.InvalidParameterError, match="method"):
        llm.with_structured_output(Forecast, method="xml")
    with pytest.raises(fa.InvalidParameterError, match="needs a schema"):
        llm.with_structured_output(None)
    with pytest.raises(fa.InvalidParameterError, match="tools"):
        llm.with_structured_output(Forecast, tools=[weather])
    assert llm.with_structured_output(None, method="json_mode").first.kwargs["response_format"] == {
        "type": "json_object"}


# -- token counting ------------------------------------------------------------------------


def no_downloaded_tokenizer(monkeypatch):
    """Make LangChain's fallback tokenizer (GPT-2, fetched from the network) fail if anything asks for it."""

    def refuse():
        raise AssertionError("LangChain's GPT-2 tokenizer was asked for")

    monkeypatch.setattr("langchain_core.language_models.base.get_tokenizer", refuse)


def test_token_counting_renders_tools_with_the_models_template_offline(monkeypatch):
    no_downloaded_tokenizer(monkeypatch)
    arbiter, engine, _ = pool()
    llm = ChatFairAgents(arbiter=arbiter)
    history = [HumanMessage("one two three"), AIMessage("four five"), HumanMessage("six")]
    plain = llm.get_num_tokens_from_messages(history)
    with_tools = llm.get_num_tokens_from_messages(history, tools=[weather])
    converted = [{"role": "user", "content": "one two three"}, {"role": "assistant", "content": "four five"},
                 {"role": "user", "content": "six"}]
    assert with_tools == engine.prepare_chat(converted, tools=[convert_to_openai_tool(weather)]).n_tokens > plain
    assert llm.get_num_tokens_from_messages([]) == 0 and llm.get_token_ids("") == []
    kept = trim_messages(history, max_tokens=plain - 1, token_counter=llm, strategy="last")
    assert kept and llm.get_num_tokens_from_messages(kept) <= plain - 1


# -- agents -------------------------------------------------------------------------------


async def test_create_react_agent_runs_the_tool_and_answers_and_its_nodes_are_agents():
    from langgraph.prebuilt import create_react_agent

    arbiter, _, _ = pool(reply=replies(CALL_TEXT, "It is sunny in Oslo."))
    llm = ChatFairAgents(arbiter=arbiter, max_tokens=64)
    agent = fair_graph(create_react_agent(llm, [weather]), app=arbiter.app("travel"))
    async with arbiter:
        result = await agent.ainvoke({"messages": ASK})
    human, asked, answered, final = result["messages"]
    assert [c["args"] for c in asked.tool_calls] == [{"city": "Oslo"}]
    assert answered.content == "Oslo: sunny, 14 °C" and answered.tool_call_id == asked.tool_calls[0]["id"]
    assert final.content == "It is sunny in Oslo."
    stats = arbiter.stats().agents
    assert (stats["travel/agent"].done, stats["travel/tools"].done) == (2, 0)


def test_create_react_agent_from_sync_code_with_no_event_loop():
    from langgraph.prebuilt import create_react_agent

    arbiter, engine, concierge = pool(reply=replies(CALL_TEXT, "It is sunny in Oslo."))
    portal = fa.Portal(arbiter)
    try:
        agent = create_react_agent(ChatFairAgents(portal=portal, agent=concierge, max_tokens=64), [weather])
        result = agent.invoke({"messages": ASK})  # starts the arbiter on the portal's loop thread
    finally:
        portal.close()
    assert result["messages"][-1].content == "It is sunny in Oslo." and not engine.started


async def test_create_agent_runs_the_tool_and_answers_in_its_response_format():
    agents = pytest.importorskip("langchain.agents")

    arbiter, engine, concierge = pool(reply=replies(  # every turn must call: a tool, or the answer's tool
        '[{"name": "weather", "parameters": {"city": "Oslo"}}]',
        '[{"name": "Forecast", "parameters": {"city": "Oslo", "sky": "sunny"}}]',
    ))
    llm = ChatFairAgents(arbiter=arbiter, agent=concierge, max_tokens=64)
    agent = agents.create_agent(llm, tools=[weather], response_format=Forecast)
    async with arbiter:
        result = await agent.ainvoke({"messages": ASK})
    assert result["structured_response"] == Forecast(**FORECAST)
    assert [m.content for m in result["messages"] if m.type == "tool"][0] == "Oslo: sunny, 14 °C"
    assert all(s["json"]["type"] == "array" for s in structured(engine))  # both turns had to call, in decoding


async def test_create_agent_answers_in_json_with_the_provider_strategy():
    agents = pytest.importorskip("langchain.agents")
    from langchain.agents.structured_output import ProviderStrategy

    arbiter, engine, concierge = pool(reply=json.dumps(FORECAST))
    llm = ChatFairAgents(arbiter=arbiter, agent=concierge, max_tokens=64)
    agent = agents.create_agent(llm, tools=[], response_format=ProviderStrategy(Forecast))
    async with arbiter:
        result = await agent.ainvoke({"messages": ASK})
    assert result["structured_response"] == Forecast(**FORECAST)
    assert structured(engine) == [{"json": Forecast.model_json_schema()}]


# -- from any loop or thread -------------------------------------------------------------------


def test_one_model_serves_sync_code_other_loops_and_threads():
    arbiter, engine, concierge = pool(tokens_per_reply=3)
    portal = fa.Portal(arbiter)
    llm = ChatFairAgents(portal=portal, agent=concierge)

    async def elsewhere():  # a loop of its own, not the arbiter's
        chunks = [c async for c in llm.astream(ASK)]
        return [await llm.ainvoke(ASK), *await llm.abatch([ASK, ASK])], chunks

    try:
        assert llm.invoke(ASK).content == "t0 t1 t2 "  # no loop anywhere: the portal starts the arbiter
        assert [c.content for c in llm.stream(ASK)] == ["t0 ", "t1 ", "t2 "]
        assert len(llm.batch([ASK, ASK])) == 2
        for _ in range(2):  # two loops, one after the other
            answers, chunks = asyncio.run(elsewhere())
            assert [m.content for m in answers] == ["t0 t1 t2 "] * 3 and len(chunks) == 3
        with concurrent.futures.ThreadPoolExecutor(4) as threads:
            assert {m.content for m in threads.map(lambda _: llm.invoke(ASK), range(8))} == {"t0 t1 t2 "}
    finally:
        portal.close()
    assert arbiter.stats().agents["travel/concierge"].done == 4 + 2 * 4 + 8 and not engine.started


def test_a_sync_graph_run_with_no_event_loop_charges_each_node():
    from langgraph.graph import START, MessagesState, StateGraph

    arbiter, _, _ = pool(tokens_per_reply=2)
    portal = fa.Portal(arbiter)
    llm = ChatFairAgents(portal=portal)

    def node(state):  # a sync node, calling sync
        return {"messages": [llm.invoke(state["messages"]), *llm.batch([state["messages"]] * 2)]}

    builder = StateGraph(MessagesState)
    builder.add_node("planner", node)
    builder.add_node("writer", lambda state: {"messages": [functools.reduce(operator.add, llm.stream(ASK))]})
    builder.add_edge(START, "planner")
    builder.add_edge("planner", "writer")
    try:
        result = fair_graph(builder.compile(), app=arbiter.app("travel")).invoke({"messages": ASK})
    finally:
        portal.close()
    assert [m.content for m in result["messages"][1:]] == ["t0 t1 "] * 4
    stats = arbiter.stats().agents
    assert (stats["travel/planner"].done, stats["travel/writer"].done) == (3, 1)


async def test_calls_from_another_loop_in_another_thread_reach_the_arbiters_loop():
    arbiter, _, concierge = pool(tokens_per_reply=2)
    llm = ChatFairAgents(arbiter=arbiter, agent=concierge)
    async with arbiter:
        message = await asyncio.to_thread(asyncio.run, llm.ainvoke(ASK))
        with pytest.raises(ProtocolError):
            llm.batch([ASK])  # sync, on the arbiter's own loop
    assert message.content == "t0 t1 "


def test_a_call_that_cannot_be_served_raises_instead_of_hanging():
    arbiter, _, concierge = pool()
    llm = ChatFairAgents(arbiter=arbiter, agent=concierge)

    async def run_and_leave():
        await arbiter.start()  # never closed: its engines belong to a loop that ends with asyncio.run
        await llm.ainvoke(ASK)

    asyncio.run(run_and_leave())
    with pytest.raises(fa.ShutdownError):
        llm.invoke(ASK)
    with pytest.raises(fa.ShutdownError):
        asyncio.run(llm.ainvoke(ASK))


async def test_streaming_makes_invoke_stream_underneath_so_callbacks_see_each_token():
    from langchain_core.callbacks import AsyncCallbackHandler

    class Tokens(AsyncCallbackHandler):
        def __init__(self):
            self.seen = []

        async def on_llm_new_token(self, token, **kwargs):
            self.seen.append(token)

    arbiter, _, concierge = pool(tokens_per_reply=3)
    tokens = Tokens()
    async with arbiter:
        message = await ChatFairAgents(arbiter=arbiter, agent=concierge, streaming=True).ainvoke(
            ASK, config={"callbacks": [tokens]})
    assert message.content == "t0 t1 t2 " and [t for t in tokens.seen if t] == ["t0 ", "t1 ", "t2 "]


@pytest.mark.parametrize("streamed", [False, True])
def test_a_call_past_its_timeout_is_cancelled(streamed):
    arbiter, engine, concierge = pool(tokens_per_reply=100, token_time=0.5)
    portal = fa.Portal(arbiter)
    llm = ChatFairAgents(portal=portal, agent=concierge, timeout=0.2)
    try:
        with pytest.raises(TimeoutError):
            list(llm.stream(ASK)) if streamed else llm.invoke(ASK)
        assert portal.run_sync(asyncio.sleep, 0.1) is None and not engine.running  # its request was cancelled
    finally:
        portal.close()
    assert arbiter.stats().agents["travel/concierge"].done == 0


# -- a fairagents server -------------------------------------------------------------------------


class ToolServer:
    """An OpenAI-compatible endpoint whose model calls ``weather`` for Oslo, whole or streamed."""

    def __init__(self):
        self.bodies = []

    def handle(self, request):
        body = json.loads(request.content)
        self.bodies.append(body)
        head = {"id": "chatcmpl-1", "created": 1, "model": body["model"]}
        usage = {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15, "unified_tokens": 1.5}
        call = {"id": "call_7", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
        if not body.get("stream"):
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            return httpx.Response(200, json={**head, "object": "chat.completion", "usage": usage, "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls"}]})
        head = {**head, "object": "chat.completion.chunk"}
        opening = {**call, "index": 0, "function": {"name": "weather", "arguments": ""}}
        deltas = [
            {"role": "assistant", "tool_calls": [opening]},
            {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]},
        ]
        chunks = [{**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        chunks[-1]["choices"][0]["finish_reason"] = "tool_calls"
        chunks.append({**head, "choices": [], "usage": usage})
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})


async def test_remote_calls_send_tools_and_read_calls_whole_and_streamed():
    server = ToolServer()
    llm = ChatFairAgents(
        base_url="http://fair.test/v1", api_key="sk-travel", agent="concierge", max_retries=0,
        http_async_client=httpx.AsyncClient(transport=httpx.MockTransport(server.handle)),
        http_client=httpx.Client(transport=httpx.MockTransport(server.handle)),
    )
    bound = llm.bind_tools([weather], tool_choice="any", parallel_tool_calls=False)
    history = [*ASK, AIMessage("", tool_calls=[{"name": "weather", "args": {"city": "Bergen"}, "id": "call_1"}]),
               ToolMessage("Bergen: rain", tool_call_id="call_1")]
    message = await bound.ainvoke(history)
    streamed = functools.reduce(operator.add, await asyncio.to_thread(lambda: list(bound.stream(ASK))))
    formatted = await bound.ainvoke(ASK, response_format={"type": "json_object"})
    for m in (message, streamed, formatted):
        assert [(c["name"], c["args"], c["id"]) for c in m.tool_calls] == [("weather", {"city": "Oslo"}, "call_7")]
        assert m.response_metadata["finish_reason"] == "tool_calls"
    first, second, third = server.bodies
    assert first["tools"] == [convert_to_openai_tool(weather)]
    assert (first["tool_choice"], first["parallel_tool_calls"]) == ("required", False)
    assert first["messages"][1]["tool_calls"][0]["function"] == {"name": "weather", "arguments": '{"city": "Bergen"}'}
    assert first["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "content": "Bergen: rain"}
    assert second["stream"] and third["response_format"] == {"type": "json_object"}
    assert streamed.usage_metadata == {"input_tokens": 9, "output_tokens": 6, "total_tokens": 15}


async def test_agents_run_over_http_through_a_real_fairagents_server():
    """create_react_agent and create_agent with a response format, each over HTTP to a live server."""
    agents = pytest.importorskip("langchain.agents")
    from langgraph.prebuilt import create_react_agent

    from fairagents.server import Config, create_app, running

    engine = FakeEngine(reply=replies(
        CALL_TEXT, "It is sunny in Oslo.",  # the ReAct agent: a call under "auto", then an answer
        '[{"name": "weather", "parameters": {"city": "Oslo"}}]',  # create_agent: every turn must call
        '[{"name": "Forecast", "parameters": {"city": "Oslo", "sky": "sunny"}}]',
    ))
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", engine)
    config = Config.model_validate({"apps": {"travel": {"api_key": "sk-travel"}}, "models": {"chat": {}}})
    await arbiter.start()
    try:
        async with running(create_app(arbiter, config)) as url:
            llm = ChatFairAgents(base_url=f"{url}/v1", api_key="sk-travel", model="chat", max_tokens=64)
            react = fair_graph(create_react_agent(llm, [weather]), app="travel")
            answered = await react.ainvoke({"messages": ASK})
            structured_agent = agents.create_agent(llm, tools=[weather], response_format=Forecast)
            formatted = await fair_graph(structured_agent, app="travel").ainvoke({"messages": ASK})
    finally:
        await arbiter.close()
    assert answered["messages"][-1].content == "It is sunny in Oslo."
    assert [m.content for m in answered["messages"] if m.type == "tool"] == ["Oslo: sunny, 14 °C"]
    assert formatted["structured_response"] == Forecast(**FORECAST)
    assert all(s["json"]["type"] == "array" for s in structured(engine)[-2:])  # required over HTTP too
    assert set(arbiter.stats().agents) >= {"travel/agent", "travel/model"}  # the graphs' nodes, as agents


async def test_a_stream_refused_for_what_the_model_cannot_do_prepares_no_prompt():
    class NoTools(FakeEngine):
        tool_parser = None

        def __init__(self):
            super().__init__()
            self.prepared = 0

        def prepare_chat(self, messages, tools=None):
            self.prepared += 1
            return super().prepare_chat(messages, tools=tools)

    arbiter = fa.Arbiter()
    engine = NoTools()
    arbiter.add_model("chat", engine)
    llm = ChatFairAgents(arbiter=arbiter, model="chat", agent=arbiter.app("a").agent("bot"))
    async with arbiter:
        with pytest.raises(fa.InvalidParameterError, match="takes no tools"):
            [c async for c in llm.bind_tools([weather]).astream(ASK)]
    assert engine.prepared == 0 and not arbiter.ledger.records
