"""The fairness view's entitlement rule on a fake clock: who is active, and what each active client is entitled to."""

import fairagents as fa
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
