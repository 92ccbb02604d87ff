"""The agent frameworks people build with, unchanged, on the embedded model: over HTTP and in process.

Each framework runs against a live ``fairagents serve`` (the stock ``openai`` client, the app's key and the agent's
name in a header) and, where it takes a client object, in process through the drop-in (``AsyncFairOpenAI`` /
``FairOpenAI`` over an arbiter). Every call asks for at most 64 tokens, and schemas are bounded (booleans and enums):
with compact JSON the random-weight model still returns a valid call or answer within that budget. It never chooses
to call a tool by itself, so the tests force a call (``tool_choice``) or offer one tool at a time, and turn parallel
calls off (its array of calls would have no end).
"""

from types import SimpleNamespace
from typing import Literal

import openai
import pytest
import pytest_asyncio
from pydantic import BaseModel

from tests.integrations.conftest import FRAMEWORKS, FRAMEWORKS_KEY

pytestmark = pytest.mark.engine

MAX_TOKENS, SEED = 64, 1
ASK = "What is the weather in Oslo?"


class Forecast(BaseModel):
    """A forecast: bounded (a boolean and an enum), so a random-weight model completes it in few tokens."""

    sunny: bool
    unit: Literal["c", "f"]


def get_weather(metric: bool) -> str:
    """The weather in Oslo now."""
    return "sunny, 21 degrees" if metric else "sunny, 70 degrees"


@pytest.fixture(params=["http", "in_process"])
def where(request):
    return request.param


@pytest_asyncio.fixture
async def connect(where, request):
    """``connect(agent)``: the clients that call as ``agent`` of the app: the stock openai clients against the
    server, or the drop-ins over the in-process arbiter (``.aio``, ``.sync``); over HTTP also the server's ``url``,
    the identity ``headers`` and connection pools for frameworks that make their clients (``.http_aio``, ``.http``)."""
    made = []

    def clients(agent):
        if where == "http":
            url, headers = request.getfixturevalue("fairagents_server"), {"X-Fairagents-Agent": agent}
            pools = {"http_aio": openai.DefaultAsyncHttpxClient(), "http": openai.DefaultHttpxClient()}
            made.append(pools)
            aio = openai.AsyncOpenAI(base_url=url, api_key=FRAMEWORKS_KEY, default_headers=headers,
                                     http_client=pools["http_aio"])
            sync = openai.OpenAI(base_url=url, api_key=FRAMEWORKS_KEY, default_headers=headers,
                                 http_client=pools["http"])
            return SimpleNamespace(aio=aio, sync=sync, url=url, headers=headers, **pools)
        from fairagents_openai import AsyncFairOpenAI, FairOpenAI

        arbiter = request.getfixturevalue("embedded_portal").arbiter
        handle = arbiter.app(FRAMEWORKS).agent(agent)
        return SimpleNamespace(aio=AsyncFairOpenAI(arbiter, agent=handle), sync=FairOpenAI(arbiter, agent=handle))

    yield clients
    for pools in made:  # the in-process clients share the package's arbiter, which outlives them
        await pools["http_aio"].aclose()
        pools["http"].close()


def served(where, request, agent):
    """The calls the agent made, as the pool counted them (in process; over HTTP the server counts them)."""
    if where != "in_process":
        return None
    stats = request.getfixturevalue("embedded_portal").arbiter.stats()
    return stats.agents[f"{FRAMEWORKS}/{agent}"].done


# -- openai's own stream helper ------------------------------------------------------------


async def test_openais_stream_helper_reads_a_strict_call_and_a_response_format(connect):
    """``chat.completions.stream`` parses a strict call's arguments so far after every piece; whitespace alone made it
    raise. Over HTTP this is the stock client; in process the drop-in, which accumulates with openai's own state."""
    client = connect("helper").aio
    tool = openai.pydantic_function_tool(Forecast)
    async with client.chat.completions.stream(
            model="chat", messages=[{"role": "user", "content": ASK}], max_tokens=MAX_TOKENS, seed=SEED, tools=[tool],
            tool_choice={"type": "function", "function": {"name": "Forecast"}}) as stream:
        pieces = [e.arguments_delta async for e in stream if e.type == "tool_calls.function.arguments.delta"]
        called = await stream.get_final_completion()
    [call] = called.choices[0].message.tool_calls
    assert isinstance(call.function.parsed_arguments, Forecast) and all(p.strip() for p in pieces if p)
    assert pieces[0].startswith("{") or (not pieces[0] and pieces[1].startswith("{"))
    async with client.chat.completions.stream(model="chat", messages=[{"role": "user", "content": ASK}],
                                              max_tokens=MAX_TOKENS, seed=SEED, response_format=Forecast) as stream:
        answered = await stream.get_final_completion()
    assert isinstance(answered.choices[0].message.parsed, Forecast)


# -- the OpenAI Agents SDK -----------------------------------------------------------------


