"""fairagents_langgraph: each invocation of a fair graph is one run, across Send branches, subgraphs and threads.

The run of each request is read where the arbiter queues it (``arbiter.runner.submitted``); all on a FakeEngine.
"""

import asyncio
import operator
from typing import Annotated

import pytest
from fairagents_langgraph import ChatFairAgents, fair_graph
from fairagents_langgraph.graph import node_run
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from typing_extensions import TypedDict

import fairagents as fa
from fairagents.testing import FakeEngine

MSG = [HumanMessage("what next?")]


class State(TypedDict, total=False):
    topic: str
    notes: Annotated[list[str], operator.add]


def pool():
    arbiter = fa.Arbiter(in_flight=8)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=2, token_time=0.001))
    runs = []  # (agent name, run) of each request, as queued
    arbiter.runner.submitted.append(lambda request: runs.append((request.agent.name, request.run)))
    return arbiter, runs


def ends(arbiter):
    """The runs whose end the arbiter is told of, in order."""
    ended, end_run = [], arbiter.ledger.end_run
    arbiter.ledger.end_run = lambda run, now: (ended.append(run), end_run(run, now))[1]
    return ended


def fan_out_graph(arbiter, llm, *, sync=False):
    """plan -> 3 Send branches of searcher -> merge (invokes a subgraph from its body) -> team (a subgraph node)."""

    def inner(name):
        async def call(state):
            await llm.ainvoke(MSG)
            return {"notes": [name]}

        def call_sync(state):
            llm.invoke(MSG)
            return {"notes": [name]}

        builder = StateGraph(State)
        builder.add_node(name, call_sync if sync else call)
        builder.add_edge(START, name)
        return builder.compile()

    checker = inner("checker")

    async def searcher(state):
        await llm.ainvoke([HumanMessage(state["topic"])])
        await arbiter.chat("chat", [{"role": "user", "content": "raw"}], max_tokens=2)  # the arbiter itself
        return {"notes": [state["topic"]]}

    def searcher_sync(state):
        llm.invoke([HumanMessage(state["topic"])])
        return {"notes": [state["topic"]]}

    async def merge(state):
        await checker.ainvoke({"notes": []})
        return {}

    def merge_sync(state):
        checker.invoke({"notes": []})
        return {}

    builder = StateGraph(State)
    builder.add_node("plan", lambda state: {})
    builder.add_node("searcher", searcher_sync if sync else searcher)
    builder.add_node("merge", merge_sync if sync else merge)
    builder.add_node("team", inner("drafter"))
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", lambda s: [Send("searcher", {"topic": f"t{i}"}) for i in range(3)],
                                  ["searcher"])
    builder.add_edge("searcher", "merge")
    builder.add_edge("merge", "team")
    builder.add_edge("team", END)
    return fair_graph(builder.compile(), app=arbiter.app("research"))


def by_run(runs):
    out = {}
    for agent, run in runs:
        out.setdefault(run, []).append(agent)
    return {run: sorted(agents) for run, agents in out.items()}


async def test_each_ainvoke_is_one_run_across_send_branches_and_subgraphs():
    arbiter, runs = pool()
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=2)
    graph = fan_out_graph(arbiter, llm)
    ended = ends(arbiter)
    async with arbiter:
        await graph.ainvoke({"notes": []})
        await graph.ainvoke({"notes": []})
        await asyncio.gather(graph.ainvoke({"notes": []}), graph.ainvoke({"notes": []}))  # concurrent: apart too
    calls = ["merge/checker", *["searcher"] * 6, "team/drafter"]
    assert len(runs) == 4 * len(calls)
    grouped = by_run(runs)
    assert None not in grouped and len(grouped) == 4
    assert all(agents == calls for agents in grouped.values())
    assert sorted(ended) == sorted(grouped)  # each run ended once, with its invocation
    assert fa.current_run() is None  # nothing leaked into the caller


def test_sync_invoke_is_one_run_across_worker_threads():
    arbiter, runs = pool()
    portal = fa.Portal(arbiter)
    llm = ChatFairAgents(portal=portal, model="chat", max_tokens=2)
    graph = fan_out_graph(arbiter, llm, sync=True)
    ended = ends(arbiter)
    try:
        graph.invoke({"notes": []})
        graph.invoke({"notes": []})
        chunks = list(graph.stream({"notes": []}))
    finally:
        portal.close()
    assert chunks
    grouped = by_run(runs)
    assert None not in grouped and len(grouped) == 3
    assert all(agents == ["merge/checker", "searcher", "searcher", "searcher", "team/drafter"]
               for agents in grouped.values())
    assert sorted(ended) == sorted(grouped)  # on the arbiter's loop, from the caller's thread


