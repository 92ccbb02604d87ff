import pytest

import fairagents as fa
from fairagents.testing import FakeClock, RecordingPolicy, SimEngine, Workload, simulate


def test_fake_clock_only_moves_forward():
    clock = FakeClock()
    clock.advance(1.5)
    assert clock() == 1.5
    with pytest.raises(fa.InvalidParameterError):
        clock.advance(-1)


def test_recording_policy_captures_the_simulators_decisions():
    policy = RecordingPolicy(fa.policies.HMFS(fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=64, n_layers=1)})))
    who = fa.Agent("t", fa.App("a"))
    result = simulate(Workload().burst(who, "m", n=3, prompt=2, output=2), policy, {"m": SimEngine(fa.ModelProfile(d_model=64, n_layers=1))})
    assert [d.request_id for d in policy.decisions] == result.dispatch_order["m"]


def test_the_arbiter_replay_refuses_engines_that_would_schedule_themselves():
    import pytest

    import fairagents as fa
    from fairagents.testing import SimEngine, Workload, replay_on_arbiter

    work = Workload().burst(fa.Agent("a", fa.App("x")), "m", n=1, prompt=4, output=2)
    with pytest.raises(fa.InvalidParameterError, match="scheduler='vllm' twins"):
        replay_on_arbiter(work, "hmfs", {"m": SimEngine(fa.ModelProfile(d_model=64, n_layers=1), scheduler="fair")})
