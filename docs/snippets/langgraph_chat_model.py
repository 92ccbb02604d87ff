"""The LangGraph guide's chat model outside a graph, and bad input under a retry policy, on the embedded tiny model."""

import asyncio
import functools
import operator

from fairagents_langgraph import ChatFairAgents, fair_graph
from langgraph.graph import START, StateGraph
from langgraph.types import RetryPolicy
from typing_extensions import TypedDict

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine


class State(TypedDict, total=False):
    answer: str


async def main():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", VLLMEngine())  # the embedded tiny model; or VLLMEngine("path/or/name")
    research = arbiter.app("research")
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=32)
    async with arbiter:
        # --8<-- [start:stream]
        planner = research.agent("planner")
        with fa.acting_as(planner):  # outside a graph, the agent bound in context calls
            chunks = [chunk async for chunk in llm.astream("Plan the week.")]
        message = functools.reduce(operator.add, chunks)
        print(message.content, message.usage_metadata, message.response_metadata["unified_tokens"])
        # --8<-- [end:stream]

        # --8<-- [start:retry]
        async def careless(state):
            return {"answer": (await llm.ainvoke("hi", max_tokens=0)).content}  # bad input

        builder = StateGraph(State)
        builder.add_node("careless", careless, retry_policy=RetryPolicy(max_attempts=3))
        builder.add_edge(START, "careless")
        try:
            await fair_graph(builder.compile(), app=research).ainvoke({})
        except ValueError as err:  # InvalidParameterError: raised once, not retried, nothing charged
            print(type(err).__name__, err)
        # --8<-- [end:retry]
    agents = arbiter.stats().agents
    assert agents["research/planner"].done == 1 and agents["research/careless"].done == 0


if __name__ == "__main__":
    asyncio.run(main())