async def run_forecaster(agents, model, streamed, **settings):
    """The Agents SDK's forecaster on ``model``, run (or streamed) to its answer; the tool's calls."""
    calls = []

    @agents.function_tool
    def weather(metric: bool) -> str:
        """The weather in Oslo now."""
        calls.append(metric)
        return get_weather(metric)

    forecaster = agents.Agent(
        name="forecaster", instructions="Answer with the forecast.", tools=[weather], output_type=Forecast, model=model,
        # The first turn must call the tool; the SDK then resets the choice to auto, and the answer is constrained.
        model_settings=agents.ModelSettings(max_tokens=MAX_TOKENS, tool_choice="required", parallel_tool_calls=False,
                                            **settings),
    )
    config = agents.RunConfig(tracing_disabled=True)
    if streamed:
        result = agents.Runner.run_streamed(forecaster, ASK, run_config=config, max_turns=3)
        assert "raw_response_event" in [event.type async for event in result.stream_events()]
    else:
        result = await agents.Runner.run(forecaster, ASK, run_config=config, max_turns=3)
    return result, calls


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_openai_agents_sdk_calls_a_function_tool_and_answers_in_its_output_type(connect, streamed):
    agents = pytest.importorskip("agents")
    model = agents.OpenAIChatCompletionsModel(model="chat", openai_client=connect("forecaster").aio)
    result, calls = await run_forecaster(agents, model, streamed, extra_args={"seed": SEED})
    assert isinstance(result.final_output, Forecast)
    assert len(calls) == 1 and isinstance(calls[0], bool)


# -- pydantic-ai ---------------------------------------------------------------------------


def _pydantic_ai_model(client):
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel("chat", provider=OpenAIProvider(openai_client=client))


SETTINGS = {"max_tokens": MAX_TOKENS, "seed": SEED, "parallel_tool_calls": False}


async def test_pydantic_ai_calls_its_tool_then_its_output_tool(connect, where, request):
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.capabilities import PrepareOutputTools, PrepareTools
    from pydantic_ai.messages import ToolReturnPart

    def weather_returned(ctx):
        return any(isinstance(p, ToolReturnPart) and p.tool_name == "weather"
                   for m in ctx.messages for p in getattr(m, "parts", ()))

    async def one_tool_at_a_time(ctx, tool_defs):  # the weather first, the output tool after it
        return [] if weather_returned(ctx) else tool_defs

    async def output_after_weather(ctx, tool_defs):
        return tool_defs if weather_returned(ctx) else []

    planner = pydantic_ai.Agent(_pydantic_ai_model(connect("planner").aio), output_type=Forecast, model_settings=SETTINGS,
                                capabilities=[PrepareTools(one_tool_at_a_time), PrepareOutputTools(output_after_weather)])
    calls = []

    @planner.tool_plain
    def weather(metric: bool) -> str:
        """The weather in Oslo now."""
        calls.append(metric)
        return get_weather(metric)

    before = served(where, request, "planner")
    result = await planner.run(ASK)
    assert isinstance(result.output, Forecast) and len(calls) == 1
    if before is not None:
        assert served(where, request, "planner") == before + 2  # both turns, charged to the agent


async def test_pydantic_ai_native_output_answers_in_json_with_tools_offered(connect):
    pydantic_ai = pytest.importorskip("pydantic_ai")

    writer = pydantic_ai.Agent(_pydantic_ai_model(connect("writer").aio), output_type=pydantic_ai.NativeOutput(Forecast),
                               tools=[get_weather], model_settings=SETTINGS)
    result = await writer.run(ASK)
    assert isinstance(result.output, Forecast)
    async with writer.run_stream(ASK) as stream:
        streamed = await stream.get_output()
    assert isinstance(streamed, Forecast)


# -- langchain-openai's ChatOpenAI, and LangGraph's prebuilt agent on it --------------------


def _chat_openai(connect, where, **options):
    from langchain_openai import ChatOpenAI

    options = {"model": "chat", "max_tokens": MAX_TOKENS, "seed": SEED, **options}
    clients = connect("analyst")
    if where == "http":  # as pointed at any compatible server
        return ChatOpenAI(base_url=clients.url, api_key=FRAMEWORKS_KEY, default_headers=clients.headers,
                          http_client=clients.http, http_async_client=clients.http_aio, **options)
    return ChatOpenAI(api_key="unused", root_client=clients.sync, client=clients.sync.chat.completions,
                      root_async_client=clients.aio, async_client=clients.aio.chat.completions, **options)


async def test_chat_openai_binds_tools_streams_calls_and_structures_output_both_ways(connect, where, request):
    pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool

    llm = _chat_openai(connect, where)
    weather = tool(get_weather)
    forced = llm.bind_tools([weather], tool_choice="get_weather")
    [call] = (await forced.ainvoke(ASK)).tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["metric"], bool)
    [sync_call] = forced.invoke(ASK).tool_calls
    assert isinstance(sync_call["args"]["metric"], bool)
    chunks = [c async for c in llm.bind_tools([weather], tool_choice="any", parallel_tool_calls=False).astream(ASK)]
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    [streamed] = whole.tool_calls
    assert streamed["name"] == "get_weather" and isinstance(streamed["args"]["metric"], bool)
    for method in ("json_schema", "function_calling"):
        assert isinstance(await llm.with_structured_output(Forecast, method=method).ainvoke(ASK), Forecast)
    assert isinstance(llm.with_structured_output(Forecast, method="json_schema").invoke(ASK), Forecast)


async def test_langgraphs_prebuilt_agent_on_chat_openai_calls_the_tool_and_answers_in_a_format(connect, where,
                                                                                               request):
    pytest.importorskip("langchain_openai")
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    calls = []

    @tool
    def weather(metric: bool) -> str:
        """The weather in Oslo now."""
        calls.append(metric)
        return get_weather(metric)

    # A response format makes every turn a required call (the tool, or the answer's own tool): the random model
    # picks between them, so the graph may call the weather more than once before it answers.
    llm = _chat_openai(connect, where, model_kwargs={"parallel_tool_calls": False})  # every request, one call
    agent = create_agent(llm, tools=[weather], response_format=Forecast)
    state = await agent.ainvoke({"messages": [{"role": "user", "content": ASK}]}, {"recursion_limit": 24})
    assert isinstance(state["structured_response"], Forecast)
    assert all(isinstance(m, bool) for m in calls)
