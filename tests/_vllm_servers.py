"""Real vLLM OpenAI servers on loopback for the tests (the embedded tiny model, through the module entry point)."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from fairagents.engines.base import COMPACT_JSON as ENGINE_COMPACT_JSON


# Compact constrained JSON, as fairagents' own engines write it (the docs' replica command).
COMPACT_JSON = tuple(arg for key, value in ENGINE_COMPACT_JSON.items()
                     for arg in (f"--structured-outputs-config.{key}", str(value).lower()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(log: Path, *extra: str, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``vllm serve`` of the embedded text model as ``chat``; its process and OpenAI base URL once healthy."""
    from fairagents.models import ensure_default_models

    port = port or free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
           str(ensure_default_models(["text"])["text"]), "--served-model-name", "chat", "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "512", "--dtype", "float32", "--enforce-eager",
           "--kv-cache-memory-bytes", str(64 * 2**20), *COMPACT_JSON, *extra]
    with log.open("w") as sink:  # a file, not a pipe: nobody drains a pipe, and a full one would block the server
        # Its own process group: vLLM runs its engine in child processes, which must go with it.
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}/v1"


def wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float = 240) -> None:
    root = url.removesuffix("/v1")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the vLLM server exited: {log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{root}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"the vLLM server did not become healthy in {timeout:g} s")


def kill_server(proc: subprocess.Popen) -> None:
    """Kill the server and its engine processes at once, as a crash would."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def stop_server(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    kill_server(proc)  # whatever of the group is left
