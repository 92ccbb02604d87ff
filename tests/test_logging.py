"""The library writes nothing on stdout when the program that uses it configures no logging."""

import subprocess
import sys
import textwrap

import pytest

ON_FAKE_ENGINE = """
import asyncio
import fairagents as fa
from fairagents.testing import FakeEngine

async def main():
    arbiter = fa.Arbiter(policy="hmfs")
    arbiter.add_model("chat", FakeEngine())
    agent = arbiter.app("a").agent("x")
    async with arbiter:
        await agent.chat("chat", [{"role": "user", "content": "hi"}], max_tokens=4)
        await arbiter.restart_model("chat")

asyncio.run(main())
"""

ON_THE_EMBEDDED_MODEL = """
import asyncio
import fairagents as fa
from fairagents.engines.vllm import VLLMEngine

async def main():
    arbiter = fa.Arbiter(policy="hmfs")
    arbiter.add_model("chat", VLLMEngine(kv_cache_bytes=32 * 2**20))
    async with arbiter:
        await arbiter.app("a").agent("x").chat("chat", [{"role": "user", "content": "hi"}], max_tokens=4)

asyncio.run(main())
"""


def _run(program: str, *, env_drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_LOGGING", "VLLM_CONFIGURE")) and k not in env_drop}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(program)], capture_output=True, text=True,
                          timeout=600, env=env)


def test_the_arbiter_prints_nothing_on_stdout_unconfigured():
    done = _run(ON_FAKE_ENGINE)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == ""  # structlog unconfigured would print started/restarted/closed here
    assert "fairagents.arbiter" not in done.stderr  # info events go nowhere unless asked for


def test_events_reach_structlog_once_the_application_configures_it():
    program = "import structlog, sys\nstructlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))\n"
    done = _run(program + ON_FAKE_ENGINE)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == ""
    assert "fairagents.arbiter.started" in done.stderr and "fairagents.arbiter.closed" in done.stderr


def test_events_reach_the_standard_library_once_the_application_configures_it():
    program = "import logging\nlogging.basicConfig(level=logging.INFO)\n"  # basicConfig writes to stderr
    done = _run(program + ON_FAKE_ENGINE)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fairagents.arbiter.model_restarted" in done.stderr


@pytest.mark.engine
def test_an_in_process_vllm_engine_prints_nothing_on_stdout_unconfigured():
    done = _run(ON_THE_EMBEDDED_MODEL)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "", done.stdout[:2000]  # vLLM's own config would print dozens of INFO lines here
    assert " INFO " not in done.stderr
