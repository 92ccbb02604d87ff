"""Who sees /metrics, /v1/fairness and /dashboard, and what names requests bring can cost them."""

import asyncio
import base64
import contextlib
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request

import fairagents as fa
from fairagents.constants import HEADER_AGENT, HEADER_AGENT_WEIGHT, HEADER_APP
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
    assert len(declared) == 4 and len(gateway.identities.rejected) == 0
    for name in {f"name-{i}" for i in range(200)} - declared:
        assert f'"{name}"' not in metrics and f'"{name}"' not in fairness


async def test_two_thousand_agent_names_leave_the_views_bounded():
    """One key brings 2,000 agent names its app allows: /metrics and /v1/fairness stay the size of a few agents.

    Unbounded, they would be ~28,000 lines and ~500 KB: far past both bounds."""
    apps = {"driving": {"api_key": KEYS["driving"], "max_agents": 2_000}, "studio": {"api_key": KEYS["studio"]}}
    async with asgi(fake(), make_config(apps, views_cache_seconds=0)) as (http, gateway):
        await call(http, bearer("studio"), "writer")
        await call(http, bearer("driving"), "agent-0")
        gateway.view.sample()
        before = ((await http.get("/metrics")).text, (await http.get("/v1/fairness")).content)
        codes = await _flood(http, "driving", [f"agent-{i}" for i in range(2_000)])
        gateway.view.sample()
        after = ((await http.get("/metrics")).text, (await http.get("/v1/fairness")).content)
    assert codes.count(200) == 2_000
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
        gateway.identities.clock = lambda: now[0]
        async with httpx.AsyncClient(base_url=url) as http:
            await call(http, bearer("driving"), "planner")
            await call(http, bearer("driving"), "passing")
            now[0] = 61
            assert gateway.identities.forget_idle() == [("driving", "passing")]  # the configured planner stays
            gateway.view.sample()
            metrics = (await http.get("/metrics")).text
            fairness = (await http.get("/v1/fairness")).json()
            assert 'agent="passing"' not in metrics and 'agent="planner"' in metrics
            assert set(fairness["apps"]["driving"]["agents"]) == {"planner"}
            await call(http, bearer("driving"), "passing")  # it comes back: shown again, its service kept
            fairness = (await http.get("/v1/fairness")).json()
    assert set(fairness["apps"]["driving"]["agents"]) == {"planner", "passing"}
    assert fairness["apps"]["driving"]["agents"]["passing"]["done"] == 2


async def test_an_app_whose_agents_are_all_forgotten_stays_in_the_views():
    """Only agents are forgotten: a configured app left with none shown keeps its place, its service and its share."""
    now = [0.0]
    config = make_config(observer_key="sk-observer", public_views=False, identity_idle_seconds=60,
                         views_cache_seconds=0)
    async with live(fake(), config) as (url, gateway):
        gateway.identities.clock = lambda: now[0]
        async with httpx.AsyncClient(base_url=url) as http:
            await call(http, bearer("driving"), "planner")
            await call(http, bearer("studio"), "writer")
            gateway.view.sample()
            before = (await http.get("/v1/fairness", headers=OBSERVER)).json()["apps"]["studio"]
            now[0] = 61
            assert gateway.identities.forget_idle() == [("studio", "writer")]  # driving's planner is configured
            gateway.view.sample()
            everything = (await http.get("/v1/fairness", headers=OBSERVER)).json()
            own = (await http.get("/v1/fairness", headers=bearer("studio"))).json()
            metrics = (await http.get("/metrics", headers=OBSERVER)).text
    studio = everything["apps"]["studio"]
    assert set(everything["apps"]) == {"driving", "studio"}
    assert studio["agents"] == {} and studio["service"] == before["service"] > 0 and studio["done"] == 1
    assert everything["history"]["apps"]["studio"][-1] == before["service"]  # its total does not drop
    assert set(own["apps"]) == {"studio", "_other"} and own["apps"]["studio"]["service"] == before["service"]
    shares = {s.labels["app"]: s.value for f in text_string_to_metric_families(metrics)
              if f.name == "fairagents_app_service_share_ratio" for s in f.samples}
    assert set(shares) == {"driving", "studio"} and shares["studio"] > 0
    device = {s.labels["app"]: s.value for f in text_string_to_metric_families(metrics)
              if f.name == "fairagents_device_service_share_ratio" for s in f.samples if s.labels["device"] == "local"}
    assert "studio" in device and sum(device.values()) == pytest.approx(1.0)
    assert 'agent="writer"' not in metrics


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


def _scope_request(headers):
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": raw,
                    "query_string": b""})


