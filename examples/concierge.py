"""A travel concierge: a ReAct-style agent with tools, a tool node, and a structured final answer.

The ``agent`` node asks the model with the tools bound; when the reply calls tools, the
``tools`` node (LangGraph's ``ToolNode``) runs them and the agent reads their results;
when it stops calling (or after ``MAX_ROUNDS`` rounds), the ``answer`` node asks for the
final answer as a ``Trip`` (a pydantic model), through structured output. Under
``fair_graph`` the nodes are the agents of the ``concierge`` app.

The embedded tiny model has random weights: it would never choose to call a tool, so the
first round requires one (``tool_choice="any"``, one call at a time), and its arguments
are noise. Still, the
calls and the answer are valid, because fairagents has vLLM enforce the tools' and the
answer's JSON schemas while decoding. A real model would be left to choose ("auto").

    python examples/concierge.py
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fairagents_langgraph import ChatFairAgents, fair_graph
from langchain_core.messages import AnyMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine

APP = "concierge"
REQUEST = "Plan a day trip from Oslo to Bergen: how do I get there, and what is the weather?"
MAX_ROUNDS = 2


@tool
def weather(city: Annotated[str, Field(max_length=24)]) -> str:
    """Today's weather in a city."""
    return f"{city}: 14 °C, light rain"


@tool
def route(origin: Annotated[str, Field(max_length=24)], destination: Annotated[str, Field(max_length=24)]) -> str:
    """How to travel from one city to another, and how long it takes."""
    return f"{origin} to {destination}: train, 7 h"


TOOLS = [weather, route]


class Trip(BaseModel):
    """The concierge's final answer."""

    summary: str = Field(max_length=60, description="the plan in one sentence")
    steps: list[Annotated[str, Field(max_length=30)]] = Field(max_length=3, description="what to do, in order")


class Conversation(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    rounds: int
    trip: Trip


def build(llm: ChatFairAgents) -> StateGraph:
    """The concierge's graph, as anyone would write it without fairagents."""
    answerer = llm.with_structured_output(Trip, method="json_schema")

    async def agent(state: Conversation) -> Conversation:
        rounds = state.get("rounds", 0)
        model = llm.bind_tools(TOOLS, tool_choice="any" if rounds == 0 else "auto", parallel_tool_calls=False)
        return {"messages": [await model.ainvoke(state["messages"])], "rounds": rounds + 1}

    def route_next(state: Conversation) -> str:
        calls = getattr(state["messages"][-1], "tool_calls", None)
        return "tools" if calls and state["rounds"] <= MAX_ROUNDS else "answer"

    async def answer(state: Conversation) -> Conversation:
        return {"trip": await answerer.ainvoke(state["messages"])}

    builder = StateGraph(Conversation)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(TOOLS))
    builder.add_node("answer", answer)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route_next, ["tools", "answer"])
    builder.add_edge("tools", "agent")
    builder.add_edge("answer", END)
    return builder


async def plan(arbiter: fa.Arbiter) -> Conversation:
    """Run the concierge on ``arbiter`` (a started arbiter with a model ``"chat"``); the final state."""
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=300)
    graph = fair_graph(build(llm).compile(), app=arbiter.app(APP))
    return await graph.ainvoke({"messages": [HumanMessage(REQUEST)]})


async def main(arbiter: fa.Arbiter | None = None) -> Conversation:
    if arbiter is None:  # run alone: the embedded tiny model on an in-process vLLM engine
        arbiter = fa.Arbiter()
        arbiter.add_model("chat", VLLMEngine())
        async with arbiter:
            return await main(arbiter)
    result = await plan(arbiter)
    for message in result["messages"]:
        for call in getattr(message, "tool_calls", None) or []:
            print(f"called {call['name']}({call['args']})")
    print(f"trip: {result['trip']!r}")
    return result


if __name__ == "__main__":
    asyncio.run(main())
