"""The LangGraph guide's tools, structured output, agents and calls from anywhere, runnable on the embedded tiny model.

The embedded model has random weights: left to choose ("auto"), it never calls a tool, and its text is noise. What
a call requires is still valid, because fairagents has vLLM enforce the tools' and the answer's JSON schemas while
decoding; bounding the schemas' strings keeps them short enough for ``max_tokens``.
"""

import asyncio
from typing import Annotated

from fairagents_langgraph import ChatFairAgents, fair_graph
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine
from fairagents.testing import FakeEngine


# --8<-- [start:tools]
@tool
def weather(city: Annotated[str, Field(max_length=24)]) -> str:
    """Today's weather in a city."""
    return f"{city}: 14 °C, light rain"


class Trip(BaseModel):
    """A day trip."""

    destination: str = Field(max_length=24)
    steps: list[Annotated[str, Field(max_length=30)]] = Field(max_length=3)
# --8<-- [end:tools]


async def main():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", VLLMEngine())  # the embedded tiny model
    travel = arbiter.app("travel")
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=400)  # room for a call's JSON
    async with arbiter:
        with fa.acting_as(travel.agent("concierge")):
            # --8<-- [start:bind]
            asking = llm.bind_tools([weather], tool_choice="any", parallel_tool_calls=False)  # one call, required
            message = await asking.ainvoke([HumanMessage("What is the weather in Bergen?")])
            call = message.tool_calls[0]  # {"name": "weather", "args": {"city": ...}, "id": ..., ...}
            result = weather.invoke(call)  # the tool's answer, as a ToolMessage for the next turn
            # --8<-- [end:bind]
            assert call["name"] == "weather" and result.tool_call_id == call["id"]

            # --8<-- [start:structured]
            planner = llm.with_structured_output(Trip, method="json_schema")
            trip = await planner.ainvoke("Plan a day trip from Oslo.")  # a Trip, whatever the model
            # --8<-- [end:structured]
            assert isinstance(trip, Trip)

        # --8<-- [start:agent]
        agent = fair_graph(create_agent(llm, tools=[weather]), app=travel)  # its nodes are the app's agents
        state = await agent.ainvoke({"messages": [HumanMessage("What is the weather in Bergen?")]})
        print(state["messages"][-1].content)
        # --8<-- [end:agent]

        # --8<-- [start:threads]
        with fa.acting_as(travel.agent("concierge")):
            await llm.ainvoke("Hello")  # on the arbiter's loop
            await asyncio.to_thread(llm.invoke, "Hello")  # sync code, in a worker thread
            await asyncio.to_thread(asyncio.run, llm.ainvoke("Hello"))  # another loop, in another thread
            # llm.invoke("Hello") here, on the arbiter's own loop, would block it: ProtocolError
        # --8<-- [end:threads]
    assert arbiter.stats().agents["travel/model"].done >= 1  # create_agent's model node, as an agent
    assert arbiter.stats().agents["travel/concierge"].done == 5
    await asyncio.to_thread(sync_script)  # a script of its own, with no loop
    assert remote().config["metadata"]["fairagents_app"] == "travel"  # built; no server is called here


def sync_script():
    # --8<-- [start:script]
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", FakeEngine())  # a stand-in for the sketch; VLLMEngine() works the same
    portal = fa.Portal(arbiter)
    llm = ChatFairAgents(portal=portal, agent=arbiter.app("travel").agent("concierge"), max_tokens=32)
    try:
        print(llm.invoke("Hello").content)  # no event loop: the portal starts the arbiter on a thread of its own
        print(asyncio.run(llm.ainvoke("Hello")).content)  # any loop reaches it too
    finally:
        portal.close()  # closes the arbiter (its engines stop) and ends the thread
    # --8<-- [end:script]


def remote():
    # --8<-- [start:remote]
    llm = ChatFairAgents(base_url="http://localhost:8000/v1", api_key="sk-travel", model="chat", max_tokens=400)
    agent = fair_graph(create_agent(llm, tools=[weather]), app="travel")  # the same agent, over HTTP
    # --8<-- [end:remote]
    return agent


if __name__ == "__main__":
    asyncio.run(main())
