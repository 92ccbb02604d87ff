"""The fairness view on a fake clock: who is active, what each active client is entitled to, and each app's runs."""

import json

import fairagents as fa
from fairagents.records import Ticket
from fairagents.server.fairness import BELOW_TOLERANCE, FairnessView


def _view():
    arbiter = fa.Arbiter()
    arbiter.app("a", weight=1.0).agent("bot")
    arbiter.app("a").agent("spare", weight=3.0)  # declared, never sends
    arbiter.app("b", weight=3.0).agent("bot")
    arbiter.app("quiet", weight=4.0).agent("bot")  # declared, never sends
    now = [0.0]
    view = FairnessView(arbiter, window=30.0, max_age=0, clock=lambda: now[0])
    view.sample()

    def at(t):
        now[0] = t
        view.sample()

    return arbiter.ledger, view, at


def test_entitlements_are_shared_among_the_active_apps_and_agents_only():
    ledger, view, at = _view()
    ledger.charge(1.0, "a", "bot", 100.0)
    ledger.charge(1.0, "b", "bot", 300.0)
    at(2.0)
    body = view.snapshot()
    a, b, quiet = (body["apps"][name] for name in ("a", "b", "quiet"))
    assert (a["active"], b["active"], quiet["active"]) == (True, True, False)
    assert (a["entitled_share"], b["entitled_share"], quiet["entitled_share"]) == (0.25, 0.75, None)
    assert (a["weight_share"], b["weight_share"]) == (0.125, 0.375)  # over every declared app, as before
    assert (a["recent_share"], b["recent_share"], quiet["recent_share"]) == (0.25, 0.75, 0.0)
    assert a["agents"]["bot"]["entitled_share"] == 1.0 and a["agents"]["spare"]["entitled_share"] is None
    assert not any(c["below_entitlement"] for c in body["apps"].values())  # nothing waits
    assert body["entitlement"] == {"window_seconds": 30.0, "tolerance": BELOW_TOLERANCE}


def test_a_client_stays_active_for_the_window_after_its_last_service():
    ledger, view, at = _view()
    ledger.charge(1.0, "a", "bot", 100.0)
    ledger.charge(1.0, "b", "bot", 300.0)
    at(2.0)
    at(27.0)
    ledger.charge(27.5, "b", "bot", 300.0)
    at(28.0)
    assert view.snapshot()["apps"]["a"]["entitled_share"] == 0.25  # served 27 s ago: still in the window
    at(45.0)  # the window starts at 15 s: a was last served at 1 s, b at 27.5 s
    apps = view.snapshot()["apps"]
    assert (apps["a"]["active"], apps["a"]["entitled_share"], apps["a"]["recent_share"]) == (False, None, 0.0)
    assert (apps["b"]["active"], apps["b"]["entitled_share"], apps["b"]["recent_share"]) == (True, 1.0, 1.0)
    at(60.0)
    assert not any(app["active"] for app in view.snapshot()["apps"].values())


def _runs_view():
    arbiter = fa.Arbiter(clock=lambda: 6.0)  # the records' times: run y is still active at 6 s
    arbiter.app("a").agent("bot")
    arbiter.app("b").agent("bot")
    ledger = arbiter.ledger
    for i, (app, run, amount, end) in enumerate([("a", "x", 10.0, 2.0), ("a", "x", 6.0, 3.0), ("a", "y", 4.0, 5.0),
                                                 ("b", "secret-run", 8.0, 1.0)]):
        r = fa.Request(f"r{i}", fa.Agent("bot", fa.App(app)), "chat", 3, 8, float(i), run=run)
        ledger.arrive(r)
        ledger.charge(float(i), app, "bot", amount, r)
        ledger.record(Ticket(r, reserved=11, ended=end, outcome=fa.Outcome.FINISHED).record())
    ledger.end_run("x", 4.0)
    ledger.end_run("secret-run", 4.0)
    return FairnessView(arbiter, max_age=0)


def test_each_app_shows_its_runs():
    apps = _runs_view().snapshot()["apps"]
    assert apps["a"]["runs"] == {
        "completed": 1, "active": 1, "duration_seconds": {"mean": 3.0, "p95": 3.0}, "calls_mean": 2.0,
        "service_mean": 16.0, "recent": [{"run": "x", "duration_seconds": 3.0, "calls": 2, "service": 16.0}]}
    assert apps["b"]["runs"]["completed"] == 1
    json.dumps(apps, allow_nan=False)  # no NaN: a mean without runs is null


def test_an_app_s_own_view_shows_only_its_own_runs():
    body = _runs_view().snapshot(only="a")
    assert body["apps"]["a"]["runs"]["completed"] == 1 and body["apps"]["_other"]["runs"] is None
    assert "secret-run" not in json.dumps(body)


def test_an_app_without_runs_shows_none():
    arbiter = fa.Arbiter()
    arbiter.app("a").agent("bot")
    runs = FairnessView(arbiter).snapshot()["apps"]["a"]["runs"]
    assert runs == {"completed": 0, "active": 0, "duration_seconds": {"mean": None, "p95": None}, "calls_mean": None,
                    "service_mean": None, "recent": []}


def test_each_device_shows_its_apps_service_share_and_entitlement_and_an_app_sees_only_its_own():
    from fairagents.testing import FakeEngine

    arbiter = fa.Arbiter()
    arbiter.add_model("chat", FakeEngine())
    arbiter.add_model("remote", FakeEngine(shared_capacity=True))  # a device of its own
    arbiter.app("a", weight=3.0).agent("bot")
    for app in ("b", "c"):
        arbiter.app(app).agent("bot")
    now = [0.0]
    view = FairnessView(arbiter, window=30.0, max_age=0, clock=lambda: now[0])
    view.sample()
    for i, (app, model, amount) in enumerate([("a", "chat", 30.0), ("b", "chat", 10.0), ("a", "remote", 5.0),
                                              ("c", "remote", 15.0)]):
        arbiter.ledger.charge(1.0, app, "bot", amount, fa.Request(f"r{i}", fa.Agent("bot", fa.App(app)), model, 1, 1, 0.0))
    now[0] = 2.0
    view.sample()
    devices = view.snapshot()["devices"]
    assert devices["local"] == {"service": 40.0, "apps": {
        "a": {"service": 30.0, "share": 0.75, "active": True, "entitled_share": 0.75, "recent_share": 0.75},
        "b": {"service": 10.0, "share": 0.25, "active": True, "entitled_share": 0.25, "recent_share": 0.25}}}
    remote = devices["remote"]["apps"]  # a's weight 3 against c's 1, on this device alone
    assert (remote["a"]["entitled_share"], remote["c"]["entitled_share"], remote["c"]["share"]) == (0.75, 0.25, 0.75)
    own = view.snapshot(only="b")["devices"]
    assert set(own["local"]["apps"]) == {"b", "_other"} and own["local"]["apps"]["_other"]["service"] == 30.0
    assert set(own["remote"]["apps"]) == {"_other"} and '"c"' not in json.dumps(own)
    now[0] = 40.0  # a window later, nobody was served or waited: no one is active, nothing is owed
    view.sample()
    assert all(a["entitled_share"] is None for d in view.snapshot()["devices"].values() for a in d["apps"].values())
