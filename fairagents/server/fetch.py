"""Fetching image URLs for clients: off unless configured, and then only from allowed hosts, bounded.

By default the server reads nothing from the network on a client's behalf: an image
part must be a ``data:`` URL. With ``server.image_fetch`` set, an ``https`` (or, if
listed, ``http``) URL on an allowed host is fetched by the server and handed to the
model as if it had been sent inline, under three limits:

- **hosts**: the URL's host must match an entry of ``allow_hosts`` — a host name
  (``images.example.com``), a suffix pattern (``*.cdn.example.com``: its subdomains,
  not itself), either with ``:port`` to pin the port. Redirects are not followed, so
  an allowed host cannot send the server elsewhere;
- **bytes**: at most ``max_bytes`` are read (``max_bytes + 1`` to tell), whatever the
  response's ``Content-Length`` says;
- **time**: the whole fetch, connection to last byte, within ``timeout`` seconds;
- **count**: at most ``max_images`` URLs per request, fetched concurrently; the first
  failure cancels the others.

Anything else is a 400 (:class:`~fairagents.InvalidImageError`) that names the URL's
host at most, never what the server's network looks like.

Examples:
    >>> from fairagents.server.fetch import host_allowed
    >>> host_allowed("https://img.cdn.example.com/a.png", ["*.cdn.example.com"])
    True
    >>> host_allowed("https://cdn.example.com/a.png", ["*.cdn.example.com"])
    False
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

from fairagents.errors import InvalidImageError

__all__ = ["ImageFetcher", "host_allowed"]


def host_allowed(url: str, allow_hosts: Sequence[str]) -> bool:
    """Whether ``url``'s host (and port) matches one of ``allow_hosts``.

    Examples:
        >>> from fairagents.server.fetch import host_allowed
        >>> host_allowed("http://127.0.0.1:8123/x.png", ["127.0.0.1:8123"]), host_allowed("http://127.0.0.1:9/x", ["127.0.0.1:8123"])
        (True, False)
    """
    try:
        parts = urlsplit(url)
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError:
        return False
    if not host:
        return False
    for entry in allow_hosts:
        name, _, pinned = entry.lower().rpartition(":") if entry.count(":") == 1 else (entry.lower(), "", "")
        if pinned and (port is None or str(port) != pinned):
            continue
        if name.startswith("*."):
            if host.endswith(name[1:]) and host != name[2:]:
                return True
        elif host == name:
            return True
    return False


class ImageFetcher:
    """Fetches the image URLs of chat messages from allowed hosts, bounded in bytes and time.

    Args:
        allow_hosts: hosts images may come from (see :func:`host_allowed`).
        max_bytes: most bytes of one image.
        timeout: seconds for one whole fetch.
        schemes: URL schemes fetched (``https`` only, unless ``http`` is listed).
        max_images: most image URLs fetched for one request.

    Examples:
        >>> import asyncio
        >>> from fairagents.server.fetch import ImageFetcher
        >>> fetcher = ImageFetcher(["images.example.com"])
        >>> messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://elsewhere.net/a.png"}}]}]
        >>> asyncio.run(fetcher.inline(messages))
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidImageError: image URLs are fetched only from the hosts the server allows; 'elsewhere.net' is not one
    """

    def __init__(
        self, allow_hosts: Sequence[str], *, max_bytes: int = 20 * 2**20, timeout: float = 10.0,
        schemes: Sequence[str] = ("https",), max_images: int = 8,
    ) -> None:
        self.allow_hosts = list(allow_hosts)
        self.max_images = max_images
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.schemes = tuple(schemes)
        self._client: httpx.AsyncClient | None = None

    async def inline(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with each fetchable image URL replaced by a ``data:`` URL of what it served.

        The images of one request are fetched concurrently. ``data:`` URLs pass as they are.

        Raises:
            InvalidImageError: a URL of another scheme or host, a response that is not a
                200, larger than ``max_bytes``, or slower than ``timeout``.
        """
        jobs: list[tuple[dict[str, Any], str]] = []
        for message in messages:
            content = message.get("content")
            if not isinstance(content, list):
                continue
            for part in content:
                image = part.get("image_url") if isinstance(part, dict) else None
                url = image.get("url") if isinstance(image, dict) else image
                if isinstance(url, str) and not url.startswith("data:"):
                    self._check(url)
                    jobs.append((part, url))
        if not jobs:
            return messages
        if len(jobs) > self.max_images:
            raise InvalidImageError(f"{len(jobs)} image URLs in one request; the server fetches at most {self.max_images}")
        try:
            async with asyncio.TaskGroup() as group:  # the first failure cancels the other fetches
                tasks = [group.create_task(self._fetch(url)) for _, url in jobs]
        except ExceptionGroup as errors:
            raise errors.exceptions[0] from None
        fetched = [task.result() for task in tasks]
        replaced = {id(part): data for (part, _), data in zip(jobs, fetched, strict=True)}
        return [
            {**m, "content": [
                {**p, "image_url": {"url": replaced[id(p)]}} if id(p) in replaced else p for p in m["content"]
            ]} if isinstance(m.get("content"), list) else m
            for m in messages
        ]

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _check(self, url: str) -> None:
        if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
            raise InvalidImageError("an image URL must not contain spaces or control characters")
        scheme = url.partition(":")[0].lower()
        if scheme not in self.schemes:
            raise InvalidImageError(
                f"image URLs must be data: or {' or '.join(s + ':' for s in self.schemes)} URLs on an allowed host"
            )
        if not host_allowed(url, self.allow_hosts):
            host = urlsplit(url).hostname or "?"
            raise InvalidImageError(f"image URLs are fetched only from the hosts the server allows; {host!r} is not one")

    async def _fetch(self, url: str) -> str:
        host = urlsplit(url).hostname
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False, timeout=self.timeout, trust_env=False)
        try:
            async with asyncio.timeout(self.timeout):
                async with self._client.stream("GET", url) as response:
                    if response.status_code != 200:
                        raise InvalidImageError(f"fetching the image from {host!r} answered HTTP {response.status_code}")
                    declared = response.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > self.max_bytes:
                        raise InvalidImageError(f"the image at {host!r} is larger than {self.max_bytes} bytes")
                    chunks, size = [], 0
                    async for chunk in response.aiter_bytes():
                        size += len(chunk)
                        if size > self.max_bytes:
                            raise InvalidImageError(f"the image at {host!r} is larger than {self.max_bytes} bytes")
                        chunks.append(chunk)
                    kind = response.headers.get("content-type", "").split(";")[0].strip()
        except TimeoutError:
            raise InvalidImageError(f"fetching the image from {host!r} took longer than {self.timeout} s") from None
        except (httpx.HTTPError, httpx.InvalidURL) as err:
            raise InvalidImageError(f"fetching the image from {host!r} failed ({type(err).__name__})") from None
        media = kind if kind.startswith("image/") else "application/octet-stream"
        return f"data:{media};base64,{base64.b64encode(b''.join(chunks)).decode()}"
