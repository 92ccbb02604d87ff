"""Agents' weights and SLOs reach a fairagents server: a fair_graph node's weight, a drop-in client's agent.

Over a live server on a FakeEngine (a test double), with the integrations' own clients.
"""

import httpx
import openai
import pytest
from fairagents_langgraph import ChatFairAgents, fair_graph
from fairagents_openai import AsyncFairOpenAI
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

import fairagents as fa
from fairagents.testing import FakeEngine
from tests.server._support import MSG, live, make_config

KEY = "sk-research"
CONFIG = make_config(apps={"research": {"api_key": KEY}})


class State(TypedDict, total=False):
    text: str


def pool():
    arbiter = fa.Arbiter(in_flight=2, drain_timeout=1.0)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=2))
    return arbiter


async def test_a_nodes_weight_in_a_fair_graph_is_its_agents_weight_on_the_server():
    arbiter = pool()
    async with live(arbiter, CONFIG) as (url, _):
        llm = ChatFairAgents(base_url=f"{url}/v1", api_key=KEY, model="chat", max_tokens=2)

        async def call(state):
            return {"text": (await llm.ainvoke(MSG)).content}

        builder = StateGraph(State)
        builder.add_node("writer", call, metadata={"fairagents_weight": 2.0})
        builder.add_node("critic", call)
        builder.add_edge(START, "writer")
        builder.add_edge("writer", "critic")
        graph = fair_graph(builder.compile(), app="research")
        await graph.ainvoke({})
        await graph.ainvoke({})  # the node states its weight again: the same, so it is served
        async with httpx.AsyncClient(base_url=url) as http:
            agents = (await http.get("/v1/fairness")).json()["apps"]["research"]["agents"]
    assert (agents["writer"]["weight"], agents["critic"]["weight"]) == (2.0, 1.0)
    assert agents["writer"]["weight_share"] == 2 / 3
    assert arbiter.stats().agents["research/writer"].done == 2


async def test_the_drop_in_client_sends_its_agents_weight_and_slo():
    arbiter = pool()
    editor = fa.Agent("editor", fa.App("research"), weight=3.0, slo=fa.SLO(ttft=2.0, tpot=0.5))
    async with live(arbiter, CONFIG) as (url, gateway):
        async with AsyncFairOpenAI(base_url=f"{url}/v1", api_key=KEY, agent=editor) as client:
            await client.chat.completions.create(model="chat", messages=MSG, max_tokens=2)
        async with AsyncFairOpenAI(base_url=f"{url}/v1", api_key=KEY) as client:
            with fa.acting_as(fa.Agent("editor", fa.App("research"), weight=1.0)):  # not what it was declared with
                with pytest.raises(openai.BadRequestError) as refused:
                    await client.chat.completions.create(model="chat", messages=MSG, max_tokens=2)
    declared = gateway.identities._agents[("research", "editor")].identity
    assert (declared.weight, declared.slo) == (3.0, fa.SLO(ttft=2.0, tpot=0.5))
    assert refused.value.param == "X-Fairagents-Agent-Weight"
