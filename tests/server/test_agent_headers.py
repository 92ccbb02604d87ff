"""An agent's weight and SLO, stated in request headers: declared on first use, inside the calling app only.

Over a live server on FakeEngines (a test double), with raw HTTP.
"""

import asyncio

import httpx
import pytest

import fairagents as fa
from fairagents.constants import HEADER_AGENT, HEADER_AGENT_SLO, HEADER_AGENT_WEIGHT, HEADER_APP
from fairagents.labels import OTHER
from fairagents.policies import VTC
from fairagents.testing import FakeEngine

from ._support import KEYS, MSG, live, make_config, wait_until

BODY = {"model": "chat", "messages": MSG, "max_tokens": 2}


def fake(policy="hmfs", **arbiter_kw):
    arbiter = fa.Arbiter(policy=policy, in_flight=4, drain_timeout=1.0, **arbiter_kw)
    engine = FakeEngine(tokens_per_reply=2)
    arbiter.add_model("chat", engine)
    return arbiter, engine


def headers(agent, app="driving", **stated):
    """The headers of a request by ``agent`` of ``app`` (its key), stating ``weight=`` and ``slo=`` as text."""
    names = {"weight": HEADER_AGENT_WEIGHT, "slo": HEADER_AGENT_SLO}
    return {"Authorization": f"Bearer {KEYS[app]}", HEADER_AGENT: agent, **{names[k]: v for k, v in stated.items()}}


def error(response):
    body = response.json()["error"]
    return response.status_code, body["code"], body["param"]


async def test_a_new_agent_is_declared_with_the_weight_and_slo_its_first_request_states():
    arbiter, _ = fake()
    async with live(arbiter, make_config()) as (url, gateway), httpx.AsyncClient(base_url=url) as http:
        first = await http.post("/v1/chat/completions", json=BODY,
                                headers=headers("writer", weight="2", slo="ttft=0.5, e2e=4"))
        again = await http.post("/v1/chat/completions", json=BODY, headers=headers("writer", weight="2.0"))
        silent = await http.post("/v1/chat/completions", json=BODY, headers=headers("writer"))
        fairness = (await http.get("/v1/fairness")).json()
    assert [r.status_code for r in (first, again, silent)] == [200, 200, 200]
    writer = gateway.identities._agents[("driving", "writer")].identity
    assert (writer.weight, writer.slo) == (2.0, fa.SLO(ttft=0.5, e2e=4.0))
    assert fairness["apps"]["driving"]["agents"]["writer"]["weight"] == 2.0
    assert fairness["apps"]["driving"]["weight"] == 2.0  # the app's weight is the configuration's, as it was
    assert arbiter.stats().agents["driving/writer"].done == 3


async def test_a_request_cannot_change_an_agents_declared_settings():
    arbiter, engine = fake()
    async with live(arbiter, make_config()) as (url, gateway), httpx.AsyncClient(base_url=url) as http:
        await http.post("/v1/chat/completions", json=BODY, headers=headers("writer"))  # declared: weight 1, no SLO
        heavier = await http.post("/v1/chat/completions", json=BODY, headers=headers("writer", weight="2"))
        hurried = await http.post("/v1/chat/completions", json=BODY, headers=headers("writer", slo="ttft=1"))
        # planner is in the configuration, with weight 2: a request may state it, not change it
        same = await http.post("/v1/chat/completions", json=BODY, headers=headers("planner", weight="2"))
        lighter = await http.post("/v1/chat/completions", json=BODY, headers=headers("planner", weight="1"))
    assert error(heavier) == (400, "invalid_parameter", HEADER_AGENT_WEIGHT)
    assert "declared with weight=1.0" in heavier.json()["error"]["message"]
    assert error(hurried) == (400, "invalid_parameter", HEADER_AGENT_SLO)
    assert same.status_code == 200 and error(lighter) == (400, "invalid_parameter", HEADER_AGENT_WEIGHT)
    assert gateway.identities._agents[("driving", "writer")].identity.weight == 1.0
    assert gateway.identities._agents[("driving", "planner")].identity.weight == 2.0
    assert len(engine.started_order) == 2


@pytest.mark.parametrize(("stated", "param"), [
    ({"weight": "0"}, HEADER_AGENT_WEIGHT),
    ({"weight": "-1"}, HEADER_AGENT_WEIGHT),
    ({"weight": "two"}, HEADER_AGENT_WEIGHT),
    ({"weight": "nan"}, HEADER_AGENT_WEIGHT),
    ({"weight": "inf"}, HEADER_AGENT_WEIGHT),
    ({"weight": "1e999"}, HEADER_AGENT_WEIGHT),
    ({"slo": "ttft=0"}, HEADER_AGENT_SLO),
    ({"slo": "ttft=1, ttft=2"}, HEADER_AGENT_SLO),
    ({"slo": "latency=1"}, HEADER_AGENT_SLO),
    ({"slo": "ttft"}, HEADER_AGENT_SLO),
    ({"weight": "2", "slo": "e2e=-3"}, HEADER_AGENT_SLO),
])
async def test_a_bad_weight_or_slo_is_a_400_naming_its_header_and_declares_nothing(stated, param):
    arbiter, engine = fake()
    async with live(arbiter, make_config()) as (url, gateway), httpx.AsyncClient(base_url=url) as http:
        response = await http.post("/v1/chat/completions", json=BODY, headers=headers("writer", **stated))
    assert error(response) == (400, "invalid_parameter", param)
    assert ("driving", "writer") not in gateway.identities._agents and engine.started_order == []


