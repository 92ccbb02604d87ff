"""Contract checks every built-in policy must pass."""

import pytest

import fairagents as fa
from fairagents.errors import ProtocolError
from fairagents.policies import HMFS

ALL = list(fa.policies.POLICIES.values())


@pytest.fixture(params=ALL, ids=lambda cls: cls.name)
def policy(request, unit_cost):
    cls = request.param
    return cls(unit_cost)


def test_every_policy_satisfies_the_protocol(policy):
    assert isinstance(policy, fa.policies.Policy)


def test_select_is_a_pure_query(policy, req):
    a = fa.Agent("t", fa.App("a"))
    for _ in range(3):
        policy.on_arrival(req(a), 0.0)
    first = policy.select("m", 0.0)
    assert policy.select("m", 0.0) is first
    assert policy.queued("m") == 3


def test_select_on_other_or_unknown_model_is_none(policy, req):
    policy.on_arrival(req(fa.Agent("t", fa.App("a"))), 0.0)
    assert policy.select("n", 0.0) is None
    assert policy.select("nope", 0.0) is None


def test_unknown_model_is_rejected_before_queueing(policy, req):
    with pytest.raises(fa.UnknownModelError):
        policy.on_arrival(req(fa.Agent("t", fa.App("a")), model="nope"), 0.0)
    assert policy.queued() == 0


def test_duplicate_id_is_rejected(policy, req):
    r = req(fa.Agent("t", fa.App("a")))
    policy.on_arrival(r, 0.0)
    with pytest.raises(ProtocolError, match="already"):
        policy.on_arrival(r, 0.0)
    assert policy.queued() == 1


def test_transitions_are_checked(policy, req):
    """Out-of-order calls are a driver's bug: ProtocolError, which is not a ValueError (not bad input)."""
    assert not issubclass(ProtocolError, ValueError)
    r = req(fa.Agent("t", fa.App("a")))
    with pytest.raises(ProtocolError):
        policy.on_dispatch(r, 0.0)
    with pytest.raises(ProtocolError):
        policy.on_progress(r, 1, 0.0)
    with pytest.raises(ProtocolError):
        policy.on_finish(r, fa.Outcome.FINISHED, 0.0)
    policy.on_arrival(r, 0.0)
    with pytest.raises(ProtocolError):
        policy.on_progress(r, 1, 0.0)  # not running yet
    policy.on_dispatch(r, 0.0)
    with pytest.raises(ProtocolError):
        policy.on_dispatch(r, 0.0)
    policy.on_finish(r, fa.Outcome.FINISHED, 0.0)
    with pytest.raises(ProtocolError):
        policy.on_finish(r, fa.Outcome.FINISHED, 0.0)


@pytest.mark.parametrize("n", [-1, 2.5, True])
def test_negative_or_non_integer_progress_is_rejected(policy, req, n):
    r = req(fa.Agent("t", fa.App("a")))
    policy.on_arrival(r, 0.0)
    policy.on_dispatch(r, 0.0)
    with pytest.raises(fa.InvalidParameterError):
        policy.on_progress(r, n, 0.0)


def test_cancelling_a_waiting_request_removes_it_anywhere_in_the_queue(policy, req):
    a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
    reqs = [req(a), req(b), req(a), req(b)]
    for r in reqs:
        policy.on_arrival(r, 0.0)
    policy.on_finish(reqs[2], fa.Outcome.CANCELLED, 0.0)
    policy.on_finish(reqs[0], fa.Outcome.CANCELLED, 0.0)
    seen = []
    while (r := policy.select("m", 0.0)) is not None:
        policy.on_dispatch(r, 0.0)
        seen.append(r)
    assert sorted(r.id for r in seen) == sorted([reqs[1].id, reqs[3].id])
    assert policy.queued() == 0


def test_every_request_is_dispatched_exactly_once(policy, req):
    agents = [fa.Agent(f"t{i}", fa.App(f"a{i % 3}")) for i in range(6)]
    reqs = [req(agents[i % 6], model="mn"[i % 2]) for i in range(60)]
    for r in reqs:
        policy.on_arrival(r, 0.0)
    seen = []
    for model in "mn":
        while (r := policy.select(model, 0.0)) is not None:
            assert r.model == model
            policy.on_dispatch(r, 0.0)
            policy.on_progress(r, 3, 0.0)
            policy.on_finish(r, fa.Outcome.FINISHED, 0.0)
            seen.append(r.id)
    assert sorted(seen) == sorted(r.id for r in reqs)


def test_make_policy_by_name_and_object(unit_cost):
    assert fa.policies.make_policy("hmfs", unit_cost).cost is unit_cost
    assert isinstance(fa.policies.make_policy("vtc", unit_cost).cost, fa.RawTokenCost)  # VTC counts raw tokens
    p = HMFS()
    assert fa.policies.make_policy(p) is p
    with pytest.raises(fa.InvalidParameterError):
        fa.policies.make_policy(42)
    with pytest.raises(fa.InvalidParameterError, match="unknown policy"):
        fa.policies.make_policy("lottery")


def test_select_among_is_a_pure_query_over_models_with_room(policy, req):
    a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
    ra, rb = req(a, model="m", arrival=0.0), req(b, model="n", arrival=1.0)
    for r in (ra, rb):
        policy.on_arrival(r, 1.0)
    first = policy.select_among(["m", "n"], 1.0)
    assert first in (ra, rb) and policy.select_among(["m", "n"], 1.0) is first
    assert policy.select_among(["n"], 1.0) is rb  # only models with room are candidates
    assert policy.select_among(["big"], 1.0) is None and policy.select_among([], 1.0) is None
    assert policy.queued() == 2


def test_select_among_drains_every_model(policy, req):
    agents = [fa.Agent("t", fa.App(name)) for name in "abc"]
    policy_requests = [req(who, model=model) for who in agents for model in ("m", "n", "big")]
    for r in policy_requests:
        policy.on_arrival(r, 0.0)
    seen = []
    while (r := policy.select_among(["m", "n", "big"], 0.0)) is not None:
        policy.on_dispatch(r, 0.0)
        policy.on_progress(r, 2, 0.0)
        seen.append(r.id)
    assert sorted(seen) == sorted(r.id for r in policy_requests)


def test_a_policy_object_missing_part_of_the_interface_is_named():
    class OldStyle:  # written before policies chose across models
        name = "old"

        def on_arrival(self, req, now): ...
        def select(self, model, now): ...
        def on_dispatch(self, req, now): ...
        def on_progress(self, req, n, now): ...
        def on_finish(self, req, outcome, now): ...
        def queued(self, model=None): ...

    with pytest.raises(fa.InvalidParameterError, match="lacks select_among; subclass"):
        fa.Arbiter(policy=OldStyle())
    with pytest.raises(fa.InvalidParameterError, match="must be a name or a Policy"):
        fa.policies.make_policy(42)
