"""The agent frameworks guide, runnable end to end on the embedded tiny model (a server on loopback, then in process).

The embedded model has random weights: it never chooses a tool by itself, so these agents are told to call one
(``tool_choice``) or offered one at a time, and parallel calls are off. A real model needs neither.
"""

import asyncio
from typing import Literal

import openai
from pydantic import BaseModel

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine
from fairagents.server import Config, create_app, running


class Forecast(BaseModel):
    sunny: bool
    unit: Literal["c", "f"]


def get_weather(metric: bool) -> str:
    """The weather in Oslo now."""
    return "sunny, 21 degrees" if metric else "sunny, 70 degrees"


async def main():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", VLLMEngine())  # the embedded tiny model
    config = Config.model_validate({"apps": {"travel": {"api_key": "sk-travel"}}, "models": {"chat": {}}})
    async with arbiter, running(create_app(arbiter, config)) as url:  # what `fairagents serve` runs
        base_url = f"{url}/v1"
        print(await agents_sdk(base_url))
        print(await pydantic_ai(base_url))
        print(await langchain_openai(base_url))
        print(await langgraph(base_url))
        print(await in_process(arbiter))
    assert set(arbiter.stats().agents) >= {"travel/forecaster", "travel/planner", "travel/analyst", "travel/router"}


async def agents_sdk(base_url):
    # --8<-- [start:agents]
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool

    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-travel",  # the app's key
                                default_headers={"X-Fairagents-Agent": "forecaster"})  # the agent
    forecaster = Agent(
        name="forecaster", instructions="Answer with the forecast.", tools=[function_tool(get_weather)],
        output_type=Forecast, model=OpenAIChatCompletionsModel(model="chat", openai_client=client),
        model_settings=ModelSettings(max_tokens=64, tool_choice="required", parallel_tool_calls=False),
    )
    result = await Runner.run(forecaster, "Weather in Oslo?", run_config=RunConfig(tracing_disabled=True))
    # --8<-- [end:agents]
    await client.close()
    return result.final_output


async def pydantic_ai(base_url):
    # --8<-- [start:pydantic_ai]
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-travel",
                                default_headers={"X-Fairagents-Agent": "planner"})
    planner = Agent(OpenAIChatModel("chat", provider=OpenAIProvider(openai_client=client)),
                    output_type=NativeOutput(Forecast), tools=[get_weather], model_settings={"max_tokens": 64})
    result = await planner.run("Weather in Oslo?")
    # --8<-- [end:pydantic_ai]
    await client.close()
    return result.output


async def langchain_openai(base_url):
    # --8<-- [start:langchain]
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    async with openai.DefaultAsyncHttpxClient() as http:  # its connections, closed with the block
        llm = ChatOpenAI(model="chat", base_url=base_url, api_key="sk-travel", max_tokens=64,
                         default_headers={"X-Fairagents-Agent": "analyst"}, http_async_client=http)
        call = await llm.bind_tools([tool(get_weather)], tool_choice="get_weather").ainvoke("Weather in Oslo?")
        forecast = await llm.with_structured_output(Forecast, method="json_schema").ainvoke("Weather in Oslo?")
    # --8<-- [end:langchain]
    return call.tool_calls[0]["args"], forecast


async def langgraph(base_url):
    # --8<-- [start:langgraph]
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    async with openai.DefaultAsyncHttpxClient() as http:
        llm = ChatOpenAI(model="chat", base_url=base_url, api_key="sk-travel", max_tokens=64,
                         default_headers={"X-Fairagents-Agent": "router"}, http_async_client=http,
                         model_kwargs={"parallel_tool_calls": False})
        agent = create_agent(llm, tools=[tool(get_weather)], response_format=Forecast)
        state = await agent.ainvoke({"messages": [{"role": "user", "content": "Weather in Oslo?"}]})
    # --8<-- [end:langgraph]
    return state["structured_response"]


async def in_process(arbiter):
    # --8<-- [start:in_process]
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner
    from fairagents_openai import AsyncFairOpenAI

    client = AsyncFairOpenAI(arbiter, agent=arbiter.app("desk").agent("forecaster"))  # no server, no HTTP
    forecaster = Agent(name="forecaster", output_type=Forecast,
                       model=OpenAIChatCompletionsModel(model="chat", openai_client=client),
                       model_settings=ModelSettings(max_tokens=64))
    result = await Runner.run(forecaster, "Weather in Oslo?", run_config=RunConfig(tracing_disabled=True))
    # --8<-- [end:in_process]
    return result.final_output


if __name__ == "__main__":
    asyncio.run(main())
