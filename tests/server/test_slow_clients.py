"""Clients that are slow or silent: streams nobody reads, bodies that do not arrive, headers that never end."""

import asyncio
import contextlib
import json
import socket
import time

import pytest

import fairagents as fa
from fairagents.testing import FakeEngine

from ._support import KEYS, MSG, client, live, make_config, wait_until

WORD = "x" * 32_000 + " "  # a token of 32 kB: a stream fills the socket buffers in some tens of tokens


def _silent_socket(port: int) -> socket.socket:
    """A connected socket with a tiny receive buffer, which the test never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    return sock


def _request(body: bytes, key: str, *, length: int | None = None) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body) if length is None else length}\r\n\r\n"
            ).encode() + body


async def _reply(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """What the server sends before it closes the connection."""
    sock.setblocking(False)
    loop, data = asyncio.get_running_loop(), b""
    async with asyncio.timeout(timeout):
        while chunk := await loop.sock_recv(sock, 65536):
            data += chunk
    return data


async def test_streams_nobody_reads_are_cut_free_their_slots_and_are_charged_what_they_produced():
    arbiter = fa.Arbiter(in_flight=32)
    engine = FakeEngine(reply=WORD * 300)
    arbiter.add_model("chat", engine)
    body = json.dumps({"model": "chat", "messages": MSG, "max_tokens": 300, "stream": True}).encode()
    async with live(arbiter, make_config(stream_stall_timeout=1.0)) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        silent = [_silent_socket(port) for _ in range(32)]
        try:
            for sock in silent:
                sock.sendall(_request(body, KEYS["driving"]))
            await wait_until(lambda: arbiter.stats().apps["driving"].in_flight == 32)
            started = time.monotonic()
            async with client(url, KEYS["studio"], timeout=10) as studio:  # queued behind 32 streams nobody reads
                reply = await studio.chat.completions.create(model="chat", messages=MSG, max_tokens=5)
            assert reply.usage.completion_tokens == 5 and time.monotonic() - started < 8
            await wait_until(lambda: sum(r.app == "driving" for r in arbiter.ledger.records) == 32)
        finally:
            for sock in silent:
                sock.close()
    records = [r for r in arbiter.ledger.records if r.app == "driving"]
    assert {r.outcome for r in records} == {fa.Outcome.CANCELLED}
    assert all(0 < r.output_tokens < 300 for r in records)
    assert arbiter.ledger.service_of("driving") == sum(r.prompt_tokens + 2 * r.output_tokens for r in records)
    assert engine.running == set()


async def test_a_body_that_does_not_arrive_in_time_is_a_408():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", FakeEngine())
    async with live(arbiter, make_config(body_timeout=0.5)) as (url, _):
        sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        try:
            sock.sendall(_request(b'{"model": "chat", ', KEYS["driving"], length=100))  # and the rest never comes
            started = time.monotonic()
            reply = await _reply(sock)
        finally:
            sock.close()
    assert reply.startswith(b"HTTP/1.1 408 ") and b"body_timeout" in reply
    assert 0.4 < time.monotonic() - started < 3
    assert not arbiter.ledger.records


@pytest.mark.parametrize("sent", [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: te"])
async def test_a_connection_that_never_completes_its_headers_is_closed(sent):
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", FakeEngine())
    async with live(arbiter, make_config(header_timeout=0.5)) as (url, _):
        sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        try:
            sock.sendall(sent)
            started = time.monotonic()
            assert await _reply(sock) == b""
        finally:
            sock.close()
    assert 0.4 < time.monotonic() - started < 3


async def test_a_pipelined_request_does_not_clear_the_deadline_of_a_response_left_unread():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", FakeEngine(reply=WORD * 300))
    body = json.dumps({"model": "chat", "messages": MSG, "max_tokens": 300}).encode()
    async with live(arbiter, make_config(stream_stall_timeout=1.0, body_timeout=30.0)) as (url, _):
        sock = _silent_socket(int(url.rsplit(":", 1)[1]))
        try:
            sock.sendall(_request(body, KEYS["driving"]))  # a reply of some 10 MB, which it never reads
            await wait_until(lambda: len(arbiter.ledger.records) == 1)
            await asyncio.sleep(0.1)  # the reply is sent: its unread deadline runs
            sock.sendall(_request(b"", KEYS["driving"], length=100))  # the next request's headers, and no body
            await asyncio.sleep(2.0)
            reply = b""
            with contextlib.suppress(ConnectionResetError):  # cut: it ends at once, where kept it would wait 30 s
                reply = await _reply(sock, timeout=5)
        finally:
            sock.close()
    assert len(reply) < len(WORD) * 300
