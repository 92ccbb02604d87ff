"""ThreadedEngine's life cycle on a toy library: streams, abort, stop, failure and restart, load errors."""

import asyncio
import contextlib
import queue
import threading
import time

import pytest

import fairagents as fa
from fairagents.engines import Delta, GenerationParams, Prompt
from fairagents.engines.threaded import ThreadedEngine
from fairagents.errors import ProtocolError
from fairagents.identity import Modality

pytestmark = pytest.mark.asyncio

PROMPT = Prompt(token_ids=(1, 2))


class Toy(ThreadedEngine):
    """Emits one token per step for each running request, until ``max_tokens``."""

    modality = Modality.TEXT
    kind = "toy"
    library = "toylib"

    def __init__(self, model, *, load_error: str | None = None):
        super().__init__(model)
        self.load_error = load_error
        self.crash = threading.Event()
        self.unloaded = 0
        self.threads: list[str] = []

    def _load(self):
        self.threads.append(threading.current_thread().name)
        if self.load_error:
            raise OSError(self.load_error)
        return object()

    async def _ready(self, loaded):
        self.max_model_len = 64

    def _serve(self, loaded, loop):
        running: dict[str, int] = {}
        while True:
            commands = [] if running else [self._inbox.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    commands.append(self._inbox.get_nowait())
            for command in commands:
                if command[0] == "stop":
                    return
                if command[0] == "add":
                    running[command[1]] = command[2]
                elif command[0] == "abort":
                    running.pop(command[1], None)
                    if command[2]:
                        self._post(loop, command[1], Delta(0, "", "abort"))
            if self.crash.is_set():
                raise RuntimeError("the device blew up")
            for rid in list(running):
                running[rid] -= 1
                self._post(loop, rid, running[rid] == 0)
                if not running[rid]:
                    del running[rid]
            time.sleep(0.002)

    def _unload(self, loaded):
        self.unloaded += 1

    def _command(self, request_id, prompt, params):
        return "add", request_id, params.max_tokens

    def _cancel(self, request_id, *, notify):
        self._inbox.put(("abort", request_id, notify))

    def _delta(self, event, params):
        return Delta(1, "x", "length" if event else None)


@pytest.fixture
def model(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


async def test_a_request_streams_from_the_thread_and_stop_releases_the_model(model):
    engine = Toy(model)
    await engine.start()
    await engine.start()  # idempotent
    assert engine.max_model_len == 64 and engine.healthy and len(engine.threads) == 1
    assert engine.threads[0].startswith("fairagents-toy-")
    deltas = [d async for d in engine.generate("r1", PROMPT, GenerationParams(3))]
    assert [(d.new_tokens, d.finish_reason) for d in deltas] == [(1, None), (1, None), (1, "length")]
    await engine.stop()
    await engine.stop()  # idempotent
    assert engine.unloaded == 1
    with pytest.raises(fa.EngineError, match="not started"):
        await anext(engine.generate("r2", PROMPT, GenerationParams(3)))


async def test_abort_ends_the_stream_with_abort_and_a_running_id_is_refused(model):
    engine = Toy(model)
    await engine.start()
    try:
        stream = engine.generate("r1", PROMPT, GenerationParams(10**6))
        assert (await anext(stream)).finish_reason is None
        with pytest.raises(ProtocolError, match="already running"):
            await anext(engine.generate("r1", PROMPT, GenerationParams(2)))
        await engine.abort("r1")
        rest = [d async for d in stream]
        assert rest[-1].finish_reason == "abort"
        await engine.abort("gone")  # nothing running by that id: nothing happens
        early = engine.generate("r2", PROMPT, GenerationParams(10**6))
        await anext(early)
        await early.aclose()  # leaving early frees the engine's slot
        assert [d.finish_reason async for d in engine.generate("r3", PROMPT, GenerationParams(1))] == ["length"]
    finally:
        await engine.stop()


async def test_stopping_fails_the_requests_still_running(model):
    engine = Toy(model)
    await engine.start()
    stream = engine.generate("r1", PROMPT, GenerationParams(10**6))
    await anext(stream)
    stopping = asyncio.create_task(engine.stop())
    with pytest.raises(fa.EngineError, match="the engine stopped"):
        async for _ in stream:
            pass
    await stopping
    assert engine.healthy


async def test_a_failure_while_serving_fails_every_stream_and_a_restart_serves_again(model):
    engine = Toy(model)
    await engine.start()
    streams = [engine.generate(f"r{i}", PROMPT, GenerationParams(10**6)) for i in range(2)]
    for stream in streams:
        await anext(stream)
    engine.crash.set()
    for stream in streams:
        with pytest.raises(fa.EngineError, match="toylib failed serving .*the device blew up"):
            async for _ in stream:
                pass
    assert not engine.healthy  # the streams fail first; the dying thread releases the model after
    with pytest.raises(fa.EngineError, match="blew up"):
        await anext(engine.generate("r3", PROMPT, GenerationParams(1)))
    engine.crash.clear()
    await engine.start()  # reaps the dead thread, loads anew
    assert engine.healthy and len(engine.threads) == 2 and engine.unloaded == 1
    assert [d.finish_reason async for d in engine.generate("r4", PROMPT, GenerationParams(1))] == ["length"]
    await engine.stop()


async def test_a_load_failure_is_a_one_line_model_load_error(model):
    engine = Toy(model, load_error="bad weights:\n   layer 3\n   shape mismatch")
    with pytest.raises(fa.ModelLoadError, match=r"^toylib could not load '.*': bad weights: layer 3 shape mismatch$"):
        await engine.start()
    assert not engine.healthy
    engine.load_error = None
    await engine.start()
    assert engine.healthy
    await engine.stop()


async def test_a_model_that_is_not_there_fails_before_a_thread_starts(tmp_path):
    engine = Toy(str(tmp_path / "missing"))
    with pytest.raises(fa.ModelLoadError, match="no folder"):
        await engine.start()
    assert not engine.healthy and not engine.threads
