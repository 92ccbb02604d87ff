"""``vllm serve --scheduler-cls fairagents.vllm.FairScheduler`` over HTTP: fairness, ``/metrics``, refusals.

A real vLLM OpenAI server on loopback, the embedded tiny model. The fair one is the
guide's CPU command as written (``docs/guides/fair-vllm.md``), but for the model, its
address and one batch slot; it serves every test of this module. A flood process
sends twelve long requests at once (one batch slot: several seconds of work); once
eight of them wait in the server's queue (its ``/metrics``), a victim process sends
four short ones. Both use the stock ``openai`` client through the docs' snippet,
naming their app in ``vllm_xargs``. Under vLLM's own FCFS the victim waits behind the
whole flood; under the fair scheduler it is served alongside it.
"""

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

from .._vllm_servers import free_port, start_server, stop_server, wait_healthy

pytest.importorskip("vllm")
pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
SNIPPET = ROOT / "docs" / "snippets" / "vllm_client.py"
GUIDE = ROOT / "docs" / "guides" / "fair-vllm.md"
GUIDE_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def guide_cpu_command() -> str:
    """The guide's CPU command, its continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), re.S)
    cpu = [b for b in blocks if "vllm.entrypoints.openai.api_server" in b]
    assert len(cpu) == 1, "the guide has one CPU command"
    return " ".join(cpu[0].replace("\\\n", " ").split())


class Server(NamedTuple):
    url: str
    """The OpenAI base URL (``.../v1``)."""
    log: Path


@pytest.fixture(scope="module")
def fair_server(tmp_path_factory):
    """The guide's CPU command, run by a shell as written, with the embedded model, an address and one batch slot."""
    from fairagents.models import ensure_default_models

    command = guide_cpu_command()
    assert GUIDE_MODEL in command and command.startswith("PROMETHEUS_MULTIPROC_DIR=$(mktemp -d) python -m ")
    model = str(ensure_default_models(["text"])["text"])
    port = free_port()
    command = command.replace(GUIDE_MODEL, model) + f" --host 127.0.0.1 --port {port} --max-num-seqs 1"
    tmp = tmp_path_factory.mktemp("fair-vllm")
    env = {**os.environ, "TMPDIR": str(tmp), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = tmp / "server.log"
    with log.open("w") as sink:  # its own process group: the engine process goes with it
        proc = subprocess.Popen(["bash", "-c", command], stdout=sink, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_healthy(proc, url, log)
        yield Server(url, log)
    finally:
        stop_server(proc)

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
def test_two_client_processes_over_http(fair, tmp_path, request):
    if fair:
        flood, victim = clients(request.getfixturevalue("fair_server").url)
    else:
        log = tmp_path / "server.log"
        proc, url = start_server(log, "--max-num-seqs", "1")
        try:
            wait_healthy(proc, url, log)
            flood, victim = clients(url)
        finally:
            stop_server(proc)
    before_victim_done = sum(t < max(victim) for t in flood)
    if fair:
        assert before_victim_done <= 8  # served alongside the flood's backlog
    else:
        assert before_victim_done >= 11  # FCFS: behind (nearly) all of it


# -- /metrics ----------------------------------------------------------------------------

SCALE = 128 / 4096 * 2  # unified tokens per raw token of the embedded model (hidden 128, 2 layers)
SAMPLE = re.compile(r'^(fairagents_\w+)\{([^}]*)\} (\S+)$', re.M)


def fair_samples(url: str) -> dict[tuple[str, frozenset], float]:
    """The ``fairagents_*`` samples of the server's ``/metrics``: (name, labels) -> value."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
    return {(name, frozenset(re.findall(r'(\w+)="([^"]*)"', labels))): float(value)
            for name, labels, value in SAMPLE.findall(text)}


def value(samples, name, **labels):
    want = {("model_name", "chat"), ("engine", "0"), *labels.items()}
    return sum(v for (n, got), v in samples.items() if n == name and got == want)


def complete(url, app, agent, max_tokens, **weights):
    """One completion of exactly ``max_tokens`` tokens; its usage."""
    body = {"model": "chat", "prompt": f"{app} {agent} asks", "max_tokens": max_tokens, "ignore_eos": True,
            "vllm_xargs": {"fairagents_app": app, "fairagents_agent": agent, **weights}}
    reply = httpx.post(f"{url}/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]


def test_vllms_metrics_show_each_apps_service_queues_and_weights(fair_server):
    url = fair_server.url
    calls = [("m-heavy", "planner", {"fairagents_app_weight": 3, "fairagents_agent_weight": 2}),
             ("m-heavy", "critic", {"fairagents_app_weight": 3}), ("m-light", "solo", {})] * 2
    usages, seen = [], []
    threads = [threading.Thread(target=lambda c=c: usages.append((c[:2], complete(url, *c[:2], 96, **c[2]))))
               for c in calls]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):  # one batch slot: the others wait, and /metrics says so
        seen.append(fair_samples(url))
        time.sleep(0.1)
    for t in threads:
        t.join()
    ids = {c[:2] for c in calls}
    for kind, most in (("running", 1), ("queued", len(calls) - 1)):  # one batch slot
        counts = [sum(value(s, f"fairagents_{kind}_requests", app=app, agent=agent) for app, agent in ids) for s in seen]
        assert 1 <= max(counts) <= most, (kind, counts)

    expected: dict[tuple[str, str], float] = {}
    for who, usage in usages:  # HMFS's charge: 1 × prompt, 2 × output, in unified tokens
        expected[who] = expected.get(who, 0.0) + (usage["prompt_tokens"] + 2 * usage["completion_tokens"]) * SCALE
    deadline = time.monotonic() + 10
    while True:  # the last figures are published once the engine has run out of requests
        samples = fair_samples(url)
        service = {who: value(samples, "fairagents_service_unified_tokens_total", app=who[0], agent=who[1])
                   for who in expected}
        idle = all(value(samples, f"fairagents_{kind}_requests", app=app, agent=agent) == 0
                   for kind in ("queued", "running") for app, agent in expected)
        if (service == pytest.approx(expected) and idle) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert service == pytest.approx(expected)
    assert idle
    assert value(samples, "fairagents_app_weight", app="m-heavy") == 3.0
    assert value(samples, "fairagents_app_weight", app="m-light") == 1.0
    assert value(samples, "fairagents_agent_weight", app="m-heavy", agent="planner") == 2.0
    assert value(samples, "fairagents_agent_weight", app="m-heavy", agent="critic") == 1.0


def test_metric_labels_are_bounded(fair_server):
    from fairagents.vllm.metrics import MAX_AGENTS, MAX_APPS, OVERFLOW

    url = fair_server.url
    for i in range(MAX_AGENTS + 2):  # one app with too many agents
        complete(url, "c-crowded", f"agent-{i}", 1)
    for i in range(MAX_APPS + 2):  # then more apps than the cap (this module's other tests have some already)
        complete(url, f"c-app-{i}", "solo", 1)
    time.sleep(1.0)  # past the publication interval
    samples = fair_samples(url)
    service = {dict(labels)["app"]: v for (name, labels), v in samples.items()
               if name == "fairagents_service_unified_tokens_total"}
    assert len(service) == MAX_APPS + 1 and OVERFLOW in service
    crowded = {dict(labels)["agent"] for (name, labels), _ in samples.items()
               if name == "fairagents_service_unified_tokens_total" and dict(labels)["app"] == "c-crowded"}
    assert len(crowded) == MAX_AGENTS + 1 and OVERFLOW in crowded


# -- refusals ----------------------------------------------------------------------------

REFUSED = [
    ('{"fairagents_app": "r", "fairagents_app_weight": -3}', "fairagents_app_weight must be a finite number in [0.001, 1000], got -3"),
    ('{"fairagents_app": "r", "fairagents_app_weight": "heavy"}',
     "fairagents_app_weight must be a finite number in [0.001, 1000], got 'heavy'"),
    ('{"fairagents_app": "r", "fairagents_agent_weight": NaN}', None),  # as sent: not JSON, but parsed
    ('{"fairagents_app": "r", "fairagents_agent_weight": Infinity}', None),
    ('{"fairagents_app": "r", "fairagents_agent_weight": 1e999}', None),
    ('{"fairagents_app": "r", "fairagents_agent_weight": 0}', "fairagents_agent_weight must be a finite number in [0.001, 1000], got 0"),
    ('{"fairagents_app": 5}', "fairagents_app must be a non-empty string"),
    ('{"fairagents_app": "r", "fairagents_agent": ["a", "b"]}', "fairagents_agent must be a non-empty string"),
    ('{"fairagents_app": "r", "fairagents_wieght": 2}', "unknown key 'fairagents_wieght'"),
]


def total_service(url: str) -> float:
    return sum(v for (name, _), v in fair_samples(url).items() if name == "fairagents_service_unified_tokens_total")


def test_invalid_arguments_are_answered_400(fair_server):
    before = total_service(fair_server.url)
    for xargs, reason in REFUSED:
        for path, body in (("completions", '"prompt": "hi"'),
                           ("chat/completions", '"messages": [{"role": "user", "content": "hi"}]')):
            raw = f'{{"model": "chat", {body}, "max_tokens": 4, "vllm_xargs": {xargs}}}'
            reply = httpx.post(f"{fair_server.url}/{path}", content=raw, headers={"Content-Type": "application/json"},
                               timeout=60)
            assert reply.status_code == 400, (xargs, reply.text)
            if reason is not None:
                assert reason in reply.json()["error"]["message"], xargs
    time.sleep(0.6)  # past the publication interval: a request that ran would show
    assert total_service(fair_server.url) == before  # none queued nor charged


def test_valid_arguments_are_served(fair_server):
    usage = complete(fair_server.url, "ok-app", "ok-agent", 2, fairagents_app_weight=0.5, fairagents_agent_weight=4)
    assert usage["completion_tokens"] == 2
