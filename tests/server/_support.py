"""Helpers of the server tests: a live server in the test's event loop, and stock openai clients."""

import asyncio
import contextlib
import time

import openai

from fairagents.constants import HEADER_AGENT
from fairagents.server import Config, create_app, running

KEYS = {"driving": "sk-test-driving", "studio": "sk-test-studio"}
MSG = [{"role": "user", "content": "hello there"}]


def make_config(apps=None, policy="hmfs", in_flight=None, **server):
    """Two apps with keys: driving (weight 2, agent planner of weight 2) and studio; one model, chat."""
    if apps is None:
        apps = {
            "driving": {"api_key": KEYS["driving"], "weight": 2.0, "agents": {"planner": {"weight": 2.0}}},
            "studio": {"api_key": KEYS["studio"]},
        }
    models = {"chat": {"in_flight": in_flight}}
    return Config.model_validate({"policy": policy, "apps": apps, "models": models, "server": server})


@contextlib.asynccontextmanager
async def live(arbiter, config):
    """Start the arbiter and serve it on 127.0.0.1 (a free port) in this loop; yields (base URL, gateway)."""
    await arbiter.start()
    app = create_app(arbiter, config)
    try:
        async with running(app) as url:
            yield url, app.state.gateway
    finally:
        await arbiter.close(timeout=5, stop_engines=False)  # a shared engine outlives the test


def client(url, key=KEYS["driving"], agent=None, *, max_retries=0, **kwargs):
    """The stock openai client, as an app's code would make it."""
    headers = {HEADER_AGENT: agent} if agent else None
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=max_retries, default_headers=headers, **kwargs)


async def wait_until(condition, timeout=10.0):
    """Poll ``condition()`` until it is true."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)
