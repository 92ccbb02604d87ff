"""Runs on ``/metrics``: a histogram of run durations and counters of their calls and service, labelled by app only."""

from prometheus_client.parser import text_string_to_metric_families

import fairagents as fa
from fairagents.records import Ticket
from fairagents.server.fairness import FairnessView
from fairagents.server.metrics import Metrics
from fairagents.testing import FakeEngine

MSG = [{"role": "user", "content": "hello there"}]


def _samples(text):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


async def test_a_completed_run_is_observed_by_app_and_an_open_one_is_active():
    arbiter = fa.Arbiter(in_flight=4, drain_timeout=1.0)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=3))
    writer = arbiter.app("news").agent("writer")
    metrics = Metrics(arbiter, FairnessView(arbiter, max_age=0))
    async with arbiter:
        with arbiter.run():
            await writer.chat("chat", MSG, max_tokens=8)
            await writer.chat("chat", MSG, max_tokens=8)
        await writer.chat("chat", MSG, max_tokens=8, run="still-open")
        samples = _samples(metrics.render().decode())
    app = (("app", "news"),)
    assert samples[("fairagents_run_duration_seconds_count", app)] == 1
    assert samples[("fairagents_run_duration_seconds_sum", app)] > 0
    assert samples[("fairagents_run_calls_total", app)] == 2
    assert samples[("fairagents_run_service_unified_tokens_total", app)] == 2 * (3 + 2 * 3)
    assert samples[("fairagents_active_runs", app)] == 1
    run_series = [key for key in samples if "run" in key[0]]
    assert all({k for k, _ in labels} <= {"app", "le"} for _, labels in run_series)  # never a run id
    assert not any("still-open" in str(key) for key in samples)


def test_run_series_are_bounded_by_the_app_cap():
    arbiter = fa.Arbiter()
    metrics = Metrics(arbiter, FairnessView(arbiter, max_age=0), max_apps=2)
    ledger = arbiter.ledger
    for i in range(50):
        r = fa.Request(f"r{i}", fa.Agent("bot", fa.App(f"app-{i}")), "chat", 3, 8, float(i), run="x")
        ledger.charge(float(i), r.app, "bot", 1.0, r)
        ledger.record(Ticket(r, reserved=11, ended=float(i) + 0.5, outcome=fa.Outcome.FINISHED).record())
        ledger.end_run("x", float(i) + 0.5)
    apps = {dict(labels).get("app") for name, labels in _samples(metrics.render().decode())
            if name.startswith("fairagents_run_")}
    assert apps == {"app-0", "app-1", "_other"}
