import fairagents as fa
from fairagents.policies import FCFS


def test_orders_by_arrival_time_not_call_order(req):
    p = FCFS()
    a = fa.Agent("t", fa.App("a"))
    r2, r1, r3 = req(a, arrival=2.0), req(a, arrival=1.0), req(a, arrival=2.0)
    for r in (r2, r1, r3):
        p.on_arrival(r, 3.0)
    order = []
    while (r := p.select("m", 3.0)) is not None:
        p.on_dispatch(r, 3.0)
        order.append(r)
    assert order == [r1, r2, r3]  # ties keep call order


def test_flood_goes_first_whoever_it_starves(req):
    p = FCFS()
    flood, victim = fa.Agent("t", fa.App("flood")), fa.Agent("t", fa.App("victim"))
    for i in range(10):
        p.on_arrival(req(flood, arrival=0.0), 0.0)
    p.on_arrival(req(victim, arrival=0.1), 0.1)
    apps = []
    while (r := p.select("m", 1.0)) is not None:
        p.on_dispatch(r, 1.0)
        apps.append(r.app)
    assert apps == ["flood"] * 10 + ["victim"]
