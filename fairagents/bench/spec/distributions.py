"""The length and arrival entries of a scenario file, and the distributions and processes they describe.

An agent's ``prompt`` and ``output`` are a ``LengthSpec``: a plain integer, or a
distribution chosen by ``dist`` (``constant``, ``uniform``, ``normal``, ``lognormal``,
``empirical``, ``mixture``), whose ``distribution(base)`` is a
:mod:`fairagents.bench.lengths` distribution (files relative to ``base``). Its
``arrival`` is an ``ArrivalSpec`` chosen by ``process`` (``poisson``, ``gamma``,
``onoff``, ``exfairs``, ``piecewise``, ``formula``, ``hmas_stress``), whose
``arrival(k)`` is the :mod:`fairagents.bench.arrivals` process of replica ``k``.

Examples:
    >>> from fairagents.bench.spec import GammaArrival, UniformLength
    >>> UniformLength(dist="uniform", low=8, high=16).distribution(None)
    Uniform(low=8, high=16)
    >>> GammaArrival(process="gamma", rate=[1, 2], cv=2).arrival(k=1)
    Gamma(rate=2.0, cv=2.0)
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, Strict, model_validator

from fairagents.bench import arrivals, lengths
from fairagents.bench.spec.base import (
    Cycled,
    FiniteFloat,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    _pick,
    _runtime,
    _Spec,
)

__all__ = [
    "ConstantLength",
    "EmpiricalLength",
    "ExFairSArrival",
    "FormulaArrival",
    "GammaArrival",
    "HMASStressArrival",
    "LogNormalLength",
    "MixtureLength",
    "MixturePart",
    "NormalLength",
    "OnOffArrival",
    "PiecewiseArrival",
    "PoissonArrival",
    "UniformLength",
]


# --------------------------------------------------------------------------- lengths


class ConstantLength(_Spec):
    """Always the same number of tokens (a plain integer means the same).

    Examples:
        >>> from fairagents.bench.spec import ConstantLength
        >>> ConstantLength(dist="constant", value=256).distribution(None)
        Constant(value=256)
    """

    dist: Literal["constant"]
    value: PositiveInt
    """Tokens."""

    def distribution(self, base: Path | None) -> lengths.LengthDistribution:
        """The distribution it describes (files relative to ``base``)."""
        return lengths.Constant(self.value)


class UniformLength(_Spec):
    """Integers uniform on ``[low, high]``, both included.

    Examples:
        >>> from fairagents.bench.spec import UniformLength
        >>> UniformLength(dist="uniform", low=16, high=64).distribution(None)
        Uniform(low=16, high=64)
    """

    dist: Literal["uniform"]
    low: PositiveInt
    """Fewest tokens."""
    high: PositiveInt
    """Most tokens (≥ low)."""

    @model_validator(mode="after")
    def _check(self) -> UniformLength:
        _runtime(lengths.Uniform, self.low, self.high, loc=("high",))
        return self

    def distribution(self, base: Path | None) -> lengths.LengthDistribution:
        """The distribution it describes (files relative to ``base``)."""
        return lengths.Uniform(self.low, self.high)


class NormalLength(_Spec):
    """A normal distribution, rounded and clipped to ``[min, max]``.

    Examples:
        >>> from fairagents.bench.spec import NormalLength
        >>> NormalLength(dist="normal", mean=420, std=60, min=256).distribution(None)
        Normal(mean=420.0, std=60.0, min=256, max=None)
    """

    dist: Literal["normal"]
    mean: PositiveFloat
    """Mean tokens before clipping."""
    std: NonNegativeFloat
    """Standard deviation (tokens)."""
    min: PositiveInt = 1
    """Fewest tokens."""
    max: PositiveInt | None = None
    """Most tokens, if bounded."""

    @model_validator(mode="after")
    def _check(self) -> NormalLength:
        self.distribution(None)
        return self

    def distribution(self, base: Path | None) -> lengths.LengthDistribution:
        """The distribution it describes (files relative to ``base``)."""
        return _runtime(lengths.Normal, self.mean, self.std, self.min, self.max)


class LogNormalLength(_Spec):
    """A log-normal distribution given by its ``median`` (or ``mu``) and ``sigma``, rounded and clipped.

    Examples:
        >>> from fairagents.bench.spec import LogNormalLength
        >>> LogNormalLength(dist="lognormal", median=48, sigma=1.0, max=1024).distribution(None)
        LogNormal(sigma=1.0, median=48.0, mu=None, min=1, max=1024)
    """

    dist: Literal["lognormal"]
    sigma: NonNegativeFloat
    """Standard deviation of the log."""
    median: PositiveFloat | None = None
    """Median tokens before clipping (give this or ``mu``)."""
    mu: FiniteFloat | None = None
    """Mean of the log (give this or ``median``)."""
    min: PositiveInt = 1
    """Fewest tokens."""
    max: PositiveInt | None = None
    """Most tokens, if bounded."""

    @model_validator(mode="after")
    def _check(self) -> LogNormalLength:
        self.distribution(None)
        return self

    def distribution(self, base: Path | None) -> lengths.LengthDistribution:
        """The distribution it describes (files relative to ``base``)."""
        return _runtime(lengths.LogNormal, self.sigma, self.median, self.mu, self.min, self.max)


class EmpiricalLength(_Spec):
    """Lengths drawn with replacement from a file: one integer a line, or a CSV column.

    Examples:
        >>> from fairagents.bench.spec import EmpiricalLength
        >>> EmpiricalLength(dist="empirical", path="lengths.csv", column="prompt").column
        'prompt'
    """

    dist: Literal["empirical"]
    path: str
    """The file, relative to the scenario file."""
    column: str | Annotated[int, Strict(), Field(ge=0)] | None = None
    """The CSV column (header name or 0-based index); none: one integer a line."""

    def distribution(self, base: Path | None) -> lengths.LengthDistribution:
        """The distribution it describes (files relative to ``base``)."""
        path = _resolve(self.path, base)
        return _read_empirical(str(path), self.column, _mtime(path))


@functools.lru_cache(maxsize=64)
def _read_empirical(path: str, column: str | int | None, mtime: int) -> lengths.Empirical:
    return lengths.Empirical.from_file(path, column)


def _mtime(path: Path) -> int:
    """The file's modification time, so a cached read of an edited file is not reused (-1 if it is missing)."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