async def test_with_keys_off_an_app_names_itself_and_its_agents_settings():
    arbiter, _ = fake()
    config = fa.server.Config.model_validate({"server": {"auth": False}})
    async with live(arbiter, config) as (url, _), httpx.AsyncClient(base_url=url) as http:
        ok = await http.post("/v1/chat/completions", json=BODY,
                             headers={HEADER_APP: "research", HEADER_AGENT: "writer", HEADER_AGENT_WEIGHT: "3"})
        fairness = (await http.get("/v1/fairness")).json()
    assert ok.status_code == 200
    assert fairness["apps"]["research"]["agents"]["writer"]["weight"] == 3.0


async def test_the_overflow_label_is_no_agents_or_apps_name():
    """``_other`` counts the agents (and apps) past the label caps in /metrics: a request cannot take the name."""
    arbiter, engine = fake()
    async with live(arbiter, make_config()) as (url, gateway), httpx.AsyncClient(base_url=url) as http:
        refused = await http.post("/v1/chat/completions", json=BODY, headers=headers(OTHER))
    assert error(refused) == (400, "invalid_parameter", HEADER_AGENT)
    assert "'_other' is reserved" in refused.json()["error"]["message"]
    assert ("driving", OTHER) not in gateway.identities._agents and engine.started_order == []

    arbiter, engine = fake()
    config = fa.server.Config.model_validate({"server": {"auth": False}})
    async with live(arbiter, config) as (url, _), httpx.AsyncClient(base_url=url) as http:
        agent = await http.post("/v1/chat/completions", json=BODY,
                                headers={HEADER_APP: "research", HEADER_AGENT: OTHER})
        app = await http.post("/v1/chat/completions", json=BODY, headers={HEADER_APP: OTHER})
        named = await http.post("/v1/chat/completions", json=BODY,
                                headers={HEADER_APP: "research", HEADER_AGENT: "_others"})
    assert error(agent) == (400, "invalid_parameter", HEADER_AGENT)
    assert error(app) == (400, "invalid_parameter", HEADER_APP) and OTHER not in arbiter.tenants.apps
    assert named.status_code == 200 and engine.started_order  # only the name itself is reserved


async def test_an_agents_weight_is_a_share_of_its_app_not_of_the_pool():
    arbiter = fa.Arbiter(policy="hmfs", in_flight=1, drain_timeout=1.0)
    engine = FakeEngine(tokens_per_reply=200, token_time=0.005)
    arbiter.add_model("chat", engine)
    # Equal weights; a third app holds the engine while the two queue, so both are backlogged from the start.
    apps = {name: {"api_key": key} for name, key in KEYS.items()} | {"blocker": {"api_key": "sk-test-blocker"}}
    async with live(arbiter, make_config(apps=apps)) as (url, _), httpx.AsyncClient(base_url=url) as http:
        blocking = {"Authorization": "Bearer sk-test-blocker"}
        first = asyncio.create_task(
            http.post("/v1/chat/completions", json={**BODY, "max_tokens": 200}, headers=blocking))
        await wait_until(lambda: engine.running)  # the rest queue behind it, all backlogged at once
        calls = [http.post("/v1/chat/completions", json=BODY, headers=headers("greedy", weight="100"))
                 for _ in range(6)]
        calls += [http.post("/v1/chat/completions", json=BODY, headers=headers("steady", app="studio"))
                  for _ in range(6)]
        calls = [asyncio.ensure_future(call) for call in calls]
        await wait_until(lambda: arbiter.policy.queued() == 12)
        assert engine.running  # still the blocker's: nothing of the two apps ran before all twelve were queued
        responses = await asyncio.gather(first, *calls)
    assert {r.status_code for r in responses} == {200}
    order = [r.app for r in sorted(arbiter.ledger.records, key=lambda r: r.dispatched) if r.app != "blocker"]
    assert sorted(order[:6]) == ["driving"] * 3 + ["studio"] * 3  # the greedy agent took its app's turns only


async def test_settings_that_would_weigh_against_other_apps_are_the_configurations_to_give():
    edf, _ = fake(policy="edf")
    async with live(edf, make_config(policy="edf")) as (url, _), httpx.AsyncClient(base_url=url) as http:
        slo = await http.post("/v1/chat/completions", json=BODY, headers=headers("writer", slo="ttft=0.01"))
        weight = await http.post("/v1/chat/completions", json=BODY, headers=headers("writer", weight="2"))
    assert error(slo) == (400, "invalid_parameter", HEADER_AGENT_SLO)
    assert "policy 'edf'" in slo.json()["error"]["message"]
    assert weight.status_code == 200  # EDF reads no weights: a weight stays a share of the app

    flat, _ = fake(policy=VTC(client="agent"))
    async with live(flat, make_config(policy="vtc")) as (url, _), httpx.AsyncClient(base_url=url) as http:
        weight = await http.post("/v1/chat/completions", json=BODY, headers=headers("writer", weight="2"))
        slo = await http.post("/v1/chat/completions", json=BODY, headers=headers("critic", slo="ttft=1"))
    assert error(weight) == (400, "invalid_parameter", HEADER_AGENT_WEIGHT)
    assert slo.status_code == 200  # VTC reads no SLOs

    statera, _ = fake(admission="statera")
    async with live(statera, make_config()) as (url, _), httpx.AsyncClient(base_url=url) as http:
        slo = await http.post("/v1/chat/completions", json=BODY, headers=headers("writer", slo="tpot=0.001"))
    assert error(slo) == (400, "invalid_parameter", HEADER_AGENT_SLO) and "Statera" in slo.json()["error"]["message"]
