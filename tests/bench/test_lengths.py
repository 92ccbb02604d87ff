import math

import numpy as np
import pytest

from fairagents.bench.lengths import Constant, Empirical, LogNormal, Mixture, Normal, Uniform
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
