import fairagents as fa
from fairagents.policies import RoundRobin


def drain(p, model="m"):
    out = []
    while (r := p.select(model, 0.0)) is not None:
        p.on_dispatch(r, 0.0)
        out.append(r)
    return out


def test_apps_take_turns_and_fifo_inside_an_app(req):
    p = RoundRobin()
    a1, a2, b = fa.Agent("x", fa.App("a")), fa.Agent("y", fa.App("a")), fa.Agent("t", fa.App("b"))
    reqs = [req(a1, id="a1"), req(a2, id="a2"), req(a1, id="a3"), req(b, id="b1")]
    for r in reqs:
        p.on_arrival(r, 0.0)
    assert [r.id for r in drain(p)] == ["a1", "b1", "a2", "a3"]


def test_turns_are_per_model(req):
    p = RoundRobin()
    a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
    for r in [req(a, model="m", id="am"), req(a, model="n", id="an"), req(b, model="n", id="bn"), req(a, model="n", id="an2")]:
        p.on_arrival(r, 0.0)
    assert [r.id for r in drain(p, "n")] == ["an", "bn", "an2"]
    assert [r.id for r in drain(p, "m")] == ["am"]


def test_an_app_that_empties_and_returns_rejoins_at_the_back(req):
    p = RoundRobin()
    a, b, c = (fa.Agent("t", fa.App(n)) for n in "abc")
    p.on_arrival(req(a, id="a1"), 0.0)
    p.on_arrival(req(b, id="b1"), 0.0)
    p.on_arrival(req(b, id="b2"), 0.0)
    r = p.select("m", 0.0)
    p.on_dispatch(r, 0.0)
    p.on_arrival(req(c, id="c1"), 0.0)
    p.on_arrival(req(a, id="a2"), 0.0)
    assert [r.id for r in drain(p)] == ["b1", "c1", "a2", "b2"]


def test_cancelled_head_app_loses_its_turn_cleanly(req):
    p = RoundRobin()
    a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
    ra, rb = req(a), req(b)
    p.on_arrival(ra, 0.0)
    p.on_arrival(rb, 0.0)
    p.on_finish(ra, fa.Outcome.CANCELLED, 0.0)
    assert p.select("m", 0.0) is rb


def test_select_among_takes_turns_across_models(req):
    p = fa.policies.RoundRobin()
    a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
    for i in range(2):
        p.on_arrival(req(a, model="m", arrival=float(i)), 0.0)
        p.on_arrival(req(b, model="n", arrival=10.0 + i), 0.0)
    order = []
    while (r := p.select_among(["m", "n"], 0.0)) is not None:
        p.on_dispatch(r, 0.0)
        order.append(r.app)
    assert order == ["a", "b", "a", "b"]
