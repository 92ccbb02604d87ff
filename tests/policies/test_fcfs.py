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


def test_a_removal_on_one_model_does_not_hide_a_request_of_another():
    """Lazy removals are kept per model: an id removed on 'm' and reused on 'n' is not skipped."""
    policy = fa.policies.FCFS()
    who = fa.Agent("t", fa.App("a"))
    head = fa.Request("head", who, "m", 1, 1, 0.0)
    behind = fa.Request("x", who, "m", 1, 1, 1.0)
    policy.on_arrival(head, 0.0)
    policy.on_arrival(behind, 1.0)
    policy.on_finish(behind, fa.Outcome.CANCELLED, 1.0)  # not at the head: removed lazily
    reused = fa.Request("x", who, "n", 1, 1, 2.0)  # the id is free again, on another model
    policy.on_arrival(reused, 2.0)
    assert policy.select("n", 2.0) is reused
    assert policy.queued("n") == 1
