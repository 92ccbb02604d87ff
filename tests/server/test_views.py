"""Who sees /metrics, /v1/fairness and /dashboard, and what names requests bring can cost them."""

import asyncio
import base64
import contextlib
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import fairagents as fa
from fairagents.constants import HEADER_AGENT
from fairagents.server import Config, create_app
from fairagents.server import fairness as fairness_module
from fairagents.server import metrics as metrics_module
from fairagents.testing import FakeEngine

from ._support import KEYS, MSG, live, make_config, wait_until

VIEWS = ("/metrics", "/v1/fairness", "/dashboard")
OBSERVER = {"Authorization": "Bearer sk-observer"}


def bearer(app):
    return {"Authorization": f"Bearer {KEYS[app]}"}


def fake(**engine):
    arbiter = fa.Arbiter(in_flight=4)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=2, **engine))
    return arbiter


async def call(http, headers, agent="default"):
    response = await http.post("/v1/chat/completions", json={"model": "chat", "messages": MSG, "max_tokens": 2},
                               headers={**headers, HEADER_AGENT: agent})
    assert response.status_code == 200, response.text
    return response


async def test_with_keys_on_the_views_need_the_observer_key_and_an_app_sees_only_itself():
    async with live(fake(), make_config(observer_key="sk-observer", public_views=False)) as (url, gateway):
        async with httpx.AsyncClient(base_url=url) as http:
            await call(http, bearer("driving"), "planner")
            await call(http, bearer("studio"), "writer")
            gateway.view.sample()
            for path in VIEWS:
                assert (await http.get(path)).status_code == 401
                assert (await http.get(path, headers=OBSERVER)).status_code == 200
            assert (await http.get("/metrics", headers=bearer("driving"))).status_code == 401
            assert (await http.get("/dashboard")).headers["www-authenticate"].startswith("Basic")  # the browser asks
            basic = base64.b64encode(b"anyone:sk-observer").decode()
            assert (await http.get("/dashboard", headers={"Authorization": f"Basic {basic}"})).status_code == 200

            everything = (await http.get("/v1/fairness", headers=OBSERVER)).json()
            own = await http.get("/v1/fairness", headers=bearer("driving"))
    assert set(everything["apps"]) == {"driving", "studio"}
    assert own.status_code == 200 and set(own.json()["apps"]) == {"driving", "_other"}
    assert "studio" not in own.text and "writer" not in own.text  # no other app's name, nor its agents'
    assert own.json()["apps"]["_other"]["agents"] == {} and set(own.json()["history"]["apps"]) == {"driving", "_other"}
    assert own.json()["apps"]["_other"]["service"] == everything["apps"]["studio"]["service"]


async def test_without_an_observer_key_only_an_app_s_own_view_is_open():
    async with live(fake(), make_config(public_views=False)) as (url, _):
        async with httpx.AsyncClient(base_url=url) as http:
            for path in VIEWS:
                assert (await http.get(path)).status_code == 401
            assert (await http.get("/metrics", headers=bearer("driving"))).status_code == 401
            assert (await http.get("/v1/fairness", headers=bearer("studio"))).status_code == 200
            assert (await http.get("/health")).status_code == 200


@pytest.mark.parametrize("config", [make_config(public_views=True), Config.model_validate({"server": {"auth": False}})],
                         ids=["public_views", "keys off"])
async def test_public_views_or_keys_off_open_the_views(config):
    async with live(fake(), config) as (url, _):
        async with httpx.AsyncClient(base_url=url) as http:
            for path in VIEWS:
                assert (await http.get(path)).status_code == 200


async def test_an_error_a_client_sees_names_no_replica_address():
    arbiter = fake()
    async with live(arbiter, make_config()) as (url, _):
        arbiter.engine("chat").fail("replica http://10.1.2.3:8000/v1 of 'chat' did not answer")
        async with httpx.AsyncClient(base_url=url) as http:
            response = await http.post("/v1/chat/completions", json={"model": "chat", "messages": MSG},
                                       headers=bearer("driving"))
    assert response.status_code >= 500 and "10.1.2.3" not in response.text


def _lines(text):
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@contextlib.asynccontextmanager
async def asgi(arbiter, config):
    """The app called in this loop without a socket (floods of thousands of requests); yields (client, gateway)."""
    await arbiter.start()
    app = create_app(arbiter, config)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://server", timeout=60) as http:
            yield http, app.state.gateway
    finally:
        await arbiter.close(timeout=5, stop_engines=False)


async def _flood(http, app, names):
    """One request per agent name, 64 at a time; returns the status codes."""
    limits = asyncio.Semaphore(64)

    async def one(name):
        async with limits:
            r = await http.post("/v1/chat/completions", headers={**bearer(app), HEADER_AGENT: name},
                                json={"model": "chat", "messages": MSG, "max_tokens": 1})
            return r.status_code

    return await asyncio.gather(*(one(name) for name in names))


async def test_refused_names_leave_no_state_and_are_counted_without_their_name():
    apps = {"driving": {"api_key": KEYS["driving"], "max_agents": 4}, "studio": {"api_key": KEYS["studio"]}}
    arbiter = fake()
    async with asgi(arbiter, make_config(apps)) as (http, gateway):
        codes = await _flood(http, "driving", [f"name-{i}" for i in range(200)])
        metrics = (await http.get("/metrics")).text
        fairness = (await http.get("/v1/fairness")).text
    assert codes.count(200) == 4 and len(codes) == 200
    refused = {s.labels["reason"]: s.value for f in text_string_to_metric_families(metrics) for s in f.samples
               if s.name == "fairagents_identities_refused_total"}
    assert refused == {"max_agents": 196}
    declared = {name for app, name in arbiter.tenants.agents if app == "driving"}
    assert len(declared) == 4 and len(gateway.rejected) == 0
    for name in {f"name-{i}" for i in range(200)} - declared:
        assert f'"{name}"' not in metrics and f'"{name}"' not in fairness