class MixturePart(_Spec):
    """One part of a mixture.

    Examples:
        >>> from fairagents.bench.spec import MixturePart
        >>> MixturePart(weight=1, length=48).length
        48
    """

    weight: PositiveFloat
    """Relative probability of this part."""
    length: LengthSpec
    """Its length distribution."""


class MixtureLength(_Spec):
    """Each length from one of several distributions, chosen with probability proportional to its weight.

    Examples:
        >>> from fairagents.bench.spec import MixtureLength
        >>> mix = MixtureLength(dist="mixture", parts=[{"weight": 1, "length": 48}, {"weight": 1, "length": 3500}])
        >>> mix.distribution(None).parts[1]
        (1.0, Constant(value=3500))
    """

    dist: Literal["mixture"]
    parts: Annotated[list[MixturePart], Field(min_length=1)]
    """The parts."""

    def distribution(self, base: Path | None) -> lengths.LengthDistribution:
        """The distribution it describes (files relative to ``base``)."""
        return lengths.Mixture(tuple((p.weight, _distribution(p.length, base)) for p in self.parts))


LengthDist = Annotated[
    ConstantLength | UniformLength | NormalLength | LogNormalLength | EmpiricalLength | MixtureLength,
    Field(discriminator="dist"),
]
LengthSpec = PositiveInt | LengthDist
"""A length in tokens: an integer, or a distribution chosen by ``dist``."""
MixturePart.model_rebuild()


def _distribution(spec: LengthSpec, base: Path | None) -> lengths.LengthDistribution:
    return lengths.Constant(spec) if isinstance(spec, int) else spec.distribution(base)


def _resolve(path: str, base: Path | None) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() or base is None else base / p


# --------------------------------------------------------------------------- arrivals


class PoissonArrival(_Spec):
    """Poisson arrivals (exponential gaps).

    Examples:
        >>> from fairagents.bench.spec import PoissonArrival
        >>> PoissonArrival(process="poisson", rate=[1.5, 3.0]).arrival(k=1)
        Poisson(rate=3.0)
    """

    process: Literal["poisson"]
    rate: Cycled
    """Requests per second (a list: cycled over replicas)."""

    def arrival(self, k: int = 0) -> arrivals.ArrivalProcess:
        """The process it describes, for replica ``k`` (its lists cycled)."""
        return arrivals.Poisson(_pick(self.rate, k))


class GammaArrival(_Spec):
    """Gamma-distributed gaps of mean 1/rate and coefficient of variation ``cv`` (0: evenly spaced).

    Examples:
        >>> from fairagents.bench.spec import GammaArrival
        >>> GammaArrival(process="gamma", rate=2, cv=0).arrival()
        Gamma(rate=2.0, cv=0.0)
    """

    process: Literal["gamma"]
    rate: Cycled
    """Requests per second (a list: cycled over replicas)."""
    cv: NonNegativeFloat = 1.0
    """Coefficient of variation of the gaps: 1 is Poisson, larger is burstier, 0 evenly spaced."""

    def arrival(self, k: int = 0) -> arrivals.ArrivalProcess:
        """The process it describes, for replica ``k`` (its lists cycled)."""
        return arrivals.Gamma(_pick(self.rate, k), self.cv)


BaseArrival = Annotated[PoissonArrival | GammaArrival, Field(discriminator="process")]


