"""Runs in the accounts: a run completes at its end or once idle, its calls and service add up, bounded."""

import math

import fairagents as fa
from fairagents import Outcome
from fairagents.records import RequestRecord, Ticket
from fairagents.runs import RunBook, RunStats
from fairagents.stats import Ledger, Stats
from fairagents.testing import FakeEngine

MSG = [{"role": "user", "content": "hello there"}]


def rec(id, run, arrival, finished, app="news", agent="writer"):
    return RequestRecord(id, app, agent, "chat", arrival, arrival, arrival, finished, 3, 2, Outcome.FINISHED, run=run)


def request(id, run, arrival=0.0, app="news"):
    return fa.Request(id, fa.Agent("writer", fa.App(app)), "chat", 3, 8, arrival, run=run)


def test_a_record_carries_its_request_s_run_and_old_constructors_still_work():
    assert Ticket(request("r1", "digest-1"), reserved=11).record().run == "digest-1"
    assert Ticket(request("r2", None), reserved=11).record().run is None
    old = RequestRecord("r", "a", "t", "m", 0.0, 0.1, 0.2, 1.0, 1, 2, Outcome.FINISHED, None)
    assert old.run is None and old.e2e == 1.0


def test_a_run_completes_when_its_scope_ends_once_its_requests_have():
    ledger = Ledger()
    first, second = request("r1", "digest", 0.0), request("r2", "digest", 1.0)
    ledger.arrive(first)
    ledger.charge(0.5, "news", "writer", 10.0, first)
    ledger.record(rec("r1", "digest", 0.0, 2.0))
    ledger.arrive(second)
    ledger.charge(2.5, "news", "writer", 5.0, second)
    ledger.end_run("digest", 3.0)  # r2 still runs: the run waits for it
    assert ledger.runs.summary(now=3.0)["news"].active == 1
    ledger.record(rec("r2", "digest", 1.0, 4.0))
    news = ledger.snapshot({"news": 1.0}, {("news", "writer"): 1.0}, {}, {}).runs["news"]
    assert (news.completed, news.active, news.calls, news.service) == (1, 0, 2, 15.0)
    assert (news.duration_mean, news.calls_mean, news.service_mean) == (4.0, 2.0, 15.0)
    [run] = news.recent
    assert (run.run, run.start, run.end, run.duration) == ("digest", 0.0, 4.0, 4.0)
    assert ledger.service_of("news") == 15.0  # the app's account is unchanged


def test_a_run_with_nothing_queued_or_running_completes_after_the_idle_time():
    now = [0.0]
    book = RunBook(idle=30.0, clock=lambda: now[0])
    book.arrive(0.0, "news", "chat-1", "r1", arrival=0.0)
    book.ended(1.0, "news", "chat-1", "r1")
    book.arrive(2.0, "news", "chat-1", "r2", arrival=2.0)  # queued: the run is not idle however long it waits
    now[0] = 100.0
    assert book.summary()["news"].active == 1
    book.ended(101.0, "news", "chat-1", "r2")
    now[0] = 130.5
    assert book.summary()["news"].active == 1  # 29.5 s idle
    now[0] = 131.0
    news = book.summary()["news"]
    assert (news.completed, news.active, news.recent[-1].duration, news.recent[-1].calls) == (1, 0, 101.0, 2)


def test_without_a_clock_the_latest_time_told_stands_for_now():
    book = RunBook(idle=30.0)
    book.ended(1.0, "news", "a", "r1", arrival=0.0)
    assert book.summary()["news"].active == 1
    book.ended(40.0, "news", "b", "r2", arrival=39.0)  # a request ending later finds a idle
    assert (book.summary()["news"].completed, book.summary()["news"].active) == (1, 1)


def test_service_and_calls_are_summed_per_run_and_apps_apart():
    book = RunBook()
    for i, (app, run, amount) in enumerate([("a", "x", 1.0), ("a", "y", 2.0), ("a", "x", 3.0), ("b", "x", 4.0)]):
        book.charge(float(i), app, run, f"r{i}", amount)
        book.ended(float(i) + 0.5, app, run, f"r{i}")
    assert (book.service_of("a", "x"), book.service_of("a", "y"), book.service_of("b", "x")) == (4.0, 2.0, 4.0)
    book.end("x", 10.0)  # the id ends in every app
    summary = book.summary()
    assert {r.run: (r.calls, r.service) for r in summary["a"].recent} == {"x": (2, 4.0)}
    assert (summary["a"].active, summary["b"].completed, summary["b"].service) == (1, 1, 4.0)


def test_the_book_is_bounded_whatever_the_client_sends():
    completed = []
    book = RunBook(idle=math.inf, keep=50, max_active=100, recent=3)
    book.listeners.append(completed.append)
    book.arrive(0.0, "flood", "long", "held", arrival=0.0)  # queued throughout: never the one completed early
    for i in range(10_000):
        book.ended(float(i), "flood", f"run-{i}", f"r{i}", arrival=float(i))
    flood = book.summary()["flood"]
    assert flood.active == 100 and flood.completed == 10_000 - 99 == len(completed)
    assert "long" in book._active["flood"] and len(book._done["flood"]) == 50 and len(flood.recent) == 3
    assert [r.run for r in flood.recent] == [f"run-{i}" for i in range(9898, 9901)]  # the oldest idle went first


def test_requests_without_a_run_are_not_runs_and_stats_default_to_no_runs():
    ledger = Ledger()
    ledger.arrive(request("r1", None))
    ledger.charge(0.0, "news", "writer", 4.0, request("r1", None))
    ledger.record(rec("r1", None, 0.0, 1.0))
    assert ledger.snapshot({"news": 1.0}, {("news", "writer"): 1.0}, {}, {}).runs == {}
    assert Stats(apps={}, agents={}).runs == {}
    assert RunStats().completed == 0 and math.isnan(RunStats().duration_mean)


def test_a_failing_listener_does_not_break_the_accounts():
    book = RunBook()
    book.listeners.append(lambda run: 1 / 0)
    book.ended(1.0, "news", "x", "r1", arrival=0.0)
    book.end("x", 2.0)
    assert book.summary()["news"].completed == 1


async def test_a_run_scope_on_the_live_arbiter_is_one_run_of_two_calls():
    arbiter = fa.Arbiter(in_flight=4, drain_timeout=1.0)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=3))
    writer = arbiter.app("news").agent("writer")
    async with arbiter:
        with arbiter.run() as run_id:
            await writer.chat("chat", MSG, max_tokens=8)
            await writer.chat("chat", MSG, max_tokens=8)
        await writer.chat("chat", MSG, max_tokens=8)  # outside the run: no run of its own in the stats
    news = arbiter.stats().runs["news"]
    assert (news.completed, news.active, news.calls) == (1, 0, 2)
    assert news.service == 2 * (3 + 2 * 3) and news.duration_mean > 0
    assert news.recent[-1].run == run_id and run_id.startswith("run-")
