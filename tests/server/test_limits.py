"""Requests past the shape limits get a 400 naming the limit and the field, at once and for free."""

import asyncio
import json
import time

import httpx
import pytest

from fairagents.server import Config, build_arbiter
from fairagents.testing import FakeEngine

from ._support import KEYS, live

pytestmark = pytest.mark.asyncio(loop_scope="session")


def config(**limits):
    apps = {"driving": {"api_key": KEYS["driving"]}, "studio": {"api_key": KEYS["studio"]}}
    return Config.model_validate({"apps": apps, "models": {"chat": {"in_flight": 4}}, "server": {"limits": limits}})


def chat(**extra):
    return {"model": "chat", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4, **extra}


def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


def string_with(**keywords):
    return {"type": "object", "properties": {"a": {"type": "string", **keywords}}, "required": ["a"]}


def tool(i, parameters=None):
    return {"type": "function", "function": {"name": f"t{i}", "parameters": parameters or {"type": "object"}}}


# name -> (body, the limit named, the field named)
OVERSIZED = {
    "a 100,000-value enum": (chat(response_format=schema_format(string_with(enum=[str(i) for i in range(100_000)]))),
                             "max_constraint_bytes", "response_format"),
    "a 5,000-value enum": (chat(response_format=schema_format(string_with(enum=[str(i) for i in range(5_000)]))),
                           "max_enum_values", "response_format"),
    "a 20,000-way alternation": (chat(response_format=schema_format(
        string_with(pattern="^(" + "|".join(f"w{i}" for i in range(20_000)) + ")$"))),
        "max_constraint_bytes", "response_format"),
    "a 300-way alternation": (chat(response_format=schema_format(
        string_with(pattern="^(" + "|".join(a + b for a in "abcdefghijklmnop" for b in "abcdefghijklmnopq") + ")$"))),
        "max_pattern_alternatives", "response_format"),
    "nested bounded repeats": (chat(response_format=schema_format(string_with(pattern="^(a{1,50}b?){1,200}$"))),
                               "max_repeat_product", "response_format"),
    "a required tool with a huge enum": (chat(tools=[tool(0, string_with(enum=list(range(3_000))))],
                                              tool_choice="required"), "max_enum_values", "tools"),
    "a thousand stop strings": (chat(stop=[f"s{i}" for i in range(1_000)]), "max_stop", "stop"),
    "a long stop string": (chat(stop=["x" * 100_000]), "max_stop_chars", "stop"),
    "301 logit_bias entries": (chat(logit_bias={str(i): 1 for i in range(301)}), "max_logit_bias", "logit_bias"),
    "129 tools": (chat(tools=[tool(i) for i in range(129)]), "max_tools", "tools"),
    "a completion with 5 stops": ({"model": "chat", "prompt": "hi", "max_tokens": 4, "stop": list("abcde")},
                                  "max_stop", "stop"),
}


@pytest.mark.parametrize("case", sorted(OVERSIZED))
async def test_an_oversized_request_is_refused_at_once_and_charged_nothing(case):
    body, limit, param = OVERSIZED[case]
    arbiter = build_arbiter(config(), engines={"chat": FakeEngine(tokens_per_reply=2, vocab_size=1000)})
    async with live(arbiter, config()) as (url, _):
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        headers = {"Authorization": f"Bearer {KEYS['studio']}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
            before = arbiter.stats()
            start = time.perf_counter()
            r = await http.post(path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            waited = time.perf_counter() - start
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["type"] == "invalid_request_error" and error["param"] == param
            assert limit in error["message"] and len(error["message"]) < 400  # names the limit, echoes no value
            assert waited < 2.0
            after = arbiter.stats()
            studio = after.apps.get("studio")
            assert studio is None or studio.service == (before.apps["studio"].service if "studio" in before.apps else 0)
            assert arbiter.queued("chat") == 0 and not arbiter.engine("chat").running
            other = await http.post("/v1/chat/completions", json=chat(),
                                    headers={"Authorization": f"Bearer {KEYS['driving']}"})
            assert other.status_code == 200


async def test_the_server_takes_its_limits_from_the_configuration():
    cfg = config(max_stop=8, max_enum_values=10)
    arbiter = build_arbiter(cfg, engines={"chat": FakeEngine(tokens_per_reply=2)})
    assert arbiter.limits.max_stop == 8
    async with live(arbiter, cfg) as (url, _):
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEYS['driving']}"},
                                     timeout=30) as http:
            ok, refused = await asyncio.gather(
                http.post("/v1/chat/completions", json=chat(stop=[f"s{i}" for i in range(8)])),
                http.post("/v1/chat/completions", json=chat(response_format=schema_format(
                    string_with(enum=[str(i) for i in range(11)])))),
            )
    assert ok.status_code == 200, ok.text
    assert refused.status_code == 400 and "max_enum_values" in refused.json()["error"]["message"]


async def test_limits_are_checked_in_the_configuration():
    with pytest.raises(ValueError, match="max_stop"):
        Config.model_validate({"server": {"limits": {"max_stop": -1}}})
    with pytest.raises(ValueError, match="max_stops"):
        Config.model_validate({"server": {"limits": {"max_stops": 8}}})  # a misspelt limit is no silent default
