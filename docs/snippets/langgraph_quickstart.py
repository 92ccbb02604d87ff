"""The LangGraph guide's quickstart, runnable end to end on the embedded tiny model."""

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


class State(TypedDict, total=False):
    question: str
    findings: Annotated[list[str], operator.add]
    answer: str


def build(llm):
    """A plain LangGraph graph: nothing in it knows about fairagents."""

    def fan_out(state):
        return [Send("searcher", {"question": state["question"], "angle": a}) for a in ("cost", "speed", "safety")]

    async def searcher(task):
        finding = await llm.ainvoke([HumanMessage(f"{task['question']} Consider {task['angle']}.")])
        return {"findings": [finding.content]}

    async def writer(state):
        answer = await llm.ainvoke([HumanMessage("Summarise: " + " ".join(state["findings"]))])
        return {"answer": answer.content}

    builder = StateGraph(State)
    builder.add_node("plan", lambda state: {})
    builder.add_node("searcher", searcher)
    builder.add_node("writer", writer, metadata={"fairagents_weight": 2.0})  # optional: a weight for this agent
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", fan_out, ["searcher"])
    builder.add_edge("searcher", "writer")
    builder.add_edge("writer", END)
    return builder.compile()


async def main():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", VLLMEngine())  # the embedded tiny model; or VLLMEngine("path/or/name")
    research = arbiter.app("research", weight=2.0)
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=32)
    graph = fair_graph(build(llm), app=research)  # every node's model calls are charged to the node
    async with arbiter:
        result = await graph.ainvoke({"question": "Should the city build a tram?"})
    print(result["answer"])

    # --8<-- [start:stats]
    for agent, s in arbiter.stats().agents.items():
        print(f"{agent:20} weight {s.weight:g}  calls {s.done}  unified tokens {s.service:.1f}")
    # research/plan        weight 1  calls 0  ...
    # research/searcher    weight 1  calls 3  ...   <- three parallel Send branches, one agent
    # research/writer      weight 2  calls 1  ...   <- the weight from its node's metadata
    # --8<-- [end:stats]
    agents = arbiter.stats().agents
    assert [agents[f"research/{n}"].done for n in ("plan", "searcher", "writer")] == [0, 3, 1]
    assert agents["research/writer"].weight == 2.0


if __name__ == "__main__":
    asyncio.run(main())