async def test_refused_requests_of_new_agents_declare_nothing_and_count_toward_no_limit():
    apps = {"driving": {"api_key": KEYS["driving"], "max_agents": 2}, "studio": {"api_key": KEYS["studio"]}}
    config = make_config(apps, observer_key="sk-observer", public_views=False, views_cache_seconds=0)
    arbiter = fake()
    stops = [f"s{i}" for i in range(50)]
    refused = {
        "bad-json": ("/v1/chat/completions", b"{not json"),
        "no-model": ("/v1/chat/completions", {"model": "gpt-9", "messages": MSG}),
        "many-stops": ("/v1/chat/completions", {"model": "chat", "messages": MSG, "stop": stops}),
        "no-tokens": ("/v1/completions", {"model": "chat", "prompt": "hi", "max_tokens": 0}),
        "no-image-model": ("/v1/images/generations", {"prompt": "a red car", "model": "sdxl"}),
    }
    async with asgi(arbiter, config) as (http, gateway):
        for name, (path, body) in refused.items():
            headers = {**bearer("driving"), HEADER_AGENT: name}
            sent = ({"content": body, "headers": {**headers, "Content-Type": "application/json"}}
                    if isinstance(body, bytes) else {"json": body, "headers": headers})
            response = await http.post(path, **sent)
            assert 400 <= response.status_code < 500, (name, response.text)
        gateway.view.sample()
        fairness = (await http.get("/v1/fairness", headers=OBSERVER)).text
        metrics = (await http.get("/metrics", headers=OBSERVER)).text
        for name in refused:
            assert (("driving", name) not in arbiter.tenants.agents and ("driving", name) not in gateway.identities._agents
                    and f'"{name}"' not in fairness and f'"{name}"' not in metrics)
        assert gateway.identities._agent_count["driving"] == 0 and not gateway.identities._holds and not gateway.identities._fresh
        await call(http, bearer("driving"), "first")  # max_agents is 2: the refused names took none of it
        await call(http, bearer("driving"), "second")
        third = await http.post("/v1/chat/completions", json={"model": "chat", "messages": MSG},
                                headers={**bearer("driving"), HEADER_AGENT: "third"})
        assert third.status_code == 400 and third.json()["error"]["code"] == "unknown_agent"
    assert {name for app, name in arbiter.tenants.agents if app == "driving"} == {"first", "second"}


async def test_with_keys_off_a_refused_request_of_a_new_app_declares_no_app():
    arbiter = fake()
    async with asgi(arbiter, Config.model_validate({"server": {"auth": False, "max_apps": 1}})) as (http, gateway):
        response = await http.post("/v1/chat/completions", content=b"{not json",
                                   headers={HEADER_APP: "ghost", "Content-Type": "application/json"})
        assert response.status_code == 400
        assert "ghost" not in arbiter.tenants.apps and "ghost" not in gateway.identities._apps and not gateway.identities._fresh_apps
        await call(http, {HEADER_APP: "real"})  # max_apps is 1: the refused app took none of it
    assert set(arbiter.tenants.apps) == {"real"} and set(arbiter.tenants.agents) == {("real", "default")}


async def test_a_new_agent_another_request_holds_is_undeclared_only_when_the_last_one_ends():
    arbiter = fake()
    async with asgi(arbiter, make_config()) as (_, gateway):
        first, second = (_scope_request({**bearer("driving"), HEADER_AGENT: "twin"}) for _ in range(2))
        assert await gateway.identities.identify(first) is not None and await gateway.identities.identify(second) is not None
        gateway.view.sample()  # taken while they are handled
        gateway.identities.release(first)  # the other request still holds it: it may yet queue
        assert ("driving", "twin") in arbiter.tenants.agents
        gateway.identities.release(second)
        assert ("driving", "twin") not in arbiter.tenants.agents and ("driving", "twin") not in gateway.identities._agents
        assert all(("driving", "twin") not in (served or {}) for _, served, _, _ in gateway.view.samples)
        again = _scope_request({**bearer("driving"), HEADER_AGENT: "kept"})
        who = await gateway.identities.identify(again)
        await arbiter.chat("chat", MSG, agent=who, max_tokens=2)  # it queued a request: it stays
        gateway.identities.release(again)
        assert ("driving", "kept") in arbiter.tenants.agents and ("driving", "kept") in gateway.identities._agents


async def test_a_request_with_conflicting_settings_does_not_bring_a_forgotten_agent_back():
    now = [0.0]
    async with asgi(fake(), make_config(identity_idle_seconds=60, views_cache_seconds=0)) as (http, gateway):
        gateway.identities.clock = lambda: now[0]
        await call(http, bearer("studio"), "passing")
        now[0] = 61
        assert gateway.identities.forget_idle() == [("studio", "passing")]
        response = await http.post("/v1/chat/completions", json={"model": "chat", "messages": MSG},
                                   headers={**bearer("studio"), HEADER_AGENT: "passing", HEADER_AGENT_WEIGHT: "3"})
        assert response.status_code == 400
        assert ("studio", "passing") in gateway.view.hidden and ("studio", "passing") not in gateway.identities._seen
        assert not gateway.identities._holds
