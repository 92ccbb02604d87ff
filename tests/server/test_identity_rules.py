"""Identity from the harness: ``[[server.identity]]`` rules read the agent and run from headers and body fields.

Over a live server on FakeEngines, with the headers and fields Claude Code, Codex CLI and
OpenCode send: sub-agents become agents of their app, sessions runs; explicit
``X-Fairagents-*`` headers win; bad values are 400s that declare nothing; a flood of
session ids cannot grow the views past the app's ``max_agents``.
"""

import httpx
import pytest
from pydantic import ValidationError

from fairagents.constants import HEADER_AGENT, HEADER_RUN
from fairagents.server import Config
from fairagents.server.identity_rules import IdentityRule, resolve
from fairagents.testing import FakeEngine

from ._support import KEYS, MSG, live, make_config
from .test_openai_surface import serve

CLAUDE_CODE = [{"from": "header:x-claude-code-session-id", "to": "run"},
               {"from": "header:x-claude-code-agent-id", "to": "agent", "value": "subagent"}]
USER_ID = [{"from": "body:metadata.user_id", "to": "run", "pattern": '"session_id":"([0-9a-f-]+)"'}]
AUTH = {"Authorization": f"Bearer {KEYS['driving']}"}
MESSAGES = {"model": "chat", "max_tokens": 2, "messages": MSG}


def rules(*specs):
    return [IdentityRule.model_validate(spec) for spec in specs]


def test_the_first_matching_rule_sets_its_target_and_a_pattern_picks_its_group():
    found = rules({"from": "header:x-agent", "to": "agent"}, {"from": "header:x-other", "to": "agent"},
                  {"from": "body:metadata.user_id", "to": "run", "pattern": "session_([a-z0-9]+)"})
    body = {"metadata": {"user_id": "user_1_session_abc9"}}
    assert resolve(found, {"x-other": "b", "x-agent": "a"}, body) == ("a", "abc9")
    assert resolve(found, {"x-other": "b"}, {"metadata": {"user_id": "no session here"}}) == ("b", None)
    assert resolve(found, {}, {"metadata": "not a mapping"}) == (None, None)


@pytest.mark.parametrize("spec", [
    {"from": "cookie:x", "to": "agent"}, {"from": "header:x", "to": "app"}, {"from": "header:has space", "to": "run"},
    {"from": "header:x", "to": "agent", "value": "a/b"}, {"from": "header:x", "to": "run", "value": "two words"},
    {"from": "header:x", "to": "run", "pattern": "("}, {"from": "header:x", "to": "run", "extra": 1},
])
def test_a_bad_rule_is_a_configuration_error(spec):
    with pytest.raises(ValidationError):
        Config.model_validate({"server": {"auth": False, "identity": [spec]}})


async def test_claude_code_sessions_are_runs_and_its_sub_agents_one_agent():
    arbiter = serve(FakeEngine(reply="hi"))
    async with live(arbiter, make_config(identity=CLAUDE_CODE)) as (url, _):
        async with httpx.AsyncClient(base_url=url, headers={"x-api-key": KEYS["driving"]}) as http:
            main = await http.post("/v1/messages", json=MESSAGES, headers={"X-Claude-Code-Session-Id": "s-1"})
            sub = await http.post("/v1/messages", json=MESSAGES, headers={"X-Claude-Code-Session-Id": "s-1",
                                                                          "x-claude-code-agent-id": "a7f3"})
            explicit = await http.post("/v1/messages", json=MESSAGES, headers={
                "x-claude-code-agent-id": "a7f3", HEADER_AGENT: "reviewer", HEADER_RUN: "mine"})
    assert main.status_code == sub.status_code == explicit.status_code == 200
    agents = arbiter.stats().agents
    assert agents["driving/default"].done == agents["driving/subagent"].done == agents["driving/reviewer"].done == 1
    runs = {r.agent: r.run for r in arbiter.ledger.records}
    assert runs == {"default": "s-1", "subagent": "s-1", "reviewer": "mine"}


async def test_a_body_rule_names_the_run_of_every_protocol():
    arbiter = serve(FakeEngine(reply="hi"))
    user_id = '{"device_id":"ab","account_uuid":"","session_id":"5f0c-77"}'
    config = make_config(identity=[*USER_ID, {"from": "body:user", "to": "agent"}])
    async with live(arbiter, config) as (url, _), httpx.AsyncClient(base_url=url, headers=AUTH) as http:
        assert (await http.post("/v1/messages", json={**MESSAGES, "metadata": {"user_id": user_id}})).status_code == 200
        chat = {"model": "chat", "messages": MSG, "max_tokens": 2, "user": "alice", "metadata": {"user_id": user_id}}
        assert (await http.post("/v1/chat/completions", json=chat)).status_code == 200
        assert (await http.post("/v1/responses", json={"model": "chat", "input": "hi", "user": "bob"})).status_code == 200
    runs = {r.agent: r.run for r in arbiter.ledger.records}
    assert runs["default"] == runs["alice"] == "5f0c-77" and set(runs) == {"default", "alice", "bob"}


async def test_a_bad_value_is_a_400_naming_the_rule_and_declares_nothing():
    arbiter = serve(FakeEngine(reply="hi"))
    async with live(arbiter, make_config(identity=[{"from": "body:user", "to": "agent"}])) as (url, _):
        async with httpx.AsyncClient(base_url=url, headers=AUTH) as http:
            response = await http.post("/v1/chat/completions", json={"model": "chat", "messages": MSG, "user": "a/b"})
    assert response.status_code == 400
    assert "body:user" in response.json()["error"]["message"] and response.json()["error"]["param"] == "body:user"
    assert ("driving", "a/b") not in arbiter.tenants.agents and not arbiter.ledger.records


async def test_session_ids_as_agents_stop_at_the_apps_max_agents():
    apps = {"driving": {"api_key": KEYS["driving"], "max_agents": 3}}
    arbiter = serve(FakeEngine(reply="hi"))
    config = make_config(apps=apps, identity=[{"from": "header:x-session-id", "to": "agent"}])
    async with live(arbiter, config) as (url, gateway), httpx.AsyncClient(base_url=url, headers=AUTH) as http:
        codes = [(await http.post("/v1/chat/completions", json={"model": "chat", "messages": MSG, "max_tokens": 2},
                                  headers={"x-session-id": f"ses_{i}"})).status_code for i in range(6)]
        clients = gateway.identities.clients()
    assert codes == [200, 200, 200, 400, 400, 400]
    assert sorted(agent for _, agent in clients) == ["ses_0", "ses_1", "ses_2"]
