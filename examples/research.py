"""A research assistant: a planner fans the question out to parallel searchers with ``Send``; a writer merges.

Each ``Send`` starts one more task of the ``searcher`` node, and all of them run at once.
Under ``fair_graph`` they are one agent, ``research/searcher``: four parallel branches get
that agent's share of the app, not four shares, so a wide fan-out does not crowd out
the planner and the writer.

Runs on the embedded tiny model (random weights: the text is gibberish, the serving real):

    python examples/research.py
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated

from fairagents_langgraph import ChatFairAgents, fair_graph
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from typing_extensions import TypedDict

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine

APP = "research"
QUESTION = "How does a city keep traffic moving during a flood?"
# A real model's plan would be parsed into angles; the tiny model's is gibberish, so they are fixed.
ANGLES = ["drainage", "detours", "public transport", "emergency services"]


class Research(TypedDict, total=False):
    question: str
    plan: str
    findings: Annotated[list[str], operator.add]
    answer: str


class Search(TypedDict):
    question: str
    angle: str


def build(llm: ChatFairAgents) -> StateGraph:
    """The assistant's graph, as anyone would write it without fairagents."""

    async def planner(state: Research) -> Research:
        plan = await llm.ainvoke([HumanMessage(f"Split this question into research angles: {state['question']}")])
        return {"plan": plan.content}

    def fan_out(state: Research) -> list[Send]:
        return [Send("searcher", {"question": state["question"], "angle": angle}) for angle in ANGLES]

    async def searcher(task: Search) -> Research:
        finding = await llm.ainvoke([HumanMessage(f"{task['question']}\nFind what is known about {task['angle']}.")])
        return {"findings": [f"{task['angle']}: {finding.content}"]}

    async def writer(state: Research) -> Research:
        notes = "\n".join(state["findings"])
        answer = await llm.ainvoke([HumanMessage(f"Answer '{state['question']}' from these notes:\n{notes}")])
        return {"answer": answer.content}

    builder = StateGraph(Research)
    builder.add_node("planner", planner)
    builder.add_node("searcher", searcher)
    builder.add_node("writer", writer)
    builder.add_edge(START, "planner")
    builder.add_conditional_edges("planner", fan_out, ["searcher"])
    builder.add_edge("searcher", "writer")
    builder.add_edge("writer", END)
    return builder


async def research(arbiter: fa.Arbiter) -> Research:
    """Run the assistant on ``arbiter`` (a started arbiter with a model ``"chat"``); the final state."""
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=24)
    graph = fair_graph(build(llm).compile(), app=arbiter.app(APP))
    return await graph.ainvoke({"question": QUESTION, "findings": []})


async def main(arbiter: fa.Arbiter | None = None) -> Research:
    if arbiter is None:  # run alone: the embedded tiny model on an in-process vLLM engine
        arbiter = fa.Arbiter()
        arbiter.add_model("chat", VLLMEngine())
        async with arbiter:
            return await main(arbiter)
    result = await research(arbiter)
    for finding in result["findings"]:
        print(f"- {finding!r}")
    print(f"answer: {result['answer']!r}")
    return result


if __name__ == "__main__":
    asyncio.run(main())
