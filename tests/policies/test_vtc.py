import pytest

import fairagents as fa
from fairagents.policies import VTC


def test_charges_raw_tokens_input_at_dispatch_output_as_it_streams(req):
    p = VTC()
    a = fa.Agent("t", fa.App("a"))
    r = req(a, model="m", prompt=10)
    p.on_arrival(r, 0.0)
    p.on_dispatch(r, 0.0)
    assert p.counters() == {"a": 10.0}
    p.on_progress(r, 3, 0.1)
    assert p.counters() == {"a": 16.0}
    p.on_finish(r, fa.Outcome.FINISHED, 0.2)
    assert p.counters() == {"a": 16.0}


def test_lowest_counter_goes_first_and_weights_divide_charges(req):
    p = VTC()
    heavy, light = fa.Agent("t", fa.App("heavy", weight=2.0)), fa.Agent("t", fa.App("light"))
    for _ in range(6):
        p.on_arrival(req(heavy, prompt=10), 0.0)
        p.on_arrival(req(light, prompt=10), 0.0)
    apps = []
    for _ in range(6):
        r = p.select("m", 0.0)
        p.on_dispatch(r, 0.0)
        apps.append(r.app)
    assert apps.count("heavy") == 4 and apps.count("light") == 2


def test_flat_over_agents_when_asked(req):
    p = VTC(client="agent")
    app = fa.App("a")
    x, y = fa.Agent("x", app), fa.Agent("y", app, weight=3.0)
    for _ in range(8):
        p.on_arrival(req(x, prompt=6), 0.0)
        p.on_arrival(req(y, prompt=6), 0.0)
    picks = []
    for _ in range(8):
        r = p.select("m", 0.0)
        p.on_dispatch(r, 0.0)
        picks.append(r.agent.name)
    assert picks.count("y") == 6


def test_counter_lift_stops_banked_credit(req):
    p = VTC()
    busy, idle = fa.Agent("t", fa.App("busy")), fa.Agent("t", fa.App("idle"))
    for _ in range(5):
        r = req(busy, prompt=100)
        p.on_arrival(r, 0.0)
    for _ in range(4):
        p.on_dispatch(p.select("m", 0.0), 0.0)
    assert p.counters()["busy"] == 400.0
    p.on_arrival(req(idle, prompt=100), 1.0)
    assert p.counters()["idle"] == 400.0  # lifted to the lowest active counter, not 0


def test_raw_tokens_ignore_model_size(req, unit_cost):
    p = VTC()
    a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
    ra, rb = req(a, model="big", prompt=10), req(b, model="m", prompt=10)
    for r in (ra, rb):
        p.on_arrival(r, 0.0)
    for r in (ra, rb):
        p.on_dispatch(r, 0.0)
    assert p.counters() == {"a": 10.0, "b": 10.0}


def test_rejects_unknown_client_kind():
    with pytest.raises(fa.InvalidParameterError):
        VTC(client="team")

