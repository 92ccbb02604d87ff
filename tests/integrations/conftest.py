"""A fake fairagents server for the integrations' remote mode: answers from memory, records what it got."""

import json

import pytest

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
