"""A real ``redis-server`` on loopback for the tests (installed by ``make test`` where missing)."""

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests._vllm_servers import free_port


class RedisServer:
    """One ``redis-server`` process, no persistence: stopping it loses its data, as a crash would."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "RedisServer":
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (make test installs it on Debian, as root)")
        with (self.folder / f"redis-{self.port}.log").open("a") as log:
            self.proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.folder), "--protected-mode", "yes"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=0.5, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise AssertionError(f"redis-server did not start: {(self.folder / f'redis-{self.port}.log').read_text()}")
                time.sleep(0.05)
        client.close()
        return self

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def flush(self) -> None:
        import redis

        client = redis.Redis.from_url(self.url)
        client.flushall()
        client.close()
