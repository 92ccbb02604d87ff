import numpy as np
import pytest

from fairagents.bench import arrivals
from fairagents.bench.arrivals import (
    ExFairSRounds,
    Formula,
    Gamma,
    HMASStress,
    OnOff,
    Piecewise,
    Poisson,
    hmas_stress_rate,
    parse_rate_formula,
)
from fairagents.errors import InvalidParameterError


def rng(seed=0):
    return np.random.default_rng(seed)


def cv(times):
    gaps = np.diff(times)
    return gaps.std() / gaps.mean()


def rate_on(times, start, end):
    return np.count_nonzero((times >= start) & (times < end)) / (end - start)


@pytest.mark.parametrize("process", [
    Poisson(3.0), Gamma(3.0, cv=2.0), OnOff(Poisson(6.0), on=5.0, off=5.0), ExFairSRounds(qpm=120.0),
    Piecewise(((0.0, 500.0, 3.0),)), Formula("3"), HMASStress(5.0),
])
def test_every_process_is_deterministic_for_a_seed_and_stays_in_its_window(process):
    a, b = process.times(rng(7), 10.0, 500.0), process.times(rng(7), 10.0, 500.0)
    assert np.array_equal(a, b) and len(a) > 100
    assert not np.array_equal(a, process.times(rng(8), 10.0, 500.0))
    assert a.min() >= 10.0 and a.max() < 500.0 and np.all(np.diff(a) >= 0)
    assert isinstance(process, arrivals.ArrivalProcess)


def test_poisson_matches_its_rate_with_cv_one():
    times = Poisson(4.0).times(rng(), 0.0, 5000.0)
    assert rate_on(times, 0, 5000) == pytest.approx(4.0, rel=0.03)
    assert cv(times) == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize("target", [0.5, 1.0, 3.0])
def test_gamma_matches_its_rate_and_cv(target):
    times = Gamma(2.0, cv=target).times(rng(), 0.0, 10_000.0)
    assert rate_on(times, 0, 10_000) == pytest.approx(2.0, rel=0.08)
    assert cv(times) == pytest.approx(target, rel=0.08)


def test_gamma_cv_zero_sends_evenly_from_a_random_phase():
    a, b = Gamma(4.0, cv=0.0).times(rng(1), 0.0, 10.0), Gamma(4.0, cv=0.0).times(rng(2), 0.0, 10.0)
    assert np.allclose(np.diff(a), 0.25) and len(a) in (39, 40)
    assert a[0] != b[0] and 0 <= a[0] < 0.25


def test_onoff_is_silent_while_off_with_the_base_rate_while_on():
    times = OnOff(Poisson(10.0), on=30.0, off=90.0).times(rng(), 0.0, 12_000.0)
    phase = times % 120.0
    assert np.all(phase < 30.0)
    duty = len(times) / (10.0 * 12_000.0)
    assert duty == pytest.approx(0.25, rel=0.03)  # on / (on + off)


def test_onoff_keeps_a_renewal_base_evenly_spaced_across_pauses():
    times = OnOff(Gamma(1.0, cv=0.0), on=10.0, off=10.0).times(rng(), 0.0, 100.0)
    assert len(times) == 50 and np.all(times % 20.0 < 10.0)


