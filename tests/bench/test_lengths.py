import math

import numpy as np
import pytest

from fairagents.bench.lengths import MAX_LENGTH, Constant, Empirical, LogNormal, Mixture, Normal, Uniform
from fairagents.errors import InvalidParameterError


def rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize(("dist", "mean"), [
    (Constant(7), 7.0),
    (Uniform(10, 20), 15.0),
    (Normal(100.0, 20.0), 100.0),
    (LogNormal(sigma=0.5, median=100.0), 100.0 * math.exp(0.125)),
    (LogNormal(sigma=0.5, mu=math.log(100.0)), 100.0 * math.exp(0.125)),
    (Empirical((1, 2, 3, 10)), 4.0),
    (Mixture(((1.0, Constant(10)), (1.0, Constant(30)))), 20.0),
])
def test_lengths_have_their_mean_and_are_positive_integers(dist, mean):
    draws = dist.sample(rng(), 20_000)
    assert draws.dtype == np.int64 and len(draws) == 20_000 and draws.min() >= 1
    assert draws.mean() == pytest.approx(mean, rel=0.02)
    assert np.array_equal(draws, dist.sample(rng(), 20_000))


def test_lengths_are_clipped_to_their_bounds_and_never_below_one():
    assert Normal(0.5, 50.0).sample(rng(), 1000).min() == 1
    draws = LogNormal(sigma=2.0, median=100.0, min=20, max=300).sample(rng(), 5000)
    assert draws.min() == 20 and draws.max() == 300
    assert set(Uniform(3, 3).sample(rng(), 10).tolist()) == {3}


@pytest.mark.parametrize("make", [
    lambda: Constant(0), lambda: Uniform(5, 4), lambda: Normal(-1.0, 1.0), lambda: Normal(10.0, 1.0, min=5, max=4),
    lambda: LogNormal(sigma=1.0), lambda: LogNormal(sigma=1.0, median=5.0, mu=1.0), lambda: Empirical(()),
    lambda: Empirical((3, 0)), lambda: Mixture(()), lambda: Mixture(((0.0, Constant(1)),)),
    lambda: Constant(2**31), lambda: Uniform(1, 2**63), lambda: Normal(10.0, 1.0, max=10**30),
    lambda: Empirical((2**40,)),
])
def test_bad_length_parameters_raise(make):
    with pytest.raises(InvalidParameterError):
        make()


def test_empirical_lengths_from_a_file_or_a_csv_column(tmp_path):
    (tmp_path / "lens.txt").write_text("# prompt lengths\n12\n\n40\n")
    assert Empirical.from_file(tmp_path / "lens.txt").values == (12, 40)
    (tmp_path / "lens.csv").write_text("prompt,output\n12,30\n40,7\n")
    assert Empirical.from_file(tmp_path / "lens.csv", column=1).values == (30, 7)
    with pytest.raises(InvalidParameterError, match="no column 'missing'"):
        Empirical.from_file(tmp_path / "lens.csv", column="missing")
    (tmp_path / "bad.txt").write_text("12\nmany\n")
    with pytest.raises(InvalidParameterError, match=r"bad\.txt:2"):
        Empirical.from_file(tmp_path / "bad.txt")
    with pytest.raises(InvalidParameterError, match="cannot read"):
        Empirical.from_file(tmp_path / "absent.txt")


@pytest.mark.parametrize("dist", [
    LogNormal(sigma=1.0, mu=800.0), LogNormal(sigma=50.0, median=100.0), Normal(1e300, 1e300), Normal(3e9, 1.0),
])
def test_draws_past_the_largest_length_are_clipped_to_it_not_wrapped(dist):
    draws = dist.sample(rng(), 1000)
    assert draws.min() >= 1 and draws.max() == MAX_LENGTH


def test_a_file_of_lengths_that_cannot_be_read_as_text_or_numbers_is_a_parameter_error(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("12\n40 \xe9t\xe9\n".encode("latin-1"))
    with pytest.raises(InvalidParameterError, match=r"latin1\.txt: not UTF-8"):
        Empirical.from_file(tmp_path / "latin1.txt")
    (tmp_path / "wide.csv").write_text('prompt\n12\n"' + "1" * 200_000 + '"\n')  # past the csv field limit
    with pytest.raises(InvalidParameterError, match=r"cannot read lengths from .*wide\.csv: field larger"):
        Empirical.from_file(tmp_path / "wide.csv", column="prompt")
    (tmp_path / "huge.txt").write_text("12\n" + "9" * 5000 + "\n99999999999\n")
    with pytest.raises(InvalidParameterError, match=r"huge\.txt:2: a length must be an integer in \[1, 2147483647\]"):
        Empirical.from_file(tmp_path / "huge.txt")
    (tmp_path / "big.txt").write_text("12\n99999999999\n")
    with pytest.raises(InvalidParameterError, match=r"big\.txt:2"):
        Empirical.from_file(tmp_path / "big.txt")
