import pytest

import fairagents as fa
from fairagents.errors import ProtocolError
from fairagents.engines import SimEngine

PROFILE = fa.ModelProfile(d_model=64, n_layers=1)
WHO = fa.Agent("t", fa.App("a"))


def request(i, prompt=10, max_tokens=5):
    return fa.Request(f"r{i}", WHO, "m", prompt, max_tokens, 0.0)


def run_to_end(engine, now=0.0):
    events = []
    while (end := engine.start_step(now)) is not None:
        now = end
        events.append((now, engine.finish_step(now)))
    return events


def test_continuous_batching_one_token_per_step():
    engine = SimEngine(PROFILE, decode_base=0.01, decode_per_seq=0.0, prefill_per_token=0.0)
    engine.admit(request(1), output_tokens=3)
    engine.admit(request(2), output_tokens=1)
    steps = run_to_end(engine)
    assert [round(t, 6) for t, _ in steps] == [0.01, 0.02, 0.03]
    first = {p.request.id: (p.first, p.finished) for p in steps[0][1]}
    assert first == {"r1": (True, False), "r2": (True, True)}
    assert engine.running == 0 and engine.kv_used == 0


def test_step_time_grows_with_batch_and_prefill():
    engine = SimEngine(PROFILE, decode_base=0.01, decode_per_seq=0.002, prefill_per_token=0.001)
    engine.admit(request(1, prompt=10), output_tokens=2)
    engine.admit(request(2, prompt=20), output_tokens=2)
    end = engine.start_step(0.0)
    assert end == pytest.approx(0.01 + 2 * 0.002 + 30 * 0.001)
    engine.finish_step(end)
    assert engine.start_step(end) - end == pytest.approx(0.01 + 2 * 0.002)  # decode only


def test_capacity_slots_and_kv():
    engine = SimEngine(PROFILE, max_running=2, kv_capacity=40)
    assert engine.fits(request(1, prompt=10, max_tokens=10))
    engine.admit(request(1, prompt=10, max_tokens=10), 10)
    assert not engine.fits(request(2, prompt=15, max_tokens=10))  # 20 + 25 > 40
    engine.admit(request(3, prompt=5, max_tokens=5), 5)
    assert not engine.fits(request(4, prompt=1, max_tokens=1))  # no slot
    with pytest.raises(ProtocolError):
        engine.admit(request(4, prompt=1, max_tokens=1), 1)


def test_context_length_is_bad_input():
    engine = SimEngine(PROFILE, kv_capacity=100, max_model_len=50)
    with pytest.raises(fa.ContextLengthError):
        engine.check(request(1, prompt=45, max_tokens=6))
    with pytest.raises(fa.ContextLengthError):
        engine.admit(request(1, prompt=45, max_tokens=6), 1)
    assert engine.running == 0


def test_abort_frees_slot_and_kv():
    engine = SimEngine(PROFILE)
    engine.admit(request(1), 5)
    assert engine.abort("r1") and not engine.abort("r1")
    assert engine.running == 0 and engine.kv_used == 0


def test_requests_join_between_steps_only():
    engine = SimEngine(PROFILE)
    engine.admit(request(1), 5)
    engine.start_step(0.0)
    with pytest.raises(ProtocolError, match="between steps"):
        engine.admit(request(2), 5)


def test_jitter_is_deterministic_under_a_seed():
    def durations(seed):
        engine = SimEngine(PROFILE, jitter=0.5, seed=seed)
        engine.admit(request(1, max_tokens=20), 20)
        return [t for t, _ in run_to_end(engine)]

    assert durations(3) == durations(3)
    assert durations(3) != durations(4)


@pytest.mark.parametrize(
    "kwargs",
    [{"max_running": 0}, {"kv_capacity": -1}, {"jitter": 1.0}, {"decode_base": -0.1}, {"decode_base": 0, "decode_per_seq": 0}],
)
def test_parameters_are_validated(kwargs):
    with pytest.raises(fa.InvalidParameterError):
        SimEngine(PROFILE, **kwargs)


def test_output_tokens_must_fit_max_tokens():
    engine = SimEngine(PROFILE)
    with pytest.raises(fa.InvalidParameterError):
        engine.admit(request(1, max_tokens=5), output_tokens=6)


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 2**64, True, 1.5])
def test_a_seed_outside_64_bits_is_bad_input(seed):
    """An engine seeds a 64-bit generator: a larger seed would overflow inside its step, for every request."""
    from fairagents.engines import GenerationParams

    with pytest.raises(fa.InvalidParameterError, match="seed"):
        GenerationParams(8, seed=seed)
    assert GenerationParams(8, seed=2**63 - 1).seed == 2**63 - 1