def test_exfairs_sends_in_the_window_at_one_and_a_quarter_times_its_qpm():
    qpm = 60.0
    times = ExFairSRounds(qpm=qpm, rounds=40).times(rng(), 0.0, 10_000.0)
    assert np.all(times % 60.0 <= 48.0) and times.max() < 40 * 60.0
    in_window_per_minute = len(times) / (40 * 48.0) * 60.0
    assert in_window_per_minute == pytest.approx(1.25 * qpm, rel=0.03)
    per_round = np.bincount((times // 60).astype(int))
    assert per_round.max() <= qpm  # never more than the round's plan


@pytest.mark.parametrize("qpm", [4.0, 5.0, 60.0])
def test_exfairs_sends_every_planned_request_of_every_round_within_its_window(qpm):
    rounds = 500
    times = ExFairSRounds(qpm=qpm, rounds=rounds).times(rng(), 0.0, 1e6)
    assert np.all(times % 60.0 <= 48.0)
    assert np.bincount((times // 60).astype(int), minlength=rounds).tolist() == [int(qpm)] * rounds


@pytest.mark.parametrize("qpm", [4.0, 5.0, 60.0])
def test_exfairs_scaled_below_one_sends_the_kept_share_of_every_round(qpm):
    rounds = 2000
    times = ExFairSRounds(qpm=qpm, rounds=rounds).scaled(0.4).times(rng(), 0.0, 1e6)
    assert np.all(times % 60.0 <= 48.0)
    per_round = np.bincount((times // 60).astype(int), minlength=rounds)
    assert per_round.max() <= qpm and per_round.mean() == pytest.approx(0.4 * qpm, rel=0.05)


def test_exfairs_gaps_follow_the_compressed_normal():
    times = ExFairSRounds(qpm=30.0, rounds=200).times(rng(), 0.0, 20_000.0)
    gaps = np.diff(times)
    gaps = gaps[gaps < 10.0]  # within a round
    assert gaps.mean() == pytest.approx(2.0 * 0.8, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(0.3, rel=0.1)


def test_exfairs_scaled_down_keeps_its_rounds_and_the_expected_rate():
    full = ExFairSRounds(qpm=4.0)
    scaled = full.scaled(0.1)
    assert scaled.qpm == 4.0 and scaled.keep == pytest.approx(0.1)
    kept = sum(len(scaled.times(rng(s), 0.0, 600.0)) for s in range(200))
    sent = sum(len(full.times(rng(s), 0.0, 600.0)) for s in range(200))
    assert kept / sent == pytest.approx(0.1, rel=0.15)
    assert full.scaled(3.0).qpm == 12.0 and scaled.scaled(20.0) == ExFairSRounds(qpm=8.0)


def test_piecewise_rates_per_segment():
    p = Piecewise(((0.0, 1000.0, 2.0), (1000.0, 2000.0, 8.0), (3000.0, 4000.0, 1.0)))
    times = p.times(rng(), 0.0, 4000.0)
    assert rate_on(times, 0, 1000) == pytest.approx(2.0, rel=0.07)
    assert rate_on(times, 1000, 2000) == pytest.approx(8.0, rel=0.05)
    assert rate_on(times, 2000, 3000) == 0
    assert rate_on(times, 3000, 4000) == pytest.approx(1.0, rel=0.1)
    assert rate_on(p.scaled(2.0).times(rng(), 0.0, 4000.0), 1000, 2000) == pytest.approx(16.0, rel=0.05)


@pytest.mark.parametrize("segments", [((0.0, 10.0, 1.0), (5.0, 20.0, 1.0)), ((5.0, 5.0, 1.0),), ((0.0, 1.0, -1.0),)])
def test_piecewise_refuses_overlapping_empty_or_negative_segments(segments):
    with pytest.raises(InvalidParameterError):
        Piecewise(segments)


def test_formula_rates_per_segment_by_thinning():
    f = Formula("2 if t < 500 else (10 if t < 1000 else 0)")
    times = f.times(rng(), 0.0, 1500.0)
    assert rate_on(times, 0, 500) == pytest.approx(2.0, rel=0.1)
    assert rate_on(times, 500, 1000) == pytest.approx(10.0, rel=0.05)
    assert rate_on(times, 1000, 1500) == 0


def test_a_linear_formula_has_the_integrated_count():
    times = Formula("24 + 48 * t / 200").times(rng(), 0.0, 200.0)
    assert len(times) == pytest.approx((24 + 72) / 2 * 200, rel=0.03)
    assert rate_on(times, 150, 200) > 1.5 * rate_on(times, 0, 50)


def test_a_formula_that_outgrows_its_stated_bound_raises():
    with pytest.raises(InvalidParameterError, match="rate_max"):
        Formula("100 if t > 5 else 1", rate_max=2.0).times(rng(), 0.0, 10.0)


@pytest.mark.parametrize("expr", ["-1", "1 / (t - t)", "10 - t"])
def test_a_formula_giving_a_negative_or_infinite_rate_raises(expr):
    with pytest.raises(InvalidParameterError, match="finite rate"):
        Formula(expr).times(rng(), 0.0, 100.0)


def test_the_formula_parser_implements_its_whitelist():
    t = np.array([0.0, 5.0, 15.0, 250.0])
    assert parse_rate_formula("max(1, min(t, 10)) ** 2 % 7")(t).tolist() == [1.0, 4.0, 2.0, 2.0]
    assert parse_rate_formula("3 if 200 <= t < 400 else -(-1)")(t).tolist() == [1.0, 1.0, 1.0, 3.0]
    assert parse_rate_formula("(t != 5) + (t == 5) * 9 + (t >= 15) - (t > 15)")(t).tolist() == [1, 9, 2, 1]


@pytest.mark.parametrize("expr", [
    "__import__('os')", "os.system('ls')", "x + 1", "abs(t)", "t.real", "[t]", "lambda: 1", "'a'", "True",
    "min(t)", "max(a=1, b=2)", "t and 1", "not t", "t if t else exec('1')", "(1).__class__", "t[0]", "1 +",
])
def test_the_formula_parser_refuses_everything_else(expr):
    with pytest.raises(InvalidParameterError):
        parse_rate_formula(expr)


@pytest.mark.parametrize(("expr", "match"), [
    ("1" + "+1" * 999, "nest at most 100"), ("-" * 1999 + "1", "nest at most 100"),
    ("9" * 400, "too large for a float"), ("t * " + "9" * 400, "too large for a float"),
])
def test_the_formula_parser_refuses_what_would_exhaust_python_with_a_parameter_error(expr, match):
    with pytest.raises(InvalidParameterError, match=match):
        parse_rate_formula(expr)


def test_a_long_but_shallow_formula_is_fine():
    assert parse_rate_formula("+".join(["(1 + 1)"] * 40))(np.array([3.0])).tolist() == [80.0]


@pytest.mark.parametrize(("t", "rate"), [
    (-0.001, 0.0), (0.0, 24.0), (199.999, 24.0), (200.0, 56.0), (399.999, 56.0), (400.0, 72.0), (409.999, 72.0),
    (410.0, 8.0), (419.999, 8.0), (420.0, 72.0), (590.0, 8.0), (599.999, 8.0), (600.0, 0.0), (1e6, 0.0),
])
def test_hmas_stress_rate_is_equation_13(t, rate):
    assert hmas_stress_rate(t) == pytest.approx(rate)
    assert hmas_stress_rate(t, lam0=10.0) == pytest.approx(rate / 4)
    assert HMASStress(40.0).rate_at(np.array([t]))[0] == pytest.approx(rate)


def test_the_hmas_stress_process_follows_equation_13():
    times = np.concatenate([HMASStress(40.0).times(rng(s), 0.0, 700.0) for s in range(4)])
    assert rate_on(times, 0, 200) / 4 == pytest.approx(24, rel=0.04)
    assert rate_on(times, 200, 400) / 4 == pytest.approx(56, rel=0.03)
    assert rate_on(times, 600, 700) == 0
    fluctuating = times[(times >= 400) & (times < 600)]
    high = fluctuating % 20 < 10
    assert np.count_nonzero(high) / (100 * 4) == pytest.approx(72, rel=0.03)
    assert np.count_nonzero(~high) / (100 * 4) == pytest.approx(8, rel=0.08)
