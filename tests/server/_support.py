"""Helpers of the server tests: a live server in the test's event loop, and stock openai clients."""

import asyncio
import contextlib
import time

import openai
from PIL import Image

import fairagents as fa
from fairagents.constants import HEADER_AGENT
from fairagents.engines.base import Delta, Prompt
from fairagents.server import Config, create_app, running
from fairagents.testing import FakeEngine

KEYS = {"driving": "sk-test-driving", "studio": "sk-test-studio"}
MSG = [{"role": "user", "content": "hello there"}]


def make_config(apps=None, policy="hmfs", in_flight=None, **server):
    """Two apps with keys: driving (weight 2, agent planner of weight 2) and studio; one model, chat.

    The views (``/metrics``, ``/v1/fairness``, ``/dashboard``) are open (``public_views``) unless
    the test says ``public_views=False``: tests/server/test_views.py is about who sees them.
    """
    server.setdefault("public_views", True)
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


class FakePainter(FakeEngine):
    """A FakeEngine that makes images: sizes of 8 to 64 pixels a side in multiples of 8, up to 2 at a time."""

    default_size, default_steps = (16, 16), 2

    def __init__(self):
        super().__init__(profile=fa.ModelProfile(d_model=64, n_layers=1, modality=fa.Modality.IMAGE))

    def latent_tokens(self, size, steps, n):
        if not all(isinstance(v, int) and 8 <= v <= 64 and v % 8 == 0 for v in size):
            raise fa.InvalidParameterError(f"size: cannot make images of {size}", param="size")
        if not 1 <= n <= 2:
            raise fa.InvalidParameterError("n must be an integer in [1, 2]", param="n")
        return size[0] // 8 * size[1] // 8 * steps * n

    def prepare_image(self, prompt, *, size, steps, n, guidance=None):
        self.latent_tokens(size, steps, n)
        return Prompt(token_ids=tuple(range(len(prompt.split()) + 1)), data=(size, n))

    async def generate(self, request_id, prompt, params):
        size, n = prompt.data
        yield Delta(params.max_tokens, "", "stop", images=tuple(Image.new("RGB", size) for _ in range(n)))


GUIDE_POLICY = "docs/snippets/custom_policy.py"
"""The policy of the writing-a-policy guide, which the server tests serve as ``module:Class``."""


def write_guide_policy(folder, module="guide_policy"):
    """Write the guide's policy class (its imports and class, not its simulation) as ``folder/module.py``.

    Returns its ``module:Class`` (the snippet's one ``BasePolicy`` subclass); ``folder`` must be on
    ``sys.path`` to import it.
    """
    import ast
    from pathlib import Path

    source = (Path(__file__).resolve().parents[2] / GUIDE_POLICY).read_text()
    tree = ast.parse(source)
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    [policy] = [node for node in tree.body if isinstance(node, ast.ClassDef)
                and any(ast.unparse(base).endswith("BasePolicy") for base in node.bases)]
    (Path(folder) / f"{module}.py").write_text(ast.unparse(ast.Module([*imports, policy], type_ignores=[])) + "\n")
    return f"{module}:{policy.name}"
