"""``serve``: SIGTERM stops admitting, drains accepted requests up to the timeout, then exits; ``main``'s checks."""

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

import fairagents as fa
from fairagents.server import main
from fairagents.server.serve import FORCED_EXIT, SHUTDOWN_GRACE

from ._support import MSG


async def _server(drain_timeout, tokens, in_flight=2, *, stuck=False, stderr=None):
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).with_name("_serve_fake.py")), str(drain_timeout), str(tokens), str(in_flight),
        *(["stuck"] if stuck else []), stdout=asyncio.subprocess.PIPE, stderr=stderr,
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


async def _outcome(http, max_tokens, *, stream):
    """What a client got: "complete" (the whole reply), "503", "error event" (after streaming), or else what."""
    body = {"model": "chat", "messages": MSG, "max_tokens": max_tokens, "stream": stream}
    if not stream:
        response = await http.post("/v1/chat/completions", json=body)
        if response.status_code == 200:
            assert response.json()["usage"]["completion_tokens"] == max_tokens
            return "complete"
        return str(response.status_code)
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            return str(response.status_code)
        events = [line.removeprefix("data: ") async for line in response.aiter_lines() if line.startswith("data: ")]
    if events[-1] == "[DONE]":
        tokens = sum(bool(c["delta"].get("content")) for e in events[:-1] for c in json.loads(e)["choices"])
        assert tokens == max_tokens
        return "complete"
    return "error event" if "error" in json.loads(events[-1]) else f"cut after {len(events)} events"


