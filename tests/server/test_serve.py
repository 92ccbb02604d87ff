"""``serve``: SIGTERM stops admitting, drains accepted requests up to the timeout, then exits; ``main``'s checks."""

import asyncio
import signal
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

import fairagents as fa
from fairagents.server import main

from ._support import MSG


async def _server(drain_timeout, tokens):
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).with_name("_serve_fake.py")), str(drain_timeout), str(tokens),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        url = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().strip()
        assert url.startswith("http://127.0.0.1:"), url
    except BaseException:
        process.kill()
        await process.wait()
        raise
    return process, url


async def _draining(http):
    response = await http.get("/health")
    return response.status_code == 503 and response.json()["status"] == "draining"


async def test_sigterm_stops_admitting_drains_in_flight_requests_and_exits():
    process, url = await _server(drain_timeout=10, tokens=60)  # a request takes 0.6 s
    try:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as c, \
                httpx.AsyncClient(base_url=url) as http:
            stream = await c.chat.completions.create(model="chat", messages=MSG, max_tokens=60, stream=True)
            chunks = [await anext(stream)]
            whole = asyncio.create_task(c.chat.completions.create(model="chat", messages=MSG, max_tokens=60))
            queued = asyncio.create_task(c.chat.completions.create(model="chat", messages=MSG, max_tokens=10))  # limit is 2
            await asyncio.sleep(0.1)
            process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 5
            while not await _draining(http):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            with pytest.raises(openai.InternalServerError) as info:
                await c.chat.completions.create(model="chat", messages=MSG)
            assert info.value.status_code == 503 and info.value.code == "shutting_down"
            chunks += [chunk async for chunk in stream]
            assert chunks[-1].choices[0].finish_reason == "length"
            assert sum(bool(ch.choices[0].delta.content) for ch in chunks) == 60
            assert (await whole).usage.completion_tokens == 60 and (await queued).usage.completion_tokens == 10
        out, _ = await asyncio.wait_for(process.communicate(), 15)
        assert process.returncode == 0 and out.strip() == b"exited"
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_past_the_drain_timeout_the_rest_is_aborted_and_the_server_exits():
    process, url = await _server(drain_timeout=0.3, tokens=2000)  # 20 s: longer than the drain
    try:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as c:
            stream = await c.chat.completions.create(model="chat", messages=MSG, max_tokens=2000, stream=True)
            await anext(stream)
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            with pytest.raises(openai.APIError, match="shut down"):
                async for _ in stream:
                    pass
        out, _ = await asyncio.wait_for(process.communicate(), 15)
        assert process.returncode == 0 and out.strip() == b"exited"
        assert time.monotonic() - started < 5
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def test_main_checks_its_arguments_before_starting_anything(tmp_path):
    with pytest.raises(fa.InvalidParameterError, match="no app is declared"):
        main(_write(tmp_path / "serve.toml", "[models.chat]\n"))
    with pytest.raises(fa.InvalidParameterError, match="--host/--port"):
        main(_write(tmp_path / "ok.yaml", "server: {auth: false}\n"), port=70000)


def _write(path, text):
    path.write_text(text)
    return path
