"""Image URLs are fetched only when configured: allowed hosts only, bounded in bytes and time, no redirects."""

import base64
import http.server
import threading
import time

import httpx
import pytest

import fairagents as fa
from fairagents.errors import InvalidImageError
from fairagents.images import to_png
from fairagents.server import Config
from fairagents.server.fetch import ImageFetcher, host_allowed
from fairagents.testing import FakeEngine

from ._support import KEYS, live

pytestmark = pytest.mark.asyncio(loop_scope="session")

PNG = None


def png():
    global PNG
    if PNG is None:
        from PIL import Image

        PNG = to_png(Image.new("RGB", (8, 8), (200, 10, 10)))
    return PNG


class _Images(http.server.BaseHTTPRequestHandler):
    """/ok.png, /big (a stream without end), /slow, /moved (a redirect), anything else 404."""

    def do_GET(self):  # noqa: N802 - the stdlib's name
        if self.path == "/ok.png":
            self._send(200, png(), "image/png")
        elif self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            try:
                for _ in range(10_000):
                    self.wfile.write(b"\0" * 65536)
            except OSError:
                pass
        elif self.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            try:
                for byte in png():
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass
        elif self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "http://example.com/elsewhere.png")
            self.end_headers()
        else:
            self._send(404, b"no", "text/plain")

    def _send(self, status, body, kind):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def images():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def message(url):
    return [{"role": "user", "content": [{"type": "text", "text": "what is it"}, {"type": "image_url", "image_url": {"url": url}}]}]


async def test_hosts_match_exactly_by_suffix_pattern_and_pinned_port():
    assert host_allowed("https://Images.Example.com/a.png", ["images.example.com"])
    assert not host_allowed("https://images.example.com.evil.net/a.png", ["images.example.com"])
    assert host_allowed("https://a.b.example.com/x", ["*.example.com"]) and not host_allowed("https://example.com/x", ["*.example.com"])
    assert not host_allowed("https://user@evil.net/x", ["images.example.com"])
    assert not host_allowed("not a url", ["images.example.com"]) and not host_allowed("https://[bad/x", ["x"])


async def test_an_allowed_image_is_fetched_into_a_data_url(images):
    fetcher = ImageFetcher([images], schemes=["http"])
    try:
        [msg] = await fetcher.inline(message(f"http://{images}/ok.png"))
    finally:
        await fetcher.aclose()
    url = msg["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,") and base64.b64decode(url.split(",", 1)[1]) == png()
    assert msg["content"][0] == {"type": "text", "text": "what is it"}


@pytest.mark.parametrize(("path", "match"), [
    ("/missing.png", "answered HTTP 404"),
    ("/moved", "answered HTTP 302"),  # redirects are not followed: an allowed host cannot send us elsewhere
    ("/big", "larger than 100000 bytes"),
    ("/slow", "took longer than 0.3 s"),
])
async def test_a_fetch_that_fails_or_exceeds_its_limits_is_bad_input(images, path, match):
    fetcher = ImageFetcher([images], schemes=["http"], max_bytes=100_000, timeout=0.3)
    start = time.perf_counter()
    try:
        with pytest.raises(InvalidImageError, match=match) as err:
            await fetcher.inline(message(f"http://{images}{path}"))
    finally:
        await fetcher.aclose()
    assert isinstance(err.value, ValueError) and time.perf_counter() - start < 2.0
    assert "127.0.0.1" in str(err.value) or "HTTP" in str(err.value)


async def test_other_hosts_and_schemes_are_refused_without_a_request(images):
    fetcher = ImageFetcher([images])  # https only
    with pytest.raises(InvalidImageError, match="must be data: or https: URLs"):
        await fetcher.inline(message(f"http://{images}/ok.png"))
    with pytest.raises(InvalidImageError, match="'10.0.0.1' is not one"):
        await fetcher.inline(message("https://10.0.0.1/ok.png"))
    with pytest.raises(InvalidImageError, match="must be data: or https:"):
        await fetcher.inline(message("file:///etc/hostname"))


async def test_over_http_image_urls_are_refused_unless_the_server_fetches_them(images):
    arbiter = fa.Arbiter()
    vision = FakeEngine(profile=fa.ModelProfile(d_model=4096, n_layers=1, modality=fa.Modality.VISION))
    arbiter.add_model("vlm", vision)
    apps = {"driving": {"api_key": KEYS["driving"]}}
    body = {"model": "vlm", "messages": message(f"http://{images}/ok.png"), "max_tokens": 2}
    headers = {"Authorization": f"Bearer {KEYS['driving']}"}
    closed = Config.model_validate({"apps": apps, "models": {"vlm": {}}})
    async with live(arbiter, closed) as (url, _), httpx.AsyncClient(base_url=url, headers=headers) as http:
        r = await http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and "data URL" in r.json()["error"]["message"]
        schema = (await http.get("/openapi.json")).text
        assert "^data:" in schema
    fetching = Config.model_validate({"apps": apps, "models": {"vlm": {}},
                                      "server": {"image_fetch": {"allow_hosts": [images], "schemes": ["http"]}}})
    arbiter = fa.Arbiter()
    arbiter.add_model("vlm", vision)
    async with live(arbiter, fetching) as (url, _), httpx.AsyncClient(base_url=url, headers=headers) as http:
        r = await http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        [prompt] = vision.prompts.values()
        assert prompt.n_tokens > 0
        other = {**body, "messages": message("http://169.254.169.254/latest/meta-data")}
        r = await http.post("/v1/chat/completions", json=other)
        assert r.status_code == 400 and "is not one" in r.json()["error"]["message"]
        assert "http://" in (await http.get("/openapi.json")).text


async def test_control_characters_and_too_many_urls_are_bad_input_without_a_request(images):
    fetcher = ImageFetcher([images], schemes=["http"], max_images=2)
    try:
        with pytest.raises(InvalidImageError, match="control characters"):
            await fetcher.inline(message(f"http://{images}/a\tb.png"))
        many = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"http://{images}/ok.png"}}] * 3}]
        with pytest.raises(InvalidImageError, match="3 image URLs in one request"):
            await fetcher.inline(many)
        one_bad = [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"http://{images}/slow"}},
            {"type": "image_url", "image_url": {"url": f"http://{images}/missing.png"}}]}]
        start = time.perf_counter()
        with pytest.raises(InvalidImageError, match="404"):
            await fetcher.inline(one_bad)
        assert time.perf_counter() - start < 2.0  # the slow one was cancelled, not waited for
    finally:
        await fetcher.aclose()