async def _half_sent_request(port):
    """A connection that sent a request's headers and only part of its body: it keeps the request open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{")
    await writer.drain()
    return reader, writer


async def test_under_load_the_process_exits_within_a_second_of_the_drain_timeout():
    drain = 1.5
    process, url = await _server(drain_timeout=drain, tokens=2000, in_flight=16)
    limits = httpx.Limits(max_connections=100)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
            async def accepted():
                return sum(m["in_flight"] + m["queued"] for m in (await http.get("/v1/fairness")).json()["models"].values())

            # 8 requests that end within the drain (0.6 s each), then 52 that cannot (20 s): 8 of them
            # run, 44 wait in the queue; half of each stream.
            short = [asyncio.create_task(_outcome(http, 60, stream=i % 2 == 0)) for i in range(8)]
            deadline = time.monotonic() + 10
            while await accepted() < 8:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            long = [asyncio.create_task(_outcome(http, 2000, stream=i % 2 == 0)) for i in range(52)]
            while await accepted() + sum(t.done() for t in short) < 60:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            # and two uploads caught half-way, which uvicorn would otherwise wait 5 s for
            half_sent = [await _half_sent_request(int(url.rsplit(":", 1)[1])) for _ in range(2)]
            await asyncio.sleep(0.05)
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), 15)
            took = time.monotonic() - started
            outcomes = await asyncio.gather(*short, *long)
            for _, writer in half_sent:
                writer.close()
        # The bound is drain + SHUTDOWN_GRACE (1 s); 0.25 s more is slack for timing it from here:
        # this process sends the signal and notices the exit only when the scheduler lets it, on a
        # machine it shares with the server and its load.
        assert took < drain + SHUTDOWN_GRACE + 0.25, f"SIGTERM to exit: {took:.2f} s"
        assert outcomes[:8] == ["complete"] * 8
        assert set(outcomes[8:]) <= {"503", "error event"}, outcomes[8:]
        assert (await process.stdout.read()).strip() == b"exited" and process.returncode == 0
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


async def test_an_idle_server_exits_soon_after_sigterm_and_logs_its_drain_as_info(tmp_path):
    """``fairagents serve`` with a policy of its own (the guide's, as module:Class), in front of a replica here.

    The replica is a fairagents server on a FakeEngine in this process, so the server under
    test runs no engine of its own; its clients keep their connections open, as a dashboard does.
    """
    import shutil

    from fairagents.server import Config, create_app, running
    from fairagents.testing import FakeEngine

    from ._support import write_guide_policy

    replica = fa.Arbiter()
    replica.add_model("chat", FakeEngine())
    policy = write_guide_policy(tmp_path, "served_policy")  # imported from the directory it runs in
    (tmp_path / "serve.toml").write_text(
        '[server]\nauth = false\nport = 0\n[models.chat]\nengine = "openai"\nurls = ["{url}/v1"]\n'
        "d_model = 64\nn_layers = 2\ntoken_capacity = 4096\n")
    command = shutil.which("fairagents", path=str(Path(sys.executable).parent)) or "fairagents"
    async with replica, running(create_app(replica, Config.default())) as replica_url:
        (tmp_path / "serve.toml").write_text((tmp_path / "serve.toml").read_text().replace("{url}", replica_url))
        process = await asyncio.create_subprocess_exec(
            command, "-v", "serve", "--config", "serve.toml", "--policy", policy, cwd=tmp_path,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            lines = []
            while not lines or "fairagents: serving chat on" not in lines[-1]:
                line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
                assert line, "".join(lines)
                lines.append(line)
            assert "(policy served_policy:EarliestDeadlineFirst;" in lines[-1], lines[-1]
            url = lines[-1].split(" on ")[1].split("/v1")[0]
            async with httpx.AsyncClient(base_url=url) as http:  # kept open across the signal
                assert (await http.get("/health")).json()["status"] == "ok"
                assert (await http.get("/v1/fairness")).status_code == 200
                started = time.monotonic()
                process.send_signal(signal.SIGTERM)
                _, rest = await asyncio.wait_for(process.communicate(), 30)
                took = time.monotonic() - started
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert process.returncode == 0 and took < 5, f"SIGTERM to exit: {took:.2f} s"
    [drain] = [line for line in rest.decode().splitlines() if "fairagents.server.draining" in line]
    assert "[info" in drain, drain  # a normal shutdown is no warning


def test_the_command_lines_options_override_the_configuration(tmp_path, monkeypatch):
    from fairagents.server import Config
    from fairagents.server.serve import with_options

    from ._support import write_guide_policy

    monkeypatch.syspath_prepend(str(tmp_path))
    policy = write_guide_policy(tmp_path, "option_policy")
    config = with_options(Config.default(), host="0.0.0.0", port=9000, policy=policy, model="/models/qwen")
    assert (config.server.host, config.server.port, config.policy) == ("0.0.0.0", 9000, policy)
    assert config.models["chat"].path == "/models/qwen" and with_options(config) == config
    two = Config.model_validate({"server": {"auth": False}, "models": {"chat": {}, "vision": {"engine": "vision"}}})
    with pytest.raises(fa.InvalidParameterError, match=r"--model: the configuration serves 2 models \(chat, vision\)"):
        with_options(two, model="/models/qwen")
    with pytest.raises(fa.InvalidParameterError, match="--policy: policy 'option_policy:Nope': module 'option_policy' "
                                                       "has no attribute 'Nope'"):
        with_options(Config.default(), policy="option_policy:Nope")


def test_only_a_loopback_address_counts_as_local():
    from fairagents.server.serve import _loopback

    assert _loopback("127.0.0.1") and _loopback("::1") and _loopback("localhost")
    assert not _loopback("0.0.0.0") and not _loopback("10.0.0.5") and not _loopback("::")


async def test_a_thread_stuck_with_the_pool_lock_is_logged_and_sigterm_still_ends_the_process():
    drain = 0.5
    process, url = await _server(drain_timeout=drain, tokens=4, stuck=True, stderr=asyncio.subprocess.PIPE)
    errors = bytearray()

    async def read_errors():
        while line := await process.stderr.readline():
            errors.extend(line)

    reader = asyncio.create_task(read_errors())
    try:
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30, connect=5)) as http:
            # The request reaches the dispatcher, whose lock the stuck thread holds: the event loop waits on it.
            pending = asyncio.create_task(http.post("/v1/chat/completions", json={"model": "chat", "messages": MSG}))
            deadline = time.monotonic() + 20
            while b"fairagents.policy.lock_held" not in errors:
                assert time.monotonic() < deadline, errors.decode()[-2000:]
                await asyncio.sleep(0.05)
            assert b"stuck-engine" in errors and b"hold_forever" in errors  # who holds it, and where
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), drain + FORCED_EXIT + 10)
            took = time.monotonic() - started
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await reader
        assert process.returncode == 1
        assert b"fairagents.server.forced_exit" in errors
        assert took < drain + FORCED_EXIT + 1.0, f"SIGTERM to exit: {took:.2f} s"
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        reader.cancel()