async def test_astream_is_one_run_and_the_binding_stays_inside_the_graph():
    arbiter, runs = pool()
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=2)
    graph = fan_out_graph(arbiter, llm)
    seen = []
    async with arbiter:
        async for _ in graph.astream({"notes": []}):
            seen.append(fa.current_run())  # the reader is not in the run
    assert seen and set(seen) == {None}
    assert len(by_run(runs)) == 1 and None not in by_run(runs)


async def test_an_invocation_inside_a_bound_run_joins_it():
    arbiter, runs = pool()
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=2)
    graph = fan_out_graph(arbiter, llm)
    outer = fair_graph(_single("outer", lambda: graph.ainvoke({"notes": []})), app=arbiter.app("research"))
    builder = StateGraph(State)
    builder.add_node("inner", graph)  # a fair graph as another's subgraph node: in its run
    builder.add_edge(START, "inner")
    host = fair_graph(builder.compile(), app=arbiter.app("research"))
    ended = ends(arbiter)
    async with arbiter:
        with arbiter.run("digest-7"):
            await graph.ainvoke({"notes": []})
        await outer.ainvoke({"notes": []})  # a fair graph invoked from another's node: one run
        await graph.ainvoke({"notes": []}, config={"metadata": {"fairagents_run": "named-1"}})
        await host.ainvoke({"notes": []})
    grouped = by_run(runs)
    assert len(set(grouped) - {"digest-7", "named-1"}) == 2 and len(grouped) == 4
    assert [len(agents) for agents in grouped.values()] == [8] * 4
    assert grouped["digest-7"] == grouped["named-1"]
    assert sorted(ended) == sorted(grouped)  # the outer scope's end, not the joined invocation's


async def test_a_model_call_in_a_node_sees_the_run_in_its_config():
    arbiter, _ = pool()
    seen = []

    def look(state):  # a sync node: run in a worker thread by invoke, and by ainvoke too
        seen.append((fa.current_run(), node_run()))
        return {}

    builder = StateGraph(State)
    builder.add_node("look", look)
    builder.add_edge(START, "look")
    graph = fair_graph(builder.compile(), app=arbiter.app("research"))
    await graph.ainvoke({"notes": []})
    graph.invoke({"notes": []})
    assert len(seen) == 2 and seen[0] != seen[1]
    assert all(bound == named and bound.startswith("run-") for bound, named in seen)


async def test_remote_calls_send_the_run_header(server):
    llm = ChatFairAgents(base_url="http://fair.test/v1", api_key="sk-studio", model="chat", max_tokens=5,
                         http_async_client=server.async_client(), http_client=server.sync_client())

    async def writer(state):
        await llm.ainvoke(MSG)
        [c async for c in llm.astream(MSG)]
        return {}

    def editor(state):
        llm.invoke(MSG)
        return {}

    builder = StateGraph(State)
    builder.add_node("writer", writer)
    builder.add_node("editor", editor)
    builder.add_edge(START, "writer")
    builder.add_edge("writer", "editor")
    graph = fair_graph(builder.compile(), app="studio")
    await graph.ainvoke({"notes": []})
    await graph.ainvoke({"notes": []})
    with fa.run_scope("ticket-9"):
        await graph.ainvoke({"notes": []})
    runs = [request.headers["x-fairagents-run"] for request, _ in server.requests]
    assert len(runs) == 9
    assert len(set(runs[:3])) == len(set(runs[3:6])) == 1 and runs[0] != runs[3]
    assert runs[6:] == ["ticket-9"] * 3


async def test_a_bad_run_named_in_the_config_is_refused():
    arbiter, _ = pool()
    graph = fair_graph(_single("look", lambda: None), app=arbiter.app("research"))
    with pytest.raises(fa.InvalidParameterError):
        await graph.ainvoke({"notes": []}, config={"metadata": {"fairagents_run": "two words"}})


def _single(name, body):
    """A graph of one async node that awaits ``body(state)`` (or ``body()``)."""

    async def node(state):
        result = body(state) if body.__code__.co_argcount else body()
        if asyncio.iscoroutine(result):
            await result
        return {}

    builder = StateGraph(State)
    builder.add_node(name, node)
    builder.add_edge(START, name)
    return builder.compile()
