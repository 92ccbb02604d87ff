"""The LangGraph guide's runs: each invocation of a fair graph is one run, whatever its branches."""

import asyncio
import operator
from typing import Annotated

from fairagents_langgraph import ChatFairAgents, fair_graph
from langchain_core.messages import HumanMessage
from langgraph.graph import START, StateGraph
from langgraph.types import Send
from typing_extensions import TypedDict

import fairagents as fa
from fairagents.testing import FakeEngine


class State(TypedDict, total=False):
    topic: str
    notes: Annotated[list[str], operator.add]


def build(llm):
    async def searcher(task):
        return {"notes": [(await llm.ainvoke([HumanMessage(task["topic"])])).content]}

    builder = StateGraph(State)
    builder.add_node("plan", lambda state: {})
    builder.add_node("searcher", searcher)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", lambda s: [Send("searcher", {"topic": f"{s['topic']} {i}"}) for i in range(3)],
                                  ["searcher"])
    return builder.compile()


async def main():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", FakeEngine())  # a test double; any engine does
    research = arbiter.app("research")
    runs = []
    arbiter.add_listener(lambda record: runs.append(record.run))  # each request's run, as it ends
    # --8<-- [start:runs]
    graph = fair_graph(build(ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=8)), app=research)
    async with arbiter:
        await graph.ainvoke({"topic": "roads"})  # one run: its three Send branches are in it
        await graph.ainvoke({"topic": "rivers"})  # another
        with arbiter.run("digest-7"):  # an invocation inside a bound run joins it
            await graph.ainvoke({"topic": "rails"})
        await graph.ainvoke({"topic": "ports"}, config={"metadata": {"fairagents_run": "ticket-9"}})  # named
    # --8<-- [end:runs]
    print(runs)  # ['run-…', 'run-…', 'run-…', 'run-…', 'run-…', 'run-…', 'digest-7', 'digest-7', 'digest-7', 'ticket-9', ...]
    assert len(set(runs[:3])) == len(set(runs[3:6])) == 1 and runs[0] != runs[3]
    assert runs[6:] == ["digest-7"] * 3 + ["ticket-9"] * 3


if __name__ == "__main__":
    asyncio.run(main())