async def test_ten_thousand_agent_names_leave_the_views_bounded():
    """One key brings 10,000 agent names its app allows: /metrics and /v1/fairness stay the size of a few agents."""
    apps = {"driving": {"api_key": KEYS["driving"], "max_agents": 10_000}, "studio": {"api_key": KEYS["studio"]}}
    async with asgi(fake(), make_config(apps, views_cache_seconds=0)) as (http, gateway):
        await call(http, bearer("studio"), "writer")
        await call(http, bearer("driving"), "agent-0")
        gateway.view.sample()
        before = ((await http.get("/metrics")).text, (await http.get("/v1/fairness")).content)
        codes = await _flood(http, "driving", [f"agent-{i}" for i in range(10_000)])
        gateway.view.sample()
        after = ((await http.get("/metrics")).text, (await http.get("/v1/fairness")).content)
    assert codes.count(200) == 10_000
    lines_before, lines_after = len(_lines(before[0])), len(_lines(after[0]))
    print(f"/metrics lines {lines_before} -> {lines_after}, bytes {len(before[0])} -> {len(after[0])}; "
          f"/v1/fairness bytes {len(before[1])} -> {len(after[1])}")
    # 16 agents named (and _other) of ~14 lines each, whatever the number of names
    assert lines_after <= lines_before + 17 * 14
    assert len(after[1]) <= 64 * 1024  # 64 agents listed per app, the rest as one
    assert sum(1 for s in _lines(after[0]) if 'agent="_other"' in s) > 0


async def test_idle_identities_declared_by_requests_are_forgotten():
    apps = {"driving": {"api_key": KEYS["driving"], "agents": {"planner": {}}}, "studio": {"api_key": KEYS["studio"]}}
    now = [0.0]
    async with live(fake(), make_config(apps, identity_idle_seconds=60, views_cache_seconds=0)) as (url, gateway):
        gateway.clock = lambda: now[0]
        async with httpx.AsyncClient(base_url=url) as http:
            await call(http, bearer("driving"), "planner")
            await call(http, bearer("driving"), "passing")
            now[0] = 61
            assert gateway.forget_idle() == [("driving", "passing")]  # the configured planner stays
            gateway.view.sample()
            metrics = (await http.get("/metrics")).text
            fairness = (await http.get("/v1/fairness")).json()
            assert 'agent="passing"' not in metrics and 'agent="planner"' in metrics
            assert set(fairness["apps"]["driving"]["agents"]) == {"planner"}
            await call(http, bearer("driving"), "passing")  # it comes back: shown again, its service kept
            fairness = (await http.get("/v1/fairness")).json()
    assert set(fairness["apps"]["driving"]["agents"]) == {"planner", "passing"}
    assert fairness["apps"]["driving"]["agents"]["passing"]["done"] == 2


async def test_health_answers_while_the_views_of_thousands_of_identities_are_built(monkeypatch):
    """The views are formatted in a thread: /health, asked while they are being built, answers before either ends.

    Each build is made to take a second more than it does, standing in for a server whose
    views are large; on the event loop it would hold /health back until it ended.
    """
    ended = []

    def slowly(build):
        def slow(*args):
            time.sleep(1.0)
            ended.append(build.__name__)
            return build(*args)
        return slow

    monkeypatch.setattr(fairness_module, "_dumps", slowly(fairness_module._dumps))
    monkeypatch.setattr(metrics_module, "_format", slowly(metrics_module._format))
    apps = {"driving": {"api_key": KEYS["driving"], "max_agents": 3_000}, "studio": {"api_key": KEYS["studio"]}}
    async with asgi(fake(), make_config(apps, views_cache_seconds=0)) as (http, gateway):
        await _flood(http, "driving", [f"agent-{i}" for i in range(3_000)])
        for _ in range(600):
            gateway.view.sample()
        views = [asyncio.create_task(http.get("/v1/fairness", params={"history": 600})),
                 asyncio.create_task(http.get("/metrics"))]
        await wait_until(lambda: gateway.view._bodies and gateway.metrics._built is not None)  # both builds started
        health = await http.get("/health")
        ended_before_health = list(ended)
        answers = await asyncio.gather(*views)
    assert health.status_code == 200 and ended_before_health == []
    assert [r.status_code for r in answers] == [200, 200] and sorted(ended) == ["_dumps", "_format"]


def test_the_samples_past_the_window_keep_each_agent_s_service_only_now_and_then():
    arbiter = fa.Arbiter()
    arbiter.app("driving").agent("planner")
    now = [0.0]
    view = fairness_module.FairnessView(arbiter, keep=600, window=30, clock=lambda: now[0])
    for second in range(600):
        now[0] = float(second)
        view.sample()
    with_agents = [s for s in view.samples if s[1] is not None]
    assert len(with_agents) == 31 + (600 - 31) // fairness_module.KEEP_AGENTS_EVERY + 1
    assert all(s[3] == {"driving": 0.0} for s in view.samples)  # every sample keeps each app's total
    body = view.snapshot(app="driving")
    assert len(body["history"]["time"]) <= fairness_module.HISTORY_POINTS
    assert len(body["history"]["agents"]["driving/planner"]) == len(body["history"]["time"])
