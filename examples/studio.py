"""A content studio: writer, critic and illustrator agents in a LangGraph loop.

The writer drafts, the critic critiques, and the two go round until the draft has had
``ROUNDS`` critiques; then the illustrator prepares the picture. The graph is plain
LangGraph: ``fair_graph`` makes each node an agent of the ``studio`` app, so every call
``ChatFairAgents`` makes inside a node is charged to that node. The writer's node
metadata gives it twice the critic's share.

Runs on the embedded tiny model (random weights: the text is gibberish, the serving real):

    python examples/studio.py
"""

from __future__ import annotations

import asyncio

from fairagents_langgraph import ChatFairAgents, fair_graph
from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine

APP = "studio"
ROUNDS = 2
BRIEF = "A short story about a lighthouse keeper who finds a message in a bottle."


class Story(TypedDict, total=False):
    brief: str
    draft: str
    critique: str
    rounds: int
    image_prompt: str


def build(llm: ChatFairAgents) -> StateGraph:
    """The studio's graph, as anyone would write it without fairagents."""

    async def writer(state: Story) -> Story:
        notes = f"\nThe critic said: {state['critique']}" if state.get("critique") else ""
        draft = await llm.ainvoke([SystemMessage("You are a novelist."), HumanMessage(state["brief"] + notes)])
        return {"draft": draft.content, "rounds": state.get("rounds", 0) + 1}

    async def critic(state: Story) -> Story:
        critique = await llm.ainvoke([HumanMessage(f"Critique this draft in one sentence:\n{state['draft']}")])
        return {"critique": critique.content}

    async def illustrator(state: Story) -> Story:
        # The illustrator is meant to paint with an image model; until fairagents serves
        # one, it writes the prompt the picture will be made from.
        prompt = await llm.ainvoke([HumanMessage(f"Write an image prompt for the cover of:\n{state['draft']}")])
        return {"image_prompt": prompt.content}

    def after_critique(state: Story) -> str:
        return "writer" if state["rounds"] < ROUNDS else "illustrator"

    builder = StateGraph(Story)
    builder.add_node("writer", writer, metadata={"fairagents_weight": 2.0})
    builder.add_node("critic", critic)
    builder.add_node("illustrator", illustrator)
    builder.add_edge(START, "writer")
    builder.add_edge("writer", "critic")
    builder.add_conditional_edges("critic", after_critique, ["writer", "illustrator"])
    builder.add_edge("illustrator", END)
    return builder


async def create(arbiter: fa.Arbiter) -> Story:
    """Run the studio on ``arbiter`` (a started arbiter with a model ``"chat"``); the finished story."""
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=32)
    graph = fair_graph(build(llm).compile(), app=arbiter.app(APP))
    return await graph.ainvoke({"brief": BRIEF})


async def main(arbiter: fa.Arbiter | None = None) -> Story:
    if arbiter is None:  # run alone: the embedded tiny model on an in-process vLLM engine
        arbiter = fa.Arbiter()
        arbiter.add_model("chat", VLLMEngine())
        async with arbiter:
            return await main(arbiter)
    story = await create(arbiter)
    print(f"draft after {story['rounds']} rounds: {story['draft']!r}\ncover prompt: {story['image_prompt']!r}")
    return story


if __name__ == "__main__":
    asyncio.run(main())