class OnOffArrival(_Spec):
    """A base process active for ``on`` seconds, then silent for ``off`` seconds, repeating from the agent's start.

    Examples:
        >>> from fairagents.bench.spec import OnOffArrival
        >>> OnOffArrival(process="onoff", on=60, off=60, base={"process": "poisson", "rate": 2}).arrival()
        OnOff(base=Poisson(rate=2.0), on=60.0, off=60.0)
    """

    process: Literal["onoff"]
    on: PositiveFloat
    """Seconds on."""
    off: PositiveFloat
    """Seconds off."""
    base: BaseArrival
    """The process while on (poisson or gamma); its clock pauses while off."""

    def arrival(self, k: int = 0) -> arrivals.ArrivalProcess:
        """The process it describes, for replica ``k`` (its lists cycled)."""
        return arrivals.OnOff(self.base.arrival(k), self.on, self.off)


class ExFairSArrival(_Spec):
    """ExFairS rounds: gaps ~ Normal(60/QPM, cv·60/QPM) ≥ 0, sent within the first ``send_window`` s of each round.

    Examples:
        >>> from fairagents.bench.spec import ExFairSArrival
        >>> ExFairSArrival(process="exfairs", qpm=[10, 90]).arrival(k=1).qpm
        90.0
    """

    process: Literal["exfairs"]
    qpm: Cycled
    """Queries per minute (a list: cycled over replicas)."""
    round: PositiveFloat = 60.0
    """Seconds per round."""
    send_window: PositiveFloat = 48.0
    """Seconds at the start of each round in which its requests are sent (≤ round)."""
    rounds: PositiveInt | None = None
    """Rounds to play; none: until the agent's window ends."""
    cv: NonNegativeFloat = 0.3
    """Standard deviation of a gap over its mean."""

    @model_validator(mode="after")
    def _check(self) -> ExFairSArrival:
        self.arrival(0)
        return self

    def arrival(self, k: int = 0) -> arrivals.ArrivalProcess:
        """The process it describes, for replica ``k`` (its lists cycled)."""
        return _runtime(arrivals.ExFairSRounds, _pick(self.qpm, k), self.round, self.send_window, self.rounds, self.cv)


class PiecewiseArrival(_Spec):
    """Poisson arrivals at a rate constant on segments ``[start, end, rate]`` of scenario time, 0 elsewhere.

    Examples:
        >>> from fairagents.bench.spec import PiecewiseArrival
        >>> PiecewiseArrival(process="piecewise", segments=[[0, 70, 20], [140, 200, 12]]).arrival().segments
        ((0.0, 70.0, 20.0), (140.0, 200.0, 12.0))
    """

    process: Literal["piecewise"]
    segments: Annotated[list[tuple[NonNegativeFloat, NonNegativeFloat, NonNegativeFloat]], Field(min_length=1)]
    """``[start, end, rate]``: requests per second on ``[start, end)`` seconds; segments must not overlap."""

    @model_validator(mode="after")
    def _check(self) -> PiecewiseArrival:
        self.arrival(0)
        return self

    def arrival(self, k: int = 0) -> arrivals.ArrivalProcess:
        """The process it describes, for replica ``k`` (its lists cycled)."""
        return _runtime(arrivals.Piecewise, tuple(self.segments), loc=("segments",))


class FormulaArrival(_Spec):
    """Poisson arrivals at a rate given by a formula in ``t`` (seconds of scenario time), sampled by thinning.

    Examples:
        >>> from fairagents.bench.spec import FormulaArrival
        >>> FormulaArrival(process="formula", expr="24 + 48 * t / 200").arrival().rate_at([0.0, 200.0]).tolist()
        [24.0, 72.0]
    """

    process: Literal["formula"]
    expr: str
    """Requests per second as a function of ``t``: numbers, ``t``, ``+ - * / % **``, comparisons,
    ``min``/``max`` and ``a if cond else b``."""
    rate_max: PositiveFloat | None = None
    """An upper bound of the rate, if the formula peaks within less than 10 ms."""

    @model_validator(mode="after")
    def _check(self) -> FormulaArrival:
        self.arrival(0)
        return self

    def arrival(self, k: int = 0) -> arrivals.ArrivalProcess:
        """The process it describes, for replica ``k`` (its lists cycled)."""
        return _runtime(arrivals.Formula, self.expr, self.rate_max, loc=("expr",))


class HMASStressArrival(_Spec):
    """H-MAS eq. 13: 0.6·λ0 on [0, 200) s, 1.4·λ0 on [200, 400), then 1.8·λ0 and 0.2·λ0 alternating every 10 s.

    Examples:
        >>> from fairagents.bench.spec import HMASStressArrival
        >>> HMASStressArrival(process="hmas_stress", lam0=16).arrival()
        HMASStress(lam0=16.0)
    """

    process: Literal["hmas_stress"]
    lam0: PositiveFloat = 40.0
    """λ0 (requests per second); agents whose λ0 add up to 40 together send the paper's test."""

    def arrival(self, k: int = 0) -> arrivals.ArrivalProcess:
        """The process it describes, for replica ``k`` (its lists cycled)."""
        return arrivals.HMASStress(self.lam0)


ArrivalSpec = Annotated[
    PoissonArrival | GammaArrival | OnOffArrival | ExFairSArrival | PiecewiseArrival | FormulaArrival
    | HMASStressArrival,
    Field(discriminator="process"),
]
