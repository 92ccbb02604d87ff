"""The shared fairness state in Redis: the sync protocol as one Lua script.

Needs the ``redis`` package (``pip install "fairagents[redis]"``); imported only when
a Redis store is used.

Examples:
    >>> from fairagents.shared import RedisStore
    >>> store = RedisStore("redis://:secret@127.0.0.1:6379/0", namespace="prod")
    >>> store.describe(), store.keys[0]
    ('redis://127.0.0.1:6379/0', '{fairagents:prod}:apps')
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fairagents.errors import InvalidParameterError
from fairagents.shared.store import SYNC_LUA, Payload, Reply, StoreUnavailable, encode

__all__ = ["RedisStore"]


class RedisStore:
    """Fairness counters in Redis, shared by every arbiter that names the same URL and namespace.

    Args:
        url: ``redis://[:password@]host:port/db`` (or ``rediss://`` for TLS).
        namespace: keeps several pools apart in one Redis; every key carries the
            Cluster hash tag ``{fairagents:<namespace>}``.
        timeout: seconds a connect or a sync may take before the door counts Redis as
            unreachable and serves on its own counters.

    Examples:
        >>> from fairagents.shared import RedisStore
        >>> RedisStore("http://localhost")
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: shared counters need a redis:// or rediss:// URL, got 'http://localhost'
    """

    def __init__(self, url: str, *, namespace: str = "default", timeout: float = 0.5) -> None:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise InvalidParameterError(f"shared counters need a redis:// or rediss:// URL, got {url!r}")
        if not isinstance(namespace, str) or not namespace or "}" in namespace or "{" in namespace:
            raise InvalidParameterError(f"namespace must be a non-empty string without braces, got {namespace!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise InvalidParameterError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.url = url
        self.namespace = namespace
        self.timeout = float(timeout)
        tag = f"{{fairagents:{namespace}}}"
        self.keys = [f"{tag}:apps", f"{tag}:agents", f"{tag}:doors", f"{tag}:left"]
        self._client: Any = None
        self._script: Any = None

    def describe(self) -> str:
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, "", ""))  # no credentials

    def _connect(self) -> Any:
        if self._client is None:
            import redis.asyncio as aioredis

            self._client = aioredis.Redis.from_url(
                self.url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout,
                health_check_interval=0, retry_on_timeout=False,
            )
            self._script = self._client.register_script(SYNC_LUA)
        return self._client

    async def sync(self, payload: Payload) -> Reply:
        import redis.exceptions

        self._connect()
        try:
            raw = await self._script(keys=self.keys, args=[encode(payload)])
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as err:
            await self._reset()
            raise StoreUnavailable(f"redis at {self.describe()} is unreachable: {err}") from err
        except redis.exceptions.BusyLoadingError as err:  # restarted and loading its data
            raise StoreUnavailable(f"redis at {self.describe()} is loading: {err}") from err
        return json.loads(raw)

    async def leave(self, door: str) -> None:
        import redis.exceptions

        try:
            await self._connect().hdel(self.keys[2], door)
        except (redis.exceptions.RedisError, OSError) as err:
            raise StoreUnavailable(f"redis at {self.describe()} is unreachable: {err}") from err

    async def close(self) -> None:
        await self._reset()

    async def _reset(self) -> None:
        client, self._client, self._script = self._client, None, None
        if client is not None:
            try:
                await client.aclose()
            except Exception:  # a broken connection may fail to close; it is dropped either way
                pass
