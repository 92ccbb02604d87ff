"""Numbers no tenant can break, over HTTP: a weight or SLO out of range is a 400 naming its header, quoted briefly.

On a live server with two keyed apps and FakeEngines (a test double); the same attack on
the real engine, with preemption, is in ``test_real.py``.
"""

import asyncio

import httpx
import pytest

import fairagents as fa
from fairagents.constants import HEADER_AGENT, HEADER_AGENT_SLO, HEADER_AGENT_WEIGHT
from fairagents.testing import FakeEngine

from ._support import KEYS, MSG, live, make_config

BODY = {"model": "chat", "messages": MSG, "max_tokens": 2}


def _error(response):
    body = response.json()["error"]
    return response.status_code, body["code"], body["param"]


@pytest.mark.parametrize(("header", "value"), [
    (HEADER_AGENT_WEIGHT, "1e-320"), (HEADER_AGENT_WEIGHT, "4e-324"), (HEADER_AGENT_WEIGHT, "5e-309"),
    (HEADER_AGENT_WEIGHT, "0.0001"), (HEADER_AGENT_WEIGHT, "1e4"), (HEADER_AGENT_WEIGHT, "1" + "0" * 400),
    (HEADER_AGENT_SLO, "ttft=1e-320"), (HEADER_AGENT_SLO, "e2e=1e9"), (HEADER_AGENT_SLO, "tpot=0.00001"),
])
async def test_a_number_out_of_its_range_is_a_400_naming_its_header_and_costs_nothing(header, value):
    arbiter = fa.Arbiter(in_flight=4, drain_timeout=1.0)
    engine = FakeEngine(tokens_per_reply=2)
    arbiter.add_model("chat", engine)
    async with live(arbiter, make_config()) as (url, gateway), httpx.AsyncClient(base_url=url) as http:
        response = await http.post("/v1/chat/completions", json=BODY, headers={
            "Authorization": f"Bearer {KEYS['studio']}", HEADER_AGENT: "evil", header: value})
    assert _error(response) == (400, "invalid_parameter", header)
    studio = arbiter.stats().apps.get("studio")
    assert engine.started_order == [] and (studio is None or studio.service == 0)


async def test_an_error_quotes_a_long_header_briefly():
    arbiter = fa.Arbiter(in_flight=4, drain_timeout=1.0)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=2))
    async with live(arbiter, make_config()) as (url, _), httpx.AsyncClient(base_url=url) as http:
        weight = await http.post("/v1/chat/completions", json=BODY, headers={
            "Authorization": f"Bearer {KEYS['studio']}", HEADER_AGENT_WEIGHT: "9" * 60_000})
        slo = await http.post("/v1/chat/completions", json=BODY, headers={
            "Authorization": f"Bearer {KEYS['studio']}", HEADER_AGENT_SLO: "x" * 60_000})
    for response in (weight, slo):
        assert response.status_code == 400 and len(response.content) < 1_000, response.content[:200]
        assert "60000 characters" in response.json()["error"]["message"]


async def test_while_one_app_sends_a_subnormal_weight_the_other_is_served_and_health_answers():
    """The attack as a hostile tenant ran it: both apps keep 24 requests in flight, one stating weight 1e-320."""
    arbiter = fa.Arbiter(in_flight=8, drain_timeout=1.0)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=4, token_time=0.002))
    async with live(arbiter, make_config()) as (url, _), httpx.AsyncClient(base_url=url, timeout=30) as http:
        async def caller(app, weight, n):
            codes = []
            for _ in range(n):
                headers = {"Authorization": f"Bearer {KEYS[app]}", HEADER_AGENT: "bot"}
                if weight:
                    headers[HEADER_AGENT_WEIGHT] = weight
                codes.append((await http.post("/v1/chat/completions", json=BODY, headers=headers)).status_code)
            return codes

        async def health():
            answers = []
            for _ in range(20):
                answers.append((await http.get("/health/live")).status_code)
                await asyncio.sleep(0.01)
            return answers

        results = await asyncio.gather(*[caller("studio", "1e-320", 4) for _ in range(24)],
                                       *[caller("driving", None, 4) for _ in range(24)], health())
    evil, good, live_answers = results[:24], results[24:48], results[48]
    assert {code for codes in evil for code in codes} == {400}
    assert {code for codes in good for code in codes} == {200}
    assert set(live_answers) == {200}
